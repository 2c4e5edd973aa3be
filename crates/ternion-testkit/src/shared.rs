//! The shared data folder beside the repository (`../shared`: golden data and test
//! vocabularies) for every test that needs it, native or integration. A missing file
//! fails the test loudly, with this one message; no test skips.

use std::path::{Path, PathBuf};

/// `../shared/<rel>` beside the repository; panics with a clear message when it is
/// missing.
pub fn shared_path(rel: &str) -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let beside = crate_dir.join("../../..");
    let p = beside
        .canonicalize()
        .unwrap_or(beside)
        .join("shared")
        .join(rel);
    assert!(
        p.exists(),
        "../shared (golden data) is missing beside the repository: {}",
        p.display()
    );
    p
}

/// llama.cpp's test vectors: inputs end with a `__ggml_vocab_test__` line; one output line
/// of ids per input.
pub fn vectors(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = shared_path("vocab");
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // The file ends with a separator, so the last split is empty.
    let inputs = &inputs[..inputs.len() - 1];
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: inputs vs outputs");
    inputs.iter().map(|s| s.to_string()).zip(outputs).collect()
}
