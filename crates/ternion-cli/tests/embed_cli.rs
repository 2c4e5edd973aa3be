//! `ternion embed` and `ternion synth --arch qwen3 --type q2_0` end to end: the JSON answer
//! has one unit vector per input (one per token with `--pooling none`), vectors of equal
//! texts are equal and of different texts differ, and bad input is a clear error.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn ternion(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args(args)
        .output()
        .expect("ternion runs")
}

/// `ternion synth` of a micro qwen3 with weights of type `ty`.
fn synth(ty: &str, out: &std::path::Path) -> Output {
    let out = out.to_str().unwrap();
    ternion(&[
        "synth", "--arch", "qwen3", "--shape", "micro", "--type", ty, "--out", out,
    ])
}

/// A tiny qwen3 model with Q2_0 ternary codes and a byte vocabulary (one file per test).
fn model(name: &str) -> PathBuf {
    let dir = ternion_testkit::scratch::dir("ternion-embed-cli");
    let path = dir.join(format!("{name}.gguf"));
    let o = synth("q2_0", &path);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    path
}

fn embed_json(model: &str, extra: &[&str]) -> Value {
    let mut args = vec!["embed", "--model", model, "-t", "1", "--json"];
    args.extend_from_slice(extra);
    let o = ternion(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn vectors(v: &Value) -> Vec<Vec<f64>> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn embed_prints_one_unit_vector_per_input() {
    let path = model("vectors");
    let m = path.to_str().unwrap();
    let lines = path.with_extension("txt");
    std::fs::write(&lines, "abc\n\nxyz\n").unwrap();
    let v = embed_json(
        m,
        &[
            "-p",
            "abc",
            "-p",
            "hello",
            "--file",
            lines.to_str().unwrap(),
        ],
    );
    let vs = vectors(&v);
    assert_eq!(vs.len(), 4, "two prompts and two non-empty lines: {v}");
    assert_eq!(v["pooling"], "mean");
    for x in &vs {
        assert_eq!(x.len(), 128);
        let norm: f64 = x.iter().map(|a| a * a).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "|v| = {norm}");
    }
    assert_eq!(vs[0], vs[2], "equal texts, equal vectors");
    assert_ne!(vs[0], vs[1]);
    assert_ne!(vs[2], vs[3]);
    let one = embed_json(m, &["-p", "abc"]);
    let n_tokens = one["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let each = embed_json(m, &["-p", "abc", "--pooling", "none", "--no-normalize"]);
    assert_eq!(vectors(&each).len(), n_tokens, "one vector per token");
    assert!(n_tokens >= 3);
}

#[test]
fn embed_errors_name_what_is_wrong() {
    let path = model("errors");
    let m = path.to_str().unwrap();
    let o = ternion(&["embed", "--model", m]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--prompt TEXT"));
    let o = ternion(&["embed", "--model", m, "-p", "x", "--pooling", "rank"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("supported: none, mean, cls, last"));
    let other = path.with_extension("q4_0.gguf");
    let o = synth("q4_0", &other);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "ternary weight type 'Q4_0' is not supported (supported: I2_S, TQ1_0, TQ2_0, Q2_0)"
        ),
        "{err}"
    );
}

/// `--backend gpu` gives the CPU's vectors within the GPU tolerance of the library's test
/// (1e-2 per value of a unit vector, `crates/ternion/tests/embed.rs`), for every pooling
/// and both `--kv-type`s; lavapipe in CI, skipped with TERNION_SKIP_GPU_TESTS=1.
#[test]
fn embed_on_the_gpu_gives_the_cpus_vectors() {
    if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
        return eprintln!("skipping GPU test: TERNION_SKIP_GPU_TESTS=1");
    }
    let path = model("gpu");
    let m = path.to_str().unwrap();
    let long = "a longer input of several words, with punctuation";
    let cases = ["mean", "cls", "last", "none"].map(|p| ["f16", "f32"].map(|kv| (p, kv)));
    for (pooling, kv) in cases.into_iter().flatten() {
        let args = [
            "-p",
            "abc",
            "-p",
            long,
            "--pooling",
            pooling,
            "--kv-type",
            kv,
        ];
        let cpu = vectors(&embed_json(m, &args));
        let gpu = vectors(&embed_json(m, &[&args[..], &["--backend", "gpu"]].concat()));
        assert_eq!(cpu.len(), gpu.len(), "{pooling}");
        for (c, g) in cpu.iter().zip(&gpu) {
            let d = c
                .iter()
                .zip(g)
                .map(|(a, b)| (a - b).abs())
                .fold(0., f64::max);
            assert!(d <= 1e-2, "{pooling} {kv}: max |gpu − cpu| {d}");
        }
    }
}
