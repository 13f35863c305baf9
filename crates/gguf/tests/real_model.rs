//! The default model (SmolLM2-135M-Instruct Q4_1) parses, and its header says what we know
//! about it.

mod common;

use tokenmill_gguf::{GgmlType, GgufFile, Value};

fn model() -> GgufFile {
    GgufFile::open(common::model_path()).expect("the default model parses")
}

#[test]
fn header_and_hyperparameters() {
    let f = model();
    assert!(
        f.version() == 3 || f.version() == 2,
        "version {}",
        f.version()
    );
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture(), Some("llama"));
    let md = f.metadata();
    assert_eq!(md.get_u64("llama.block_count"), Some(30));
    assert_eq!(md.get_u64("llama.embedding_length"), Some(576));
    assert_eq!(md.get_u64("llama.attention.head_count"), Some(9));
    assert_eq!(md.get_u64("llama.attention.head_count_kv"), Some(3));
    assert_eq!(md.get_u64("llama.feed_forward_length"), Some(1536));
    assert_eq!(md.get_u64("llama.context_length"), Some(8192));
    let eps = md
        .get_f32("llama.attention.layer_norm_rms_epsilon")
        .unwrap();
    assert!((eps - 1e-5).abs() < 1e-9, "rms eps {eps}");
    assert!(md.get_f32("llama.rope.freq_base").is_some());
    assert_eq!(md.get_str("tokenizer.ggml.model"), Some("gpt2"));
    assert!(md.len() > 20);
    // Getters are typed: a string is not an integer.
    assert_eq!(md.get_u64("general.architecture"), None);
}

#[test]
fn tokenizer_arrays() {
    let f = model();
    let md = f.metadata();
    let tokens = md
        .get_array("tokenizer.ggml.tokens")
        .and_then(|a| a.as_strings())
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[0], "<|endoftext|>");
    assert_eq!(tokens[1], "<|im_start|>");
    assert_eq!(tokens[2], "<|im_end|>");
    let types = md.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.len(), 49152);
    assert!(types.as_i32s().is_some());
    let merges = md.get_array("tokenizer.ggml.merges").unwrap();
    assert!(merges.len() > 40_000, "{} merges", merges.len());
    assert!(md.get_u64("tokenizer.ggml.bos_token_id").is_some());
    assert!(md.get_u64("tokenizer.ggml.eos_token_id").is_some());
    let template = md.get_str("tokenizer.chat_template").unwrap();
    assert!(template.contains("<|im_start|>"));

    let shown = md.get("tokenizer.ggml.tokens").unwrap().to_string();
    assert!(
        shown.starts_with(r#"[49152 strings: "<|endoftext|>", "<|im_start|>", "#),
        "{shown}"
    );
    assert!(shown.len() < 120, "{shown}");
}

#[test]
fn tensors() {
    let f = model();
    let tensors = f.tensors();
    // 30 layers x 9 tensors + token_embd + output_norm (the output projection is tied).
    assert_eq!(tensors.len(), 272);
    assert!(f.tensor("output.weight").is_none());

    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.ty, GgmlType::Q8_0);
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!((embd.row_len(), embd.n_rows()), (576, 49152));
    assert_eq!(embd.size, 576 / 32 * 34 * 49152);

    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ty, GgmlType::Q4_1);
    assert_eq!(q.dims, [576, 576]);
    let k = f.tensor("blk.29.attn_k.weight").unwrap();
    assert_eq!(k.dims, [576, 192]);
    let down = f.tensor("blk.3.ffn_down.weight").unwrap();
    assert_eq!(down.dims, [1536, 576]);

    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.ty, GgmlType::F32);
    assert_eq!(norm.dims, [576]);
    let gains: Vec<f32> = f
        .tensor_data(norm)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(gains.len(), 576);
    assert!(gains.iter().all(|g| g.is_finite() && g.abs() < 100.0));
    assert!(gains.iter().any(|&g| g != 0.0));

    for layer in 0..30 {
        for part in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            let name = format!("blk.{layer}.{part}.weight");
            assert!(f.tensor(&name).is_some(), "{name} missing");
        }
    }
}

#[test]
fn tensor_layout_covers_the_data_section() {
    let f = model();
    let mut spans: Vec<(u64, u64)> = f.tensors().iter().map(|t| (t.offset, t.end())).collect();
    spans.sort();
    assert_eq!(spans.first().unwrap().0, f.data_offset());
    assert_eq!(f.data_offset() % f.alignment(), 0);
    let mut gaps = 0;
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0);
        gaps += w[1].0 - w[0].1;
    }
    // Only alignment padding between tensors, and the file ends with the last tensor.
    assert!(gaps < 32 * f.tensors().len() as u64);
    assert_eq!(spans.last().unwrap().1, f.len());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.size);
        assert_eq!(t.offset % f.alignment(), 0);
        assert_eq!(f.tensor(&t.name), Some(t));
    }
}

#[test]
fn from_bytes_matches_open() {
    let a = model();
    let b = GgufFile::from_bytes(common::model_bytes().to_vec()).unwrap();
    assert_eq!(a.tensors(), b.tensors());
    let ka: Vec<(&str, &Value)> = a.metadata().iter().collect();
    let kb: Vec<(&str, &Value)> = b.metadata().iter().collect();
    assert_eq!(ka, kb);
    let t = a.tensor("blk.7.ffn_up.weight").unwrap();
    assert_eq!(a.tensor_data(t), b.tensor_data(t));
}

#[test]
fn open_reports_io_errors() {
    let missing = std::env::temp_dir().join("tokenmill-gguf-does-not-exist.gguf");
    assert!(matches!(
        GgufFile::open(&missing),
        Err(tokenmill_gguf::GgufError::Io(_))
    ));
    let empty =
        std::env::temp_dir().join(format!("tokenmill-gguf-empty-{}.gguf", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let result = GgufFile::open(&empty);
    std::fs::remove_file(&empty).unwrap();
    assert!(matches!(
        result,
        Err(tokenmill_gguf::GgufError::Truncated {
            what: "magic",
            offset: 0
        })
    ));
}
