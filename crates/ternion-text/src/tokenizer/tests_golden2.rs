//! The tokenizer vectors of `../shared/golden2/tokenizer/` (qwen2, gemma3, smollm): llama.cpp's
//! ids for 46 texts, without and with special-token parsing, read with the tokenizer of the
//! golden2 model that carries each vocabulary.

use super::*;
use crate::test_shared::shared_path;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Checks every vector of `tokenizer/{name}.json` with the tokenizer of `models/{model}`.
fn check(name: &str, model: &str) {
    let dir = shared_path("golden2");
    let path = dir.join("models").join(model);
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let vpath = dir.join("tokenizer").join(format!("{name}.json"));
    let text =
        std::fs::read_to_string(&vpath).unwrap_or_else(|e| panic!("{}: {e}", vpath.display()));
    let cases: Vec<serde_json::Value> = serde_json::from_str(&text).expect("vector JSON");
    assert!(!cases.is_empty(), "{name}: no vectors");
    let mut failed = Vec::new();
    for case in &cases {
        let text = case["text"].as_str().expect("text");
        for (field, special) in [("ids", false), ("ids_special", true)] {
            let want = ids(&case[field]);
            let got = tok.encode(text, false, special).unwrap();
            if got != want {
                failed.push(format!(
                    "{} {field} {text:?}:\n  want {want:?}\n  got  {got:?}",
                    case["name"]
                ));
            }
        }
        let detok = case["detok"].as_str().expect("detok");
        if tok.decode(&ids(&case["ids"])) != detok {
            failed.push(format!("{} detok {text:?}", case["name"]));
        }
    }
    assert!(
        failed.is_empty(),
        "{name}: {} of {} checks failed\n{}",
        failed.len(),
        3 * cases.len(),
        failed.join("\n")
    );
}

#[test]
fn golden2_vectors_qwen2() {
    check("qwen2", "qwen2-d64-f16.gguf");
}

#[test]
fn golden2_vectors_smollm() {
    check("smollm", "llama-smollm-d64-q4_1.gguf");
}

#[test]
fn golden2_vectors_gemma3() {
    check("gemma3", "gemma3-d64-q4_k.gguf");
}
