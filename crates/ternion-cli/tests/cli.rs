//! End-to-end tests of the `ternion` binary on synthetic models and the golden sets in
//! `../shared` (which must exist beside the repository).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use ternion_testkit::shared as support_shared;

use support_shared::shared_path;

fn tmp_dir() -> PathBuf {
    ternion_testkit::scratch::dir("ternion-cli")
}

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

fn last_json(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().expect("some output")).expect("JSON last line")
}

/// A tiny BitNet b1.58 model with a truncated Llama-3 vocabulary, written once.
fn tiny_model() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = tmp_dir().join("tiny.gguf");
        let vocab = shared_path("vocab/ggml-vocab-llama3.gguf");
        ok(&[
            "synth",
            "--shape",
            "tiny",
            "--type",
            "i2_s",
            "--vocab",
            vocab.to_str().unwrap(),
            "--vocab-limit",
            "4000",
            "--out",
            out.to_str().unwrap(),
        ]);
        out
    })
}

#[test]
fn validate_golden_bitnet_passes_with_1_2_4_threads() {
    let m = shared_path("golden-bitnet/manifest.json");
    for t in ["1", "2", "4"] {
        let out = ok(&["validate", m.to_str().unwrap(), "-t", t]);
        assert!(out.contains("all 3 cases pass"), "{t} threads: {out}");
    }
}

#[test]
fn logits_are_identical_for_every_thread_count() {
    let model = shared_path("golden-bitnet/bitnet-b158-tiny-pub.gguf");
    let files: Vec<Vec<u8>> = ["1", "2", "3", "4"]
        .iter()
        .map(|t| {
            let out = tmp_dir().join(format!("t{t}.npy"));
            ok(&[
                "logits",
                "--model",
                model.to_str().unwrap(),
                "--prompt",
                "Threads must not change a single bit.",
                "-t",
                t,
                "--out",
                out.to_str().unwrap(),
            ]);
            std::fs::read(out).unwrap()
        })
        .collect();
    for f in &files[1..] {
        assert!(f == &files[0], "logits differ between thread counts");
    }
}

#[test]
fn run_json_greedy_is_deterministic_and_thread_independent() {
    let model = tiny_model().to_str().unwrap();
    let run = |threads: &str| {
        last_json(&ok(&[
            "run",
            "--model",
            model,
            "--prompt",
            "Hello world",
            "-n",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
            "-t",
            threads,
        ]))
    };
    let a = run("1");
    let b = run("2");
    assert_eq!(a["tokens"].as_array().unwrap().len(), 12);
    assert_eq!(a["tokens"], b["tokens"], "1 and 2 threads must agree");
    // 4000 tokens kept: 3744 ordinary ones, then the 256 specials; BOS is the first special.
    assert_eq!(a["prompt_tokens"][0], 3744, "BOS first");
    assert!(a["decode_tok_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn logits_npy_has_the_right_shape() {
    let out = tmp_dir().join("l.npy");
    let stdout = ok(&[
        "logits",
        "--model",
        tiny_model().to_str().unwrap(),
        "--tokens",
        "1,2,3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(last_json(&stdout)["tokens"], serde_json::json!([1, 2, 3]));
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'shape': (3, 4000)"), "{header}");
    assert_eq!(bytes.len(), 10 + hlen + 3 * 4000 * 4);
    let vals: Vec<f32> = bytes[10 + hlen..]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(vals.iter().all(|v| v.is_finite()));
    assert!(vals.iter().any(|&v| v != 0.0));
}

/// Every case of llama.cpp's tokenizer vectors, through the CLI.
fn tokenizer_vectors(vocab: &str) {
    let dir = shared_path("vocab");
    let inp = std::fs::read_to_string(dir.join(format!("{vocab}.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("{vocab}.out"))).unwrap();
    let cases: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let expected: Vec<&str> = out.lines().collect();
    let model = dir.join(vocab);
    for (text, want) in cases.iter().zip(&expected) {
        let got = ok(&[
            "tokenize",
            "--model",
            model.to_str().unwrap(),
            "--no-bos",
            text,
        ]);
        let ids: Vec<u64> = serde_json::from_str(got.trim()).unwrap();
        let want: Vec<u64> = want
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(ids, want, "{vocab}: text {text:?}");
    }
}

#[test]
fn tokenize_llama3_vectors() {
    tokenizer_vectors("ggml-vocab-llama3.gguf");
}

#[test]
fn tokenize_gpt2_vectors() {
    tokenizer_vectors("ggml-vocab-gpt-2.gguf");
}

#[test]
fn inspect_prints_tensors() {
    let out = ok(&["inspect", tiny_model().to_str().unwrap()]);
    assert!(out.contains("blk.1.ffn_down.weight"));
    assert!(out.contains("I2_S"));
    assert!(out.contains("general.architecture = \"bitnet-b1.58\""));
}

/// A hostile file: clean error, non-zero exit, no panic, quickly.
fn rejects(name: &str, bytes: &[u8], needle: &str) {
    let path = tmp_dir().join(name);
    std::fs::write(&path, bytes).unwrap();
    for cmd in [
        vec!["inspect", path.to_str().unwrap()],
        vec![
            "run",
            "--model",
            path.to_str().unwrap(),
            "--prompt",
            "hi",
            "-n",
            "2",
        ],
    ] {
        let t = Instant::now();
        let out = ternion(&cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {cmd:?} succeeded");
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name}: exit code (a panic gives 101)"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(
            err.contains(needle),
            "{name}: stderr lacks {needle:?}: {err}"
        );
        assert!(t.elapsed() < Duration::from_secs(5), "{name}: too slow");
    }
}

fn find(b: &[u8], needle: &[u8]) -> usize {
    b.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn hostile_files_are_rejected_cleanly() {
    let good = std::fs::read(tiny_model()).unwrap();
    rejects("truncated.gguf", &good[..good.len() / 2], "past the end");
    rejects("header-cut.gguf", &good[..20], "truncated");

    let mut b = good.clone();
    let at = find(&b, b"blk.0.attn_q.weight") + 19 + 4 + 16 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 42).to_le_bytes());
    rejects("offset.gguf", &b, "past the end");

    let mut b = good.clone();
    let at = find(&b, b"blk.0.attn_q.weight") + 19 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 33).to_le_bytes());
    b[at + 8..at + 16].copy_from_slice(&(1u64 << 33).to_le_bytes());
    rejects("overflow.gguf", &b, "overflow");

    let mut b = good.clone();
    let at = find(&b, b"blk.0.attn_q.weight") + 19 + 4 + 16;
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    rejects("type.gguf", &b, "type id 99");

    let mut b = good.clone();
    let at = find(&b, b"tokenizer.ggml.tokens") + 21 + 4 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    rejects("array.gguf", &b, "cannot fit");

    let mut b = good.clone();
    let at = find(&b, b"general.architecture") + 20 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    rejects("string.gguf", &b, "past the end");
}

#[test]
fn unknown_architecture_is_an_error() {
    let gpt2 = shared_path("vocab/ggml-vocab-gpt-2.gguf");
    let out = ternion(&["run", "--model", gpt2.to_str().unwrap(), "--prompt", "x"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("architecture") || err.contains("missing"),
        "{err}"
    );
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let out = ternion(&[
        "run",
        "--model",
        tiny_model().to_str().unwrap(),
        "--tokens",
        "1,2,3,4,5,6,7,8",
        "--ctx",
        "4",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("context"));
}

#[test]
fn offline_default_model_says_how_to_pass_a_file() {
    let home = tmp_dir().join("hf-home");
    let out = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args(["run", "--prompt", "hi", "-n", "1"])
        .env("HF_HOME", &home)
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--model"), "{err}");
}

/// A stand-in for the Hugging Face Hub on a local port: it answers every GET with `body`
/// (honouring `Range: bytes=A-` and `bytes=A-B`) and the headers hf-hub reads:
/// `x-repo-commit`, `x-linked-etag` (`etag`) and `content-range`. Serves until the test
/// process ends.
fn fake_hub(body: Vec<u8>, etag: String) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = r.trim().split_once('-').unwrap();
                    let a: usize = a.parse().unwrap();
                    let b = b.parse::<usize>().map_or(body.len(), |b| b + 1);
                    range = Some((a, b.min(body.len())));
                }
            }
            let (a, b) = range.unwrap_or((0, body.len()));
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nx-repo-commit: {commit}\r\n\
                 x-linked-etag: \"{etag}\"\r\netag: \"{etag}\"\r\n\
                 content-range: bytes {a}-{last}/{len}\r\ncontent-length: {n}\r\n\
                 connection: close\r\n\r\n",
                commit = "0".repeat(40),
                last = b.saturating_sub(1),
                len = body.len(),
                n = b - a,
            );
            let _ = conn
                .write_all(head.as_bytes())
                .and_then(|_| conn.write_all(&body[a..b]));
        }
    });
    format!("http://{addr}")
}

/// `ternion run` without `--model` downloads the default file from the Hub endpoint and
/// checks it against the SHA-256 the Hub reported (`x-linked-etag`): a match runs, a
/// mismatch fails with a clear message and removes the bad file from the cache.
#[test]
fn hub_download_is_checked_against_the_reported_sha256() {
    let body = std::fs::read(tiny_model()).unwrap();
    let run_default = |home: &Path, endpoint: &str| {
        Command::new(env!("CARGO_BIN_EXE_ternion"))
            .args(["run", "--tokens", "1,2", "-n", "1", "--json"])
            .env("HF_HOME", home)
            .env("HF_ENDPOINT", endpoint)
            .output()
            .unwrap()
    };
    // The right hash, from a different implementation than the CLI's (sha256sum).
    let good = String::from_utf8(
        Command::new("sha256sum")
            .arg(tiny_model())
            .output()
            .expect("sha256sum runs")
            .stdout,
    )
    .unwrap()
    .split_whitespace()
    .next()
    .unwrap()
    .to_owned();
    let home = tmp_dir().join("hf-home-good");
    let out = run_default(&home, &fake_hub(body.clone(), good.clone()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("SHA-256 matches the Hub's"), "{err}");
    assert_eq!(
        last_json(&String::from_utf8_lossy(&out.stdout))["tokens"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // The same hash with its first digit changed: what a tampered file would report.
    let first = if good.starts_with('0') { '1' } else { '0' };
    let bad = format!("{first}{}", &good[1..]);
    let home = tmp_dir().join("hf-home-bad");
    let out = run_default(&home, &fake_hub(body, bad.clone()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("its SHA-256 is {good}, the Hub reported {bad}")),
        "{err}"
    );
    let blob = home
        .join("hub/models--microsoft--bitnet-b1.58-2B-4T-gguf/blobs")
        .join(&bad);
    assert!(!blob.exists(), "the corrupt download stayed in the cache");
}

#[test]
fn bench_json_reports_speeds() {
    let model = tiny_model();
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "--model", model.to_str().unwrap(), "-P", "16"];
        args.extend_from_slice(&["-n", "4", "--json"]);
        args.extend_from_slice(extra);
        last_json(&ok(&args))
    };
    let v = bench(&[]);
    for k in ["prefill_tok_s", "decode_tok_s", "ms_per_token", "threads"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    assert_eq!(v["backend"], "cpu");
    assert!(v["kernels"].is_null(), "{v}");
    // The read bandwidth, measured before the runs and after; the probe's 512 MiB buffer
    // is not counted in the tiny model's peak memory.
    for k in ["read_bandwidth_before_gb_s", "read_bandwidth_gb_s"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    // The probe's loop, chosen as the fastest of the CPU's load widths (8: the plain
    // loop's words).
    let width = v["read_probe_load_bytes"].as_u64().unwrap_or(0);
    assert!([8, 32, 64].contains(&width), "{v}");
    let rss = v["peak_rss_bytes"].as_u64().expect("peak RSS on Linux");
    assert!(rss < 256 << 20, "peak RSS {rss}: {v}");
    // Decode's share of the bandwidth step by step (one probe pass beside each step):
    // quartiles in order, and percentages (not fractions, nor a unit off by 10³): the
    // tiny model's weights sit in the caches, so a step may read faster than the probe
    // streams memory, but neither a hundred times slower nor a hundred times faster.
    let share = &v["decode_share_per_step_pct"];
    let q: Vec<f64> = ["q1", "median", "q3"]
        .map(|k| share[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}")))
        .to_vec();
    assert!(q[0] > 0.0 && q[0] <= q[1] && q[1] <= q[2], "{v}");
    assert!(q[0] > 1.0 && q[2] < 1e4, "{v}");
    // How far apart the threads run, before and after the runs: a time in nanoseconds, or
    // null where the two threads did not run together (a busy CI machine). The steps split
    // by that placement are at most the steps run.
    for k in ["thread_handoff_ns_before", "thread_handoff_ns_after"] {
        let ns = &v[k];
        assert!(
            ns.is_null() || ns.as_f64().is_some_and(|x| x > 0.0 && x < 1e6),
            "{k}: {v}"
        );
    }
    let by_place = &v["decode_share_per_step_pct_by_placement"];
    let steps: u64 = ["shared_l3", "separate_l3"]
        .iter()
        .map(|k| by_place[k]["steps"].as_u64().unwrap_or(0))
        .sum();
    assert!(by_place.is_object() && steps <= 4, "{v}");
    // As llama-bench: five timed runs by default, the figures their mean.
    assert_eq!(v["repetitions"], 5, "{v}");
    for k in ["prefill_tok_s", "decode_tok_s"] {
        let reps: Vec<f64> = v[format!("{k}_reps")]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(reps.len(), 5, "{v}");
        let mean = reps.iter().sum::<f64>() / 5.0;
        assert!(
            (mean - v[k].as_f64().unwrap()).abs() <= 1e-9 * mean,
            "{k}: {v}"
        );
        assert!(v[format!("{k}_sd")].as_f64().unwrap() >= 0.0, "{v}");
    }
    let one = bench(&["-r", "1"]);
    assert_eq!(one["repetitions"], 1, "{one}");
    assert_eq!(one["prefill_tok_s_sd"], 0.0, "{one}");
    // A batch's step reads the weights for several sequences: no per-step share.
    let batched = bench(&["-r", "1", "--batch", "2"]);
    assert!(batched["decode_share_per_step_pct"].is_null(), "{batched}");
    // The KV cache a step reads, counted in the achieved rate: the mean over the 4 steps
    // (step i of a 16-token prompt sees 17 + i positions, 18.5 on average; of a 32-token
    // one 34.5), once for each sequence of a batch.
    let kv = |v: &serde_json::Value| v["kv_bytes_per_step"].as_u64().unwrap_or(0);
    assert!(kv(&one) > 0, "{one}");
    assert_eq!(kv(&batched), 2 * kv(&one), "{batched}");
    let m = model.to_str().unwrap();
    let longer = last_json(&ok(&[
        "bench", "--model", m, "-P", "32", "-n", "4", "--json", "-r", "1",
    ]));
    assert_eq!(kv(&longer) * 185, kv(&one) * 345, "{longer}");
    // The achieved rate is those bytes (weights once a step, each sequence's KV cache) at
    // the decode speed.
    for r in [&one, &batched, &longer] {
        let per_step = (r["weight_bytes_per_token"].as_u64().unwrap() + kv(r)) as f64;
        let steps_s = r["decode_tok_s"].as_f64().unwrap() / r["batch"].as_f64().unwrap();
        let want = per_step * steps_s / 1e9;
        let got = r["achieved_gb_s"].as_f64().unwrap();
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "{got} against {want}: {r}"
        );
    }
}

/// `bench --profile` on the CPU breaks a decode token down by graph op: every layer's
/// instance of an op in one row (as many calls a token as layers), the LM head once with
/// the bytes of its matrix, and the rows' shares within the decode time.
#[test]
fn cpu_bench_profiles_decode_op_by_op() {
    let model = tiny_model();
    let args = [
        "bench",
        "--model",
        model.to_str().unwrap(),
        "-P",
        "4",
        "-n",
        "3",
        "--profile",
    ];
    let out = ok(&args);
    let layers: u64 = out
        .split(" layers")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no layer count in:\n{out}"));
    assert!(
        out.contains("decode profile (CPU, wall clock per token)"),
        "{out}"
    );
    let row = |start: &str| -> Vec<String> {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no '{start}' row in:\n{out}"));
        line.split_whitespace().map(str::to_string).collect()
    };
    let calls = |r: &[String]| -> u64 {
        let c = r.iter().find(|w| w.ends_with('×')).expect("a call count");
        c.trim_end_matches('×').parse().expect("a number of calls")
    };
    let attention = row("attention (rope, kv store)");
    assert_eq!(calls(&attention), layers, "{out}");
    // Attention's bytes are the KV cache it reads.
    assert!(
        attention.iter().any(|w| w == "GB/s"),
        "attention's rate: {out}"
    );
    // The pool's line: its ops a token, parallel or on the caller alone, at least one a
    // layer's product.
    let pool = row("CPU pool:");
    let count_before = |word: &str| -> f64 {
        let i = pool
            .iter()
            .position(|w| w == word)
            .unwrap_or_else(|| panic!("no '{word}' in the pool line: {out}"));
        pool[i - 1]
            .trim_start_matches('(')
            .parse()
            .expect("a count")
    };
    assert!(
        count_before("parallel") + count_before("single-task") >= layers as f64,
        "{out}"
    );
    let head = row("LM head:");
    assert_eq!(calls(&head), 1, "{out}");
    assert!(head.iter().any(|w| w == "GB/s"), "the head's rate: {out}");
    let shares: f64 = out
        .lines()
        .skip_while(|l| !l.starts_with("decode profile"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().find(|w| w.ends_with('%')))
        .map(|w| w.trim_end_matches('%').parse::<f64>().expect("a share"))
        .sum();
    assert!(
        shares > 0.0 && shares <= 100.5,
        "shares sum to {shares}: {out}"
    );
    let batched = ternion(&[&args[..], &["--batch", "2"]].concat());
    assert!(!batched.status.success());
    assert!(String::from_utf8_lossy(&batched.stderr).contains("leave out --batch"));
}

#[test]
fn gpu_bench_reports_its_kernel_variants_and_turns_them_off() {
    if !gpu_tests_on() {
        return;
    }
    let model = tiny_model();
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--model",
            model.to_str().unwrap(),
            "--backend",
            "gpu",
            "-P",
            "16",
            "-n",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        last_json(&ok(&args))
    };
    let v = bench(&[]);
    let k = &v["kernels"];
    assert!(k["adapter"].as_str().is_some_and(|a| !a.is_empty()), "{v}");
    assert!(k["f16"].is_boolean() && k["subgroups"].is_boolean(), "{v}");
    assert!(
        ["batch4", "tiled", "coop"].contains(&k["prefill"].as_str().unwrap()),
        "{v}"
    );
    let v = bench(&[
        "--gpu-no-f16",
        "--gpu-no-subgroups",
        "--gpu-prefill",
        "tiled",
    ]);
    let k = &v["kernels"];
    assert_eq!(
        (&k["f16"], &k["subgroups"]),
        (&false.into(), &false.into()),
        "{v}"
    );
    assert_eq!(k["prefill"], "tiled", "{v}");
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn bench_serve_json_reports_every_stream_count() {
    let out = ok(&[
        "bench-serve",
        "--model",
        tiny_model().to_str().unwrap(),
        "--streams",
        "1,3",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "5",
        "--requests",
        "2",
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(v["batching"], "stacked");
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (r, streams) in runs.iter().zip([1u64, 3]) {
        assert_eq!(r["streams"].as_u64(), Some(streams), "{r}");
        assert_eq!(r["requests"].as_u64(), Some(streams * 2), "{r}");
        // Every request streamed exactly its 5 tokens (end-of-generation ignored).
        assert_eq!(r["tokens"].as_u64(), Some(streams * 2 * 5), "{r}");
        for k in [
            "aggregate_tok_s",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "itl_p50_ms",
            "itl_p99_ms",
        ] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
        }
        assert!(
            r["ttft_p99_ms"].as_f64() >= r["ttft_p50_ms"].as_f64(),
            "{r}"
        );
        assert!(r["itl_p99_ms"].as_f64() >= r["itl_p50_ms"].as_f64(), "{r}");
    }
}

#[test]
fn validate_golden_families_passes() {
    let m = shared_path("golden/manifest.json");
    let out = ok(&["validate", m.to_str().unwrap(), "-t", "2"]);
    assert!(out.contains("all 60 cases pass"), "{out}");
    for model in ["llama-spm-d256-q4_k", "phi3-d32-q4_0", "gpt2-d32-q8_0"] {
        assert!(out.contains(model), "{model} missing from:\n{out}");
    }
}

/// False (with the reason printed) when GPU tests are switched off.
fn gpu_tests_on() -> bool {
    if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
        eprintln!("skipped: TERNION_SKIP_GPU_TESTS=1");
        return false;
    }
    true
}

#[test]
fn validate_golden_families_passes_on_gpu() {
    if !gpu_tests_on() {
        return;
    }
    let m = shared_path("golden/manifest.json");
    let out = ok(&["validate", m.to_str().unwrap(), "--backend", "gpu"]);
    assert!(out.contains("all 60 cases pass"), "{out}");
    for model in [
        "bitnet-l3-d256-tq1_0",
        "llama-spm-d256-q6_k",
        "phi3-d32-f16",
        "gpt2-d32-f32",
    ] {
        assert!(out.contains(model), "{model} missing from:\n{out}");
    }
}

#[test]
fn validate_golden_bitnet_passes_on_gpu() {
    if !gpu_tests_on() {
        return;
    }
    let m = shared_path("golden-bitnet/manifest.json");
    let out = ok(&["validate", m.to_str().unwrap(), "--backend", "gpu"]);
    assert!(out.contains("backend: gpu"), "{out}");
    assert!(out.contains("all 3 cases pass"), "{out}");
}

#[test]
fn sha256_is_checked_before_loading() {
    let model = shared_path("golden-bitnet/bitnet-b158-tiny-pub.gguf");
    let m = model.to_str().unwrap();
    // The manifest records the file's hash.
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(shared_path("golden-bitnet/manifest.json")).unwrap(),
    )
    .unwrap();
    let good = manifest["model_sha256"].as_str().unwrap();
    let out = ok(&[
        "run", "--model", m, "--tokens", "1,2", "-n", "1", "--sha256", good, "--json",
    ]);
    assert_eq!(last_json(&out)["tokens"].as_array().unwrap().len(), 1);
    let bad = "0".repeat(64);
    let out = ternion(&[
        "run", "--model", m, "--tokens", "1,2", "-n", "1", "--sha256", &bad,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("SHA-256 is dba18789"));
    // Malformed digests are refused before the file is read.
    for bad_hex in ["xyz", &"g".repeat(64), &good[..63]] {
        let out = ternion(&[
            "run", "--model", m, "--tokens", "1,2", "-n", "1", "--sha256", bad_hex,
        ]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("must be 64 hexadecimal digits"), "{err}");
    }
    // Upper case is the same digest.
    ok(&[
        "run",
        "--model",
        m,
        "--tokens",
        "1,2",
        "-n",
        "1",
        "--sha256",
        &good.to_ascii_uppercase(),
    ]);
}

#[test]
fn chat_streams_two_turns_and_reuses_the_cache() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args([
            "chat",
            "--model",
            tiny_model().to_str().unwrap(),
            "-n",
            "6",
            "--temperature",
            "0",
            "--system",
            "Be brief.",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello there\nAnd again\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // One stats line per turn; the second turn's prompt is only the new text (the first
    // turn stays in the KV cache), so it is shorter than the first turn's.
    let prompts: Vec<usize> = err
        .lines()
        .filter_map(|l| l.split("prompt ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(prompts.len(), 2, "{err}");
    // End of input prints the totals.
    assert!(err.contains("chat ended: 2 replies"), "{err}");
    assert!(
        prompts[1] < prompts[0] + 6,
        "second turn re-fed the history: {prompts:?}"
    );
}

/// Starts `ternion run` on the tiny model with a generation far longer than any test
/// (ignore EOS, a 32k context: about two minutes), with stdout and stderr piped.
#[cfg(unix)]
fn spawn_long_run(json: bool) -> std::process::Child {
    let mut args = vec![
        "run",
        "--model",
        tiny_model().to_str().unwrap(),
        "--prompt",
        "Once upon a time",
        "-n",
        "1000000",
        "--ignore-eos",
        "--ctx",
        "32768",
        "-t",
        "1",
    ];
    if json {
        args.push("--json");
    }
    Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the ternion binary starts")
}

#[cfg(unix)]
fn sigint(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// Ctrl-C while `ternion run` streams: the text so far, "interrupted" and the stats, exit
/// status 130. The signal is sent once the first piece is out; the test then stops
/// reading, so the run cannot get far past that point (its stdout pipe fills) and cannot
/// finish on its own first.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_streaming_run_with_partial_output_and_stats() {
    use std::io::Read;
    let mut child = spawn_long_run(false);
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("a first piece");
    sigint(&child);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "stderr:\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let decoded: usize = stderr
        .split("decode ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no decode stats in:\n{stderr}"));
    assert!((1..32768).contains(&decoded), "{decoded} tokens");
    assert!(!rest.is_empty() || first[0] != 0, "no text printed");
}

/// Ctrl-C during `ternion run --json`: the JSON line is still printed last, with the
/// tokens so far and finish_reason "interrupted"; exit status 130. The signal is sent
/// after the "generating" line on stderr (the handler is installed by then), minutes
/// before the run could finish on its own.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_a_json_run_with_the_partial_result() {
    use std::io::{BufRead, BufReader, Read};
    let mut child = spawn_long_run(true);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("generating") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "no 'generating' line"
        );
    }
    sigint(&child);
    let mut err_rest = String::new();
    stderr.read_to_string(&mut err_rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "stderr:\n{err_rest}");
    let v = last_json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(v["finish_reason"], "interrupted");
    let n = v["tokens"].as_array().expect("tokens").len();
    assert!((1..32768).contains(&n), "{n} tokens");
    assert!(v["decode_tok_s"].is_number(), "{v}");
}

/// Lines of a child's stderr, read on a thread so the test can wait for one.
#[cfg(unix)]
fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a stderr line containing `needle`; returns every line read until then.
#[cfg(unix)]
fn wait_for(lines: &std::sync::mpsc::Receiver<String>, needle: &str) -> String {
    let mut seen = String::new();
    loop {
        let line = lines
            .recv()
            .unwrap_or_else(|_| panic!("stderr ended before '{needle}':\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(needle) {
            return seen;
        }
    }
}

/// Reads whatever a non-blocking pipe holds now, then makes it blocking again.
#[cfg(unix)]
fn drain_now(pipe: &mut std::process::ChildStdout) -> Vec<u8> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl on a file descriptor this process owns, flags only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    assert!(flags >= 0);
    // SAFETY: as above.
    assert!(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } >= 0);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("reading stdout: {e}"),
        }
    }
    // SAFETY: as above.
    assert!(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } >= 0);
    got
}

/// Ctrl-C during `ternion chat`: a reply being generated stops and the chat returns to the
/// prompt (twice: the second turn runs after the first was cut), and Ctrl-C at the prompt
/// prints the totals and exits with status 130. Replies are far longer than the test (a
/// million tokens, 32k context); each signal is sent once the reply's first text is out,
/// and the next step waits for "interrupted" on stderr (printed after the flag is
/// cleared), so every signal lands where the test says.
#[cfg(unix)]
#[test]
fn ctrl_c_in_chat_stops_the_reply_and_then_exits_at_the_prompt() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args([
            "chat",
            "--model",
            tiny_model().to_str().unwrap(),
            "-n",
            "1000000",
            "--ctx",
            "32768",
            "--temperature",
            "0",
            "-t",
            "1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the ternion binary starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let err = stderr_lines(&mut child);
    let mut replies = Vec::new();
    for turn in ["Hello there", "And again"] {
        writeln!(stdin, "{turn}").unwrap();
        let mut first = [0u8; 1];
        stdout.read_exact(&mut first).expect("a first piece");
        sigint(&child);
        let seen = wait_for(&err, "interrupted");
        let stats = wait_for(&err, "decode ");
        let decoded: usize = stats
            .split("decode ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no decode stats in:\n{seen}{stats}"));
        assert!((1..32768).contains(&decoded), "{decoded} tokens");
        // Everything of this reply was written before "interrupted".
        let mut reply = first.to_vec();
        reply.extend(drain_now(&mut stdout));
        assert_eq!(reply.last(), Some(&b'\n'), "reply not ended by a newline");
        replies.push(reply);
    }
    sigint(&child);
    let totals = wait_for(&err, "chat ended");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{totals}");
    assert!(totals.contains("chat ended: 2 replies"), "{totals}");
    assert!(replies.iter().all(|r| r.len() > 1), "{replies:?}");
}

/// The golden2 cases: every model of both sets (qwen2, qwen3, gemma3, llama with the SmolLM
/// and SPM vocabularies; F16, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K,
/// Q1_0, Q2_0, TQ1_0, TQ2_0).
const GOLDEN2_CASES: [(&str, &str, &str); 2] = [
    (
        "golden2/manifest.json",
        "qwen2-d64-f16,qwen3-t64-q2_0,gemma3-d64-q4_k,llama-smollm-d64-q4_1,llama-spm-d64-q5_0,\
         llama-spm-d64-q5_1,llama-spm-d64-iq4_nl,llama-spm-b128-q1_0,llama-spm-t64-q2_0,\
         llama-spm-d256-q2_k",
        "all 50 cases pass",
    ),
    (
        "golden2-extra/manifest.json",
        "qwen3-b128-q1_0,qwen3-d64-f16,gemma3-d64-q5_0,gemma3-d64-f16,llama-spm-d64-q4_1,\
         llama-spm-d256-q3_k,llama-spm-d256-q5_k,llama-spm-d256-iq4_xs,llama-spm-t256-tq1_0,\
         llama-spm-t256-tq2_0",
        "all 50 cases pass",
    ),
];

fn validate_golden2(backend: &str, cases: &[(&str, &str, &str)]) {
    for &(manifest, only, pass) in cases {
        let m = shared_path(manifest);
        let out = ok(&[
            "validate",
            m.to_str().unwrap(),
            "--only",
            only,
            "--backend",
            backend,
            "-t",
            "2",
        ]);
        assert!(out.contains(pass), "{manifest} on {backend}:\n{out}");
        for model in only.split(',') {
            assert!(out.contains(model), "{model} missing from:\n{out}");
        }
    }
}

#[test]
fn validate_golden2_new_architectures() {
    validate_golden2("cpu", &GOLDEN2_CASES);
}

#[test]
fn validate_golden2_new_architectures_on_gpu() {
    if !gpu_tests_on() {
        return;
    }
    // The public set only: lavapipe takes ~10 minutes for both (the extra set's
    // architectures and formats are the same kernels in other sizes).
    validate_golden2("gpu", &GOLDEN2_CASES[..1]);
}

#[test]
fn validate_only_that_matches_nothing_is_an_error() {
    let m = shared_path("golden2/manifest.json");
    let out = ternion(&["validate", m.to_str().unwrap(), "--only", "no-such-model"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no case of the manifest matches"), "{err}");
}

/// The float values of a `ternion logits` .npy file.
fn npy_values(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + hlen..]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// A Falcon3-1.58-style model (`llama` + I2_S, no sub-norms) and a TriLM-style one
/// (`llama` + TQ2_0): the GPU's logits equal the CPU's within activation-rounding noise,
/// and I2_S agrees with TQ2_0 on the same ternary weights.
#[test]
fn llama_with_ternary_weights_on_cpu_and_gpu() {
    let dir = tmp_dir();
    let mut rows = Vec::new();
    for ty in ["i2_s", "tq2_0"] {
        let model = dir.join(format!("llama-{ty}.gguf"));
        let m = model.to_str().unwrap();
        ok(&["synth", "--arch", "llama", "--type", ty, "--out", m]);
        let backends: &[&str] = if gpu_tests_on() {
            &["cpu", "gpu"]
        } else {
            &["cpu"]
        };
        let mut got = Vec::new();
        for b in backends {
            let out = dir.join(format!("llama-{ty}-{b}.npy"));
            let o = out.to_str().unwrap();
            let prompt = "Ternary weights in a llama block.";
            ok(&[
                "logits",
                "--model",
                m,
                "--prompt",
                prompt,
                "--out",
                o,
                "--backend",
                b,
            ]);
            got.push(npy_values(&out));
        }
        for g in &got[1..] {
            let d = g
                .iter()
                .zip(&got[0])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d < 0.1, "{ty}: gpu vs cpu max |diff| {d}");
        }
        rows.push(got.swap_remove(0));
    }
    let d = rows[0]
        .iter()
        .zip(&rows[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d < 0.5, "i2_s vs tq2_0 max |diff| {d}");
}

/// `ternion run --json` of the tiny model on "Hi" (60 tokens at most, temperature 1, seed
/// 7, one thread) with `extra` flags.
fn run_sampled(extra: &[&str]) -> Value {
    let model = tiny_model().to_str().unwrap();
    let mut args = vec![
        "run",
        "--model",
        model,
        "--prompt",
        "Hi",
        "-n",
        "60",
        "--temperature",
        "1",
        "--seed",
        "7",
        "-t",
        "1",
        "--json",
    ];
    args.extend_from_slice(extra);
    last_json(&ok(&args))
}

/// `run` under `--regex` [`PLATE`] ended with text matching it.
fn assert_plate(v: &Value) {
    assert_eq!(v["finish_reason"], "stop", "{v}");
    let b = v["text"].as_str().unwrap().as_bytes();
    assert!(
        b.len() == 6 && b[..2].iter().all(u8::is_ascii_uppercase) && b[2] == b'-',
        "{v}"
    );
    assert!(b[3..].iter().all(u8::is_ascii_digit), "{v}");
}

/// A regular expression for constrained runs.
const PLATE: &str = "[A-Z]{2}-[0-9]{3}";

#[test]
fn run_with_a_regex_or_a_json_schema_gives_matching_output() {
    let model = tiny_model().to_str().unwrap();
    assert_plate(&run_sampled(&["--regex", PLATE]));
    let schema = tmp_dir().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["ok", "n"], "additionalProperties": false}"#,
    )
    .unwrap();
    let v = run_sampled(&["--json-schema", schema.to_str().unwrap()]);
    let obj: Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
    assert!(
        obj["ok"].is_boolean() && obj["n"].as_u64().unwrap() <= 9,
        "{obj}"
    );
    let out = ternion(&["run", "--model", model, "--prompt", "Hi", "--regex", "(x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid grammar"), "{err}");
}

/// On the GPU, `run` draws constrained tokens from the top-k selected under the mask on
/// the device, and `bench-serve` measures constrained requests that way or, with
/// `--no-gpu-mask`, from whole rows (its JSON says which).
#[test]
fn gpu_run_and_bench_serve_constrain_through_the_masked_top_k() {
    if !gpu_tests_on() {
        return;
    }
    assert_plate(&run_sampled(&["--regex", PLATE, "--backend", "gpu"]));
    let model = tiny_model().to_str().unwrap();
    for (extra, masked) in [(None, true), (Some("--no-gpu-mask"), false)] {
        let mut args = vec![
            "bench-serve",
            "--model",
            model,
            "--backend",
            "gpu",
            "--streams",
            "2",
            "--prompt-tokens",
            "8",
            "--max-tokens",
            "12",
            "--regex",
            "[0-9a-f]{4,8}",
            "--json",
        ];
        args.extend(extra);
        let v = last_json(&ok(&args));
        assert_eq!(v["gpu_mask"], masked, "{v}");
        let tokens = v["runs"][0]["tokens"].as_u64().unwrap();
        assert!(
            (2..=2 * 8).contains(&tokens),
            "two answers of 4 to 8 hex digits: {v}"
        );
    }
}

/// A text of about 1,200 tokens of the tiny model's vocabulary, written once.
fn ppl_text() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let text: String = (0..60)
            .map(|i| {
                format!(
                    "Line {i} says that {} ternary weights fit in a byte. ",
                    i * 7 % 13
                )
            })
            .collect();
        let p = tmp_dir().join("ppl.txt");
        std::fs::write(&p, text).unwrap();
        p
    })
}

/// `ternion perplexity --json` with `extra` flags on the tiny model and [`ppl_text`].
fn perplexity_json(extra: &[&str]) -> Value {
    let mut args = vec![
        "perplexity",
        "--model",
        tiny_model().to_str().unwrap(),
        "-f",
        ppl_text().to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    last_json(&ok(&args))
}

/// The perplexity and its uncertainty computed here, llama-perplexity's way, from the
/// logits `ternion logits` writes for each `n_ctx`-token chunk of the text (BOS in place
/// of each chunk's first token, the second half of each chunk scored), at most `limit`
/// chunks.
fn perplexity_from_logits(n_ctx: usize, backend: &str, limit: usize) -> (f64, f64, usize) {
    let model = tiny_model().to_str().unwrap();
    let text = std::fs::read_to_string(ppl_text()).unwrap();
    let ids = |t: &str| -> Vec<u64> {
        let v: Value = serde_json::from_str(&ok(&["tokenize", "--model", model, t])).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let bos = ids("")[0];
    let tokens = ids(&text);
    assert_eq!(tokens[0], bos, "the tiny model adds BOS");
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    for chunk in tokens.chunks_exact(n_ctx).take(limit) {
        let mut chunk = chunk.to_vec();
        chunk[0] = bos;
        let list: Vec<String> = chunk.iter().map(u64::to_string).collect();
        let out = tmp_dir().join(format!("ppl-{backend}-{count}.npy"));
        let (o, l) = (out.to_str().unwrap(), list.join(","));
        ok(&[
            "logits",
            "--model",
            model,
            "--tokens",
            &l,
            "--out",
            o,
            "--backend",
            backend,
        ]);
        let logits = npy_values(&out);
        let n_vocab = logits.len() / n_ctx;
        for j in n_ctx / 2..n_ctx - 1 {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = row
                .iter()
                .map(|&v| (f64::from(v) - f64::from(max)).exp())
                .sum();
            let nll = z.ln() - (f64::from(row[chunk[j + 1] as usize]) - f64::from(max));
            sum += nll;
            sum2 += nll * nll;
            count += 1;
        }
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let err = ((sum2 / count as f64 - mean * mean) / (count - 1) as f64).sqrt() * ppl;
    (ppl, err, count)
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-4 * want.abs(),
        "{what}: command {got}, computed {want}"
    );
}

#[test]
fn perplexity_equals_the_one_computed_from_ternion_logits() {
    // Every chunk of the text on the CPU; three on the GPU (each `ternion logits` run
    // opens the adapter again, slow on lavapipe).
    let mut backends = vec![("cpu", None)];
    if gpu_tests_on() {
        backends.push(("gpu", Some(3)));
    }
    for (b, limit) in backends {
        // An odd context: positions 37..=73 of each 75-token chunk are scored.
        let mut args = vec!["-c", "75", "--backend", b];
        let limit_arg = limit.map(|l: usize| l.to_string());
        if let Some(l) = &limit_arg {
            args.extend(["--chunks", l]);
        }
        let v = perplexity_json(&args);
        let n_tokens = v["tokens"].as_u64().unwrap() as usize;
        let n_chunk = (n_tokens / 75).min(limit.unwrap_or(usize::MAX));
        assert!(n_chunk >= 3, "{v}");
        assert_eq!(v["chunks"].as_u64().unwrap() as usize, n_chunk, "{v}");
        assert_eq!(v["running_ppl"].as_array().unwrap().len(), n_chunk, "{v}");
        let (ppl, err, count) = perplexity_from_logits(75, b, n_chunk);
        assert_eq!(v["scored"].as_u64().unwrap() as usize, count, "{v}");
        assert_eq!(count, n_chunk * 37);
        assert_close(v["ppl"].as_f64().unwrap(), ppl, b);
        assert_close(v["uncertainty"].as_f64().unwrap(), err, b);
        assert!(v["eval_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    }
}

#[test]
fn perplexity_prints_running_values_and_the_final_estimate() {
    let model = tiny_model().to_str().unwrap();
    let text = ppl_text().to_str().unwrap();
    let out = ok(&["perplexity", "-m", model, "-f", text, "--ctx-size", "128"]);
    let v = perplexity_json(&["-c", "128"]);
    let running: Vec<String> = v["running_ppl"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{}]{:.4},", i + 1, p.as_f64().unwrap()))
        .collect();
    let want = format!(
        "{}\nFinal estimate: PPL = {:.4} +/- {:.5}\n",
        running.concat(),
        v["ppl"].as_f64().unwrap(),
        v["uncertainty"].as_f64().unwrap()
    );
    assert_eq!(out, want);
}

#[test]
fn perplexity_chunks_1_scores_one_chunk() {
    let v = perplexity_json(&["-c", "64", "--chunks", "1"]);
    assert_eq!(v["chunks"], 1, "{v}");
    assert_eq!(v["scored"], 31, "{v}");
    assert_eq!(v["running_ppl"].as_array().unwrap().len(), 1, "{v}");
    let (ppl, _, count) = perplexity_from_logits(64, "cpu", 1);
    assert_eq!(count, 31);
    assert_close(v["ppl"].as_f64().unwrap(), ppl, "one chunk");
}

#[test]
fn perplexity_refuses_a_short_text_and_a_context_beyond_the_model_s() {
    let model = tiny_model().to_str().unwrap();
    let text = ppl_text().to_str().unwrap();
    let short = tmp_dir().join("short.txt");
    std::fs::write(&short, "Too short for a context of 512 tokens.").unwrap();
    let fails = |args: &[&str]| {
        let out = ternion(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = fails(&["perplexity", "-m", model, "-f", short.to_str().unwrap()]);
    assert!(
        err.contains("you need at least 1024 tokens to evaluate perplexity with a context of 512"),
        "{err}"
    );
    assert!(err.contains("tokenizes to only"), "{err}");
    let err = fails(&["perplexity", "-m", model, "-f", text, "-c", "8192"]);
    assert!(
        err.contains("--ctx-size 8192 is more than the model's context of 4096 tokens"),
        "{err}"
    );
    let err = fails(&["perplexity", "-m", model, "-f", text, "--chunks", "0"]);
    assert!(err.contains("--chunks must be at least 1"), "{err}");
    let missing = tmp_dir().join("no-such-text.txt");
    let err = fails(&["perplexity", "-m", model, "-f", missing.to_str().unwrap()]);
    assert!(
        err.contains("reading") && err.contains("no-such-text.txt"),
        "{err}"
    );
}
