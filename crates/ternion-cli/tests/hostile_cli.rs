//! Hostile files through the binary: `ternion inspect` and `ternion run` must exit with
//! code 1 and a one-line error, never a panic (exit code 101), within a second.

use ternion_testkit::gguf_gen;

use std::process::Command;
use std::time::{Duration, Instant};

use gguf_gen::*;
use ternion::quant::GgmlType;

const A: &str = "bitnet-b1.58";

/// (file name, bytes, whether `inspect` must fail too: it loads the model as `run` does,
/// so it refuses every file whose model does not load; `no-kernel.gguf` loads, and `run`
/// refuses only its prompt, which the four-token vocabulary cannot spell).
fn files() -> Vec<(&'static str, Vec<u8>, bool)> {
    let good = micro_model().bytes();
    let edit = |f: &dyn Fn(&mut Raw)| {
        let mut r = micro_model();
        f(&mut r);
        r.bytes()
    };
    let relaid = |f: &dyn Fn(&mut Raw)| {
        let mut r = micro_model();
        f(&mut r);
        r.layout();
        r.bytes()
    };
    let q = "blk.0.attn_q.weight";
    vec![
        ("empty.gguf", Vec::new(), true),
        ("truncated-header.gguf", good[..20].to_vec(), true),
        (
            "truncated-data.gguf",
            good[..good.len() - 100].to_vec(),
            true,
        ),
        ("bad-magic.gguf", edit(&|r| r.magic = *b"GGML"), true),
        ("count-2^60.gguf", edit(&|r| r.n_kv = Some(1 << 60)), true),
        (
            "offset-past-end.gguf",
            edit(&|r| r.ti(q).offset = 1 << 40),
            true,
        ),
        (
            "dims-overflow.gguf",
            edit(&|r| r.ti(q).dims = vec![1 << 40, 1 << 40]),
            true,
        ),
        (
            "row-bytes-overflow.gguf",
            edit(&|r| r.ti("output_norm.weight").dims = vec![1 << 62]),
            true,
        ),
        ("unknown-type.gguf", edit(&|r| r.ti(q).ty = 77), true),
        (
            "alignment-48.gguf",
            relaid(&|r| {
                r.set("general.alignment", u32v(48));
            }),
            true,
        ),
        (
            "block-count-string.gguf",
            relaid(&|r| {
                r.set(&format!("{A}.block_count"), strv("many"));
            }),
            true,
        ),
        (
            "head-count-0.gguf",
            relaid(&|r| {
                r.set(&format!("{A}.attention.head_count"), u32v(0));
            }),
            true,
        ),
        (
            "missing-tensor.gguf",
            relaid(&|r| {
                r.remove_tensor("blk.0.ffn_down.weight");
            }),
            true,
        ),
        (
            "shape-mismatch.gguf",
            relaid(&|r| r.ti(q).dims = vec![D, D / 2]),
            true,
        ),
        (
            "no-kernel.gguf",
            relaid(&|r| r.ti(q).ty = GgmlType::Q4_0.id()),
            false,
        ),
        (
            "vocab-scores-short.gguf",
            relaid(&|r| {
                r.set("tokenizer.ggml.scores", f32_arr(&[0.0; 3]));
            }),
            true,
        ),
    ]
}

fn expect_clean_failure(args: &[&str]) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args(args)
        .output()
        .expect("the ternion binary runs");
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "ternion {args:?}: exit code; stderr: {err}"
    );
    assert!(!err.contains("panicked"), "ternion {args:?}: {err}");
    assert!(err.starts_with("error: "), "ternion {args:?}: {err}");
    assert!(
        took < Duration::from_secs(1),
        "ternion {args:?}: took {took:?}"
    );
}

#[test]
fn hostile_files_fail_cleanly_in_inspect_and_run() {
    let dir = ternion_testkit::scratch::dir("ternion-hostile-cli");
    // The base file is good: run succeeds on it (so the failures below are the edits').
    let base = dir.join("good.gguf");
    std::fs::write(&base, micro_model().bytes()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args([
            "run",
            "--model",
            base.to_str().unwrap(),
            "--prompt",
            "a",
            "-n",
            "2",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for (name, bytes, inspect_fails) in files() {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let p = path.to_str().unwrap();
        if inspect_fails {
            expect_clean_failure(&["inspect", p]);
        }
        expect_clean_failure(&["run", "--model", p, "--prompt", "hello", "-n", "4"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
