//! The `ternion` binary on an MLC `q4f16_1` directory: `run` generates exactly what it
//! generates from the same weights as a GGUF; `inspect` and `tokenize` read the directory;
//! a broken directory fails with a message, not a panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use ternion_testkit::mlc_synth::{write_phi3, Phi3Spec};
use ternion_testkit::synth::Shape;

use ternion_testkit::shared as support_shared;

fn ternion(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args(args)
        .output()
        .expect("the ternion binary runs")
}

fn ok(args: &[&str]) -> String {
    let out = ternion(args);
    assert!(
        out.status.success(),
        "ternion {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A random MLC Phi-3 directory and the same model as a GGUF, under a fresh folder.
fn fixture(tag: &str) -> (PathBuf, PathBuf) {
    let vocab = support_shared::shared_path("vocab/ggml-vocab-phi-3.gguf");
    let dir = ternion_testkit::scratch::dir("ternion-cli-mlc").join(tag);
    std::fs::remove_dir_all(&dir).ok();
    let (mlc, gguf) = (dir.join("phi3-q4f16_1-MLC"), dir.join("phi3.gguf"));
    let spec = Phi3Spec {
        shape: Shape {
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 4,
            n_ff: 128,
        },
        vocab: &vocab,
        seed: 99,
        code_15: false,
        shard_bytes: 256 << 10,
    };
    write_phi3(&spec, &mlc, &gguf).expect("writing the MLC test directory");
    (mlc, gguf)
}

fn run_json(model: &Path) -> Value {
    let out = ok(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "-p",
        "The quick brown fox",
        "-n",
        "8",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        "-t",
        "2",
    ]);
    serde_json::from_str(out.lines().last().expect("output")).expect("JSON last line")
}

#[test]
fn run_on_an_mlc_directory_equals_the_gguf_run() {
    let (mlc, gguf) = fixture("run");
    let a = run_json(&mlc);
    let b = run_json(&gguf);
    assert_eq!(a["tokens"].as_array().map(Vec::len), Some(8));
    assert_eq!(a["prompt_tokens"], b["prompt_tokens"]);
    assert_eq!(a["tokens"], b["tokens"]);
    assert_eq!(a["text"], b["text"]);
    // BOS, then "The quick brown fox" as Phi-3's tokenizer splits it.
    assert_eq!(a["prompt_tokens"][0], 1);

    let info = ok(&["inspect", mlc.to_str().unwrap()]);
    assert!(
        info.contains("general.architecture = phi3") || info.contains("phi3"),
        "{info}"
    );
    assert!(
        info.contains("blk.1.attn_qkv.weight") && info.contains("Q4_0"),
        "{info}"
    );

    let ids = ok(&[
        "tokenize",
        "--model",
        mlc.to_str().unwrap(),
        "--no-bos",
        "Hello world",
    ]);
    let ref_ids = ok(&[
        "tokenize",
        "--model",
        gguf.to_str().unwrap(),
        "--no-bos",
        "Hello world",
    ]);
    assert_eq!(ids, ref_ids);
    assert_eq!(ids.trim(), "[15043,3186]");
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
}

#[test]
fn a_broken_mlc_directory_is_an_error() {
    let (mlc, _) = fixture("broken");
    std::fs::remove_file(mlc.join("params_shard_0.bin")).unwrap();
    let out = ternion(&[
        "run",
        "--model",
        mlc.to_str().unwrap(),
        "-p",
        "x",
        "-n",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("params_shard_0.bin"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
}
