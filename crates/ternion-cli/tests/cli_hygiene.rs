//! The command-line conventions through the real binary: a closed pipe, model paths and
//! the Hugging Face cache, seeds, prompts from files and standard input, backend and
//! thread defaults, `inspect` on broken models, and `chat`'s input and context shifting.

use ternion_testkit::gguf_gen;
use ternion_testkit::shared as support_shared;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use gguf_gen::*;
use serde_json::Value;
use ternion::quant::GgmlType;
use ternion_testkit::synth::{Shape, Spec, Vocab};

fn tmp_dir() -> PathBuf {
    ternion_testkit::scratch::dir("ternion-cli-hygiene")
}

fn ternion() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ternion"))
}

/// Runs `ternion args` with `stdin` as its standard input.
fn with_stdin(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    let mut child = ternion()
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the ternion binary runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(args: &[&str]) -> Output {
    let o = ternion().args(args).output().unwrap();
    assert!(o.status.success(), "ternion {args:?}: {}", text(&o.stderr));
    o
}

fn fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let o = ternion()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "ternion {args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn last_json(o: &Output) -> Value {
    let out = text(&o.stdout);
    serde_json::from_str(out.lines().last().expect("output")).expect("JSON last line")
}

/// A tiny BitNet b1.58 model with a truncated Llama-3 vocabulary, written once (through
/// the library's writer, as `ternion synth` does).
fn tiny() -> &'static str {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = tmp_dir().join("tiny.gguf");
        let vocab = support_shared::shared_path("vocab/ggml-vocab-llama3.gguf");
        let spec = Spec {
            arch: "bitnet-b1.58",
            shape: Shape::named("tiny").unwrap(),
            weight_type: GgmlType::I2_S,
            vocab: Vocab::File {
                path: &vocab,
                limit: Some(4000),
            },
            seed: 1,
        };
        ternion_testkit::synth::write(&spec, &out).expect("writing the tiny model");
        out
    })
    .to_str()
    .unwrap()
}

#[test]
fn a_closed_stdout_ends_inspect_tokenize_and_run_quietly() {
    let m = tiny();
    let cases: [&[&str]; 3] = [
        &["inspect", m],
        &["tokenize", "-m", m, "hello world"],
        &[
            "run",
            "-m",
            m,
            "-p",
            "hello",
            "-n",
            "50",
            "--ignore-eos",
            "-t",
            "1",
        ],
    ];
    for args in cases {
        // The reading end is closed before the command starts: its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = ternion()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn model_paths_name_what_is_wrong() {
    let dir = tmp_dir().join("not-a-model");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let err = fails(&["run", "-m", d, "-p", "x"], &[]);
    assert!(err.contains(d) && err.contains("is a directory"), "{err}");
    let missing = tmp_dir().join("missing.gguf");
    let missing = missing.to_str().unwrap();
    for cmd in ["run", "inspect", "tokenize"] {
        let args: Vec<&str> = match cmd {
            "run" => vec!["run", "-m", missing, "-p", "x"],
            "inspect" => vec!["inspect", missing],
            _ => vec!["tokenize", "-m", missing, "x"],
        };
        let err = fails(&args, &[]);
        assert!(err.contains(missing) && err.contains("not found"), "{err}");
    }
}

/// A Hugging Face cache in `home` holding `owner/repo/tiny.gguf` (hf-hub's layout).
fn hf_cache_with_tiny(home: &Path) {
    let repo = home.join("hub/models--owner--repo");
    let snap = repo.join("snapshots/0123456789abcdef");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123456789abcdef").unwrap();
    std::fs::copy(tiny(), snap.join("tiny.gguf")).unwrap();
}

#[test]
fn hugging_face_files_come_from_the_cache_offline() {
    let home = tmp_dir().join("hf-home");
    hf_cache_with_tiny(&home);
    let home = home.to_str().unwrap();
    let env = [("HF_HOME", home), ("HF_HUB_OFFLINE", "1")];
    let run = |model: &str| {
        ternion()
            .args(["run", "-m", model, "-p", "hi", "-n", "2", "-t", "1"])
            .envs(env)
            .output()
            .unwrap()
    };
    let o = run("owner/repo/tiny.gguf");
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = run("owner/repo/other.gguf");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("owner/repo/other.gguf")
            && err.contains("not in the local Hugging Face cache")
            && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
}

#[test]
fn hf_token_is_sent_to_the_hub() {
    let hub = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hub.local_addr().unwrap());
    let seen = std::thread::spawn(move || {
        let (mut conn, _) = hub.accept().unwrap();
        let mut head = String::new();
        let mut r = BufReader::new(conn.try_clone().unwrap());
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .unwrap();
        head
    });
    let home = tmp_dir().join("hf-empty");
    let o = ternion()
        .args(["run", "-m", "owner/repo/x.gguf", "-p", "hi"])
        .env("HF_HOME", &home)
        .env("HF_ENDPOINT", &endpoint)
        .env("HF_TOKEN", "hf_secret_test_token")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    let head = seen.join().unwrap().to_ascii_lowercase();
    assert!(head.contains("/owner/repo/resolve/main/x.gguf"), "{head}");
    assert!(
        head.contains("authorization: bearer hf_secret_test_token"),
        "{head}"
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("could not download owner/repo/x.gguf"),
        "{err}"
    );
}

/// The seed line `seed: N` of a run's standard error.
fn seed_of(o: &Output) -> u64 {
    let err = text(&o.stderr);
    err.lines()
        .find_map(|l| l.strip_prefix("seed: "))
        .unwrap_or_else(|| panic!("no seed line: {err}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn seeds_are_random_by_default_printed_and_reproducible() {
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", tiny(), "-p", "Once upon", "-n", "12"];
        args.extend_from_slice(&["--ignore-eos", "--json", "-t", "1"]);
        args.extend_from_slice(extra);
        ok(&args)
    };
    let (a, b) = (run(&[]), run(&["--seed", "-1"]));
    let (sa, sb) = (seed_of(&a), seed_of(&b));
    assert_ne!(sa, sb, "two default runs drew the same seed");
    let again = run(&["--seed", &sa.to_string()]);
    assert_eq!(seed_of(&again), sa);
    assert_eq!(last_json(&again)["tokens"], last_json(&a)["tokens"]);
    let err = fails(&["run", "-m", tiny(), "-p", "x", "--seed", "-2"], &[]);
    assert!(err.contains("--seed"), "{err}");
}

#[test]
fn prompts_come_from_text_files_and_stdin_alike() {
    let prompt = "The quick brown fox\njumps over";
    let args = |src: &[&str]| {
        let mut a = vec!["run", "-m", tiny(), "-n", "1", "--json", "-t", "1"];
        a.extend_from_slice(src);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let ids = |o: Output| {
        assert!(o.status.success(), "{}", text(&o.stderr));
        last_json(&o)["prompt_tokens"].clone()
    };
    let file = tmp_dir().join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let f = file.to_str().unwrap();
    let run = |src: &[&str], stdin: &str| {
        let a = args(src);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        with_stdin(&a, stdin, &[])
    };
    let want = ids(run(&["-p", prompt], ""));
    assert!(want.as_array().unwrap().len() > 4);
    assert_eq!(ids(run(&["-f", f], "")), want);
    assert_eq!(ids(run(&["--file", "-"], prompt)), want);
    assert_eq!(ids(run(&["-p", "-"], prompt)), want);
    // `-p` is prompt text everywhere: `bench` takes its prompt length as -P.
    let o = ternion()
        .args(["bench", "-m", tiny(), "-p", "16"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("-p"), "{}", text(&o.stderr));
}

#[test]
fn auto_backend_skips_cpu_adapters_and_threads_default_to_the_cores() {
    let o = ok(&[
        "run",
        "-m",
        tiny(),
        "-p",
        "hi",
        "-n",
        "2",
        "--backend",
        "auto",
    ]);
    let err = text(&o.stderr);
    match err.lines().find(|l| l.starts_with("GPU: ")) {
        Some(gpu) => {
            let lower = gpu.to_ascii_lowercase();
            for soft in ["llvmpipe", "lavapipe", "swiftshader"] {
                assert!(!lower.contains(soft), "auto took a CPU-type adapter: {gpu}");
            }
        }
        None => assert!(err.contains("using the CPU backend"), "{err}"),
    }
    let cores = std::thread::available_parallelism().unwrap().get();
    let bench = last_json(&ok(&[
        "bench",
        "-m",
        tiny(),
        "-P",
        "8",
        "-n",
        "2",
        "--json",
    ]));
    let threads = bench["threads"].as_u64().unwrap() as usize;
    assert!(
        (1..=cores).contains(&threads),
        "{threads} threads, {cores} cores"
    );
    let many = (cores * 4).to_string();
    let o = ok(&["run", "-m", tiny(), "-p", "hi", "-n", "1", "-t", &many]);
    assert!(
        text(&o.stderr).contains(&format!("-t {many} is more threads than")),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn inspect_lists_every_problem_run_would_refuse() {
    let dir = tmp_dir();
    let write = |name: &str, r: &Raw| {
        let p = dir.join(name);
        std::fs::write(&p, r.bytes()).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let good = write("micro-good.gguf", &micro_model());
    let out = text(&ok(&["inspect", &good]).stdout);
    assert!(out.contains("OK: the model loads"), "{out}");

    let mut r = micro_model();
    r.remove_tensor("blk.0.ffn_down.weight");
    r.set("tokenizer.ggml.bos_token_id", u32v(4));
    r.set("tokenizer.ggml.eos_token_id", u32v(1000));
    r.layout();
    let broken = write("micro-broken.gguf", &r);
    let err = fails(&["inspect", &broken], &[]);
    assert!(err.contains("3 problem(s)"), "{err}");
    assert!(err.contains("blk.0.ffn_down.weight"), "{err}");
    assert!(
        err.contains("tokenizer.ggml.bos_token_id = 4 is past the vocabulary"),
        "{err}"
    );
    assert!(err.contains("tokenizer.ggml.eos_token_id = 1000"), "{err}");

    // A BOS id past the vocabulary alone: `run` refuses it too (it is not dropped).
    let mut r = micro_model();
    r.set("tokenizer.ggml.bos_token_id", u32v(4));
    r.layout();
    let bos = write("micro-bos.gguf", &r);
    assert!(fails(&["inspect", &bos], &[]).contains("bos_token_id = 4"));
    let err = fails(&["run", "-m", &bos, "-p", "a", "-n", "1"], &[]);
    assert!(
        err.contains("bos_token_id = 4 is past the vocabulary"),
        "{err}"
    );

    // More tokens than embedding rows, and an unsupported architecture.
    let mut r = micro_model();
    r.set(
        "tokenizer.ggml.tokens",
        str_arr(&["<unk>", "<s>", "</s>", "\u{2581}a", "b", "c", "d", "e", "f"]),
    );
    r.layout();
    let big = write("micro-vocab.gguf", &r);
    let err = fails(&["inspect", &big], &[]);
    assert!(
        err.contains("the vocabulary has 9 tokens but the embedding only"),
        "{err}"
    );
    let mut r = micro_model();
    r.set("general.architecture", strv("mamba"));
    r.layout();
    let arch = write("micro-arch.gguf", &r);
    assert!(fails(&["inspect", &arch], &[]).contains("mamba"));
}

#[test]
fn chat_takes_multi_line_input_resets_and_shifts_a_full_context() {
    let input = "hello\n\nline one \\\ncontinued\n\"\"\"\nblock a\n\nblock b\n\"\"\"\n/reset\n\
                 again\nmore words here to fill the context up\n\
                 and more words to fill it up again\nyet another message that is long\n\
                 /exit\nnever sent\n";
    let o = with_stdin(
        &[
            "chat",
            "-m",
            tiny(),
            "-c",
            "96",
            "-n",
            "16",
            "-t",
            "1",
            "--seed",
            "3",
        ],
        input,
        &[],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    // hello, the joined line, the block, again, and the three long ones; the empty line
    // ends nothing, /exit ends before "never sent".
    assert!(err.contains("chat ended: 7 replies"), "{err}");
    assert!(err.contains("[conversation cleared]"), "{err}");
    assert!(
        err.contains("[context full: dropped the 1 oldest turn(s); the system prompt is kept]"),
        "{err}"
    );
    // A message too long for the context alone is refused, and the chat goes on.
    let long = "word ".repeat(200);
    let o = with_stdin(
        &["chat", "-m", tiny(), "-c", "64", "-n", "8", "-t", "1"],
        &format!("{long}\nshort\n"),
        &[],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("does not fit the context of 64 tokens"),
        "{err}"
    );
    assert!(err.contains("chat ended: 1 replies"), "{err}");
}

#[test]
fn chat_saves_the_conversation_and_holds_every_reply_to_the_constraint() {
    let saved = tmp_dir().join("chat.json");
    let saved_arg = saved.to_str().unwrap();
    let chat = |constraint: &[&str], input: &str| {
        let mut args = vec!["chat", "-m", tiny(), "-n", "24", "-t", "1", "--seed", "5"];
        args.extend_from_slice(&["--temperature", "1", "-s", "Be brief."]);
        args.extend_from_slice(constraint);
        let o = with_stdin(&args, input, &[]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
        (err, v.as_array().unwrap().clone())
    };
    let input = format!("hello\n/save\nagain\n/save {saved_arg}\n");
    let (err, messages) = chat(&["--regex", "[A-Z]{2}-[0-9]{3}"], &input);
    assert!(err.contains("[usage: /save FILE]"), "{err}");
    assert!(
        err.contains(&format!("[saved 5 messages to {saved_arg}]")),
        "{err}"
    );
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(messages[0]["content"], "Be brief.");
    assert_eq!(messages[3]["content"], "again");
    for m in [&messages[2], &messages[4]] {
        let b = m["content"].as_str().unwrap().as_bytes();
        assert!(
            b.len() == 6 && b[..2].iter().all(u8::is_ascii_uppercase),
            "{m}"
        );
        assert!(b[2] == b'-' && b[3..].iter().all(u8::is_ascii_digit), "{m}");
    }
    let input = format!("one\ntwo\nthree\n/save {saved_arg}\n");
    let (_, messages) = chat(&["--json-object"], &input);
    assert_eq!(messages.len(), 7);
    for m in messages.iter().filter(|m| m["role"] == "assistant") {
        let reply: Value = serde_json::from_str(m["content"].as_str().unwrap()).unwrap();
        assert!(reply.is_object(), "{m}");
    }
    let o = with_stdin(&["chat", "-m", tiny(), "--regex", "(x"], "hi\n", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("invalid grammar"));
}

#[test]
fn tokenize_reads_standard_input() {
    let a = ok(&["tokenize", "-m", tiny(), "hello world"]);
    let b = with_stdin(&["tokenize", "-m", tiny(), "-"], "hello world", &[]);
    assert!(b.status.success());
    assert_eq!(text(&a.stdout), text(&b.stdout));
    let mut s = String::new();
    BufReader::new(&b.stdout[..])
        .read_to_string(&mut s)
        .unwrap();
    assert!(s.starts_with('['), "{s}");
}
