//! The per-token cost of a constraint on the default model's tokenizer (49152 tokens): one
//! `fill_mask` + `accept` along a fixed valid output, averaged over its tokens — what the
//! runner's helper thread spends per constrained request per decode step.
//!
//! ```text
//! cargo bench -p tokenmill-structured --bench mask
//! ```

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tokenmill_engine::TokenMask;
use tokenmill_structured::{GrammarCompiler, StructuredOutput};
use tokenmill_tokenizer::Tokenizer;

fn bench(c: &mut Criterion) {
    let tok = Tokenizer::from_gguf_path(tokenmill_testutil::model_path()).unwrap();
    let compiler = GrammarCompiler::new(&tok).unwrap();
    let rows = json!({"type": "object", "properties": {"rows": {"type": "array", "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 16}, "ok": {"type": "boolean"}},
        "required": ["id", "name", "ok"], "additionalProperties": false}}},
        "required": ["rows"], "additionalProperties": false});
    let row = r#"{"id": 17, "name": "Ada Lovelace", "ok": true}"#;
    let text = format!(r#"{{"rows": [{}]}}"#, [row; 6].join(", "));
    let cases = [
        ("json_schema_rows", StructuredOutput::JsonSchema(rows), text),
        (
            "json_object",
            StructuredOutput::JsonObject,
            r#"{"a": [1, 2, {"b": "some text here"}], "c": null}"#.to_string(),
        ),
        (
            "regex_date",
            StructuredOutput::Regex("[0-9]{4}-[0-9]{2}-[0-9]{2}".into()),
            "2026-12-01".into(),
        ),
    ];
    let mut g = c.benchmark_group("mask_per_token");
    for (name, spec, text) in cases {
        let constraint = compiler.compile(&spec).unwrap().constraint;
        let ids = tok.encode(&text, false).unwrap();
        g.throughput(Throughput::Elements(ids.len() as u64));
        let mut mask = TokenMask::new(tok.vocab_size());
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut state = constraint.start();
                for &t in &ids {
                    mask.clear();
                    state.fill_mask(&mut mask).unwrap();
                    assert!(mask.is_allowed(t));
                    black_box(state.accept(t).unwrap());
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
