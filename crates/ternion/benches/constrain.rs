//! The token mask's cost per generated token (`--features constrain`): a JSON schema over
//! the Llama-3 vocabulary (128k tokens), stepped through a fixed answer (mask, then the
//! token), next to sampling a whole row without a mask.
//!
//! `cargo bench -p ternion --features constrain --bench constrain`

use divan::Bencher;
use serde_json::json;
use ternion::constrain::{GrammarSpec, Grammars};
use ternion::generate::Constraint;
use ternion::sample::{Sampler, SamplerConfig};
use ternion::tokenizer::Tokenizer;

use ternion_testkit::shared;

fn main() {
    divan::main();
}

const ANSWER: &str = r#"{"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"], "notes": "Wrote the first published program for the Analytical Engine."}"#;

fn setup() -> (Tokenizer, Grammars, GrammarSpec, Vec<u32>) {
    let path = shared::shared_path("vocab/ggml-vocab-llama3.gguf");
    let file = ternion::gguf::GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file, &Default::default()).unwrap();
    let grammars = Grammars::new(&tok, tok.n_vocab()).unwrap();
    let spec = GrammarSpec::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "born": {"type": "integer"},
            "fields": {"type": "array", "items": {"type": "string"}},
            "notes": {"type": "string"},
        },
        "required": ["name", "born", "fields", "notes"],
        "additionalProperties": false,
    }));
    let ids = tok.encode(ANSWER, false, false).unwrap();
    (tok, grammars, spec, ids)
}

/// One token's mask and commit, averaged over the answer's tokens.
#[divan::bench(sample_count = 20)]
fn json_schema_mask_per_token(b: Bencher) {
    let (_tok, grammars, spec, ids) = setup();
    b.counter(divan::counter::ItemsCount::new(ids.len()))
        .with_inputs(|| grammars.compile(&spec).unwrap())
        .bench_local_values(|mut g| {
            for &id in &ids {
                let allowed = g.mask(usize::MAX).unwrap();
                assert!(ternion::generate::allows(allowed, id));
                g.commit(id).unwrap();
            }
        });
}

/// Sampling one 128k row with llama.cpp's default chain, for scale.
#[divan::bench(sample_count = 20)]
fn sample_row_without_mask(b: Bencher) {
    let n = 128_256;
    let row: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let mut s = Sampler::new(SamplerConfig::default()).unwrap();
    b.bench_local(|| s.sample(&row, &[]));
}
