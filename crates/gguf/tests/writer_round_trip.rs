//! Writer round trips on real files: every committed tiny model, read and written back through
//! [`GgufWriter`], reads back with identical metadata (values and order) and identical tensor
//! infos and bytes. The tiny models were written by the Python `gguf` package with the same
//! layout rules (v3, alignment 32), so the whole file must come out byte-identical as well.

use tokenmill_gguf::{GgufFile, GgufWriter, TensorSpec, Value};

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let meta: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
    let specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ty,
        })
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &meta, &specs).unwrap();
    for t in f.tensors() {
        w.write_tensor(f.tensor_data(t)).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn tiny_models_round_trip_byte_identically() {
    let dir = tokenmill_testutil::fixtures_dir("tiny");
    for name in ["llama", "llama3-rope", "qwen2", "mistral"] {
        let path = dir.join(format!("{name}.gguf"));
        let original = std::fs::read(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let bytes = rewrite(&f);
        let g = GgufFile::from_bytes(bytes.clone()).unwrap();
        let (a, b): (Vec<_>, Vec<_>) =
            (f.metadata().iter().collect(), g.metadata().iter().collect());
        assert_eq!(a, b, "{name}: metadata");
        assert_eq!(f.tensors().len(), g.tensors().len());
        for (s, t) in f.tensors().iter().zip(g.tensors()) {
            assert_eq!((&s.name, &s.dims, s.ty), (&t.name, &t.dims, t.ty), "{name}");
            assert_eq!(f.tensor_data(s), g.tensor_data(t), "{name}: {}", s.name);
        }
        assert!(
            bytes == original,
            "{name}: file bytes differ from the original"
        );
    }
}
