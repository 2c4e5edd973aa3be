//! What the server tests share: the `ternion` binary, a tiny model, a running server, and
//! HTTP helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

// ---------------------------------------------------------------- fixtures

use ternion_testkit::shared as support_shared;

pub fn shared() -> PathBuf {
    support_shared::shared_path("vocab/ggml-vocab-llama3.gguf");
    support_shared::shared_path("")
}

/// The `ternion` binary: `TERNION_BIN`, or built with cargo into this test's target dir.
pub fn ternion_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("TERNION_BIN") {
            return PathBuf::from(p);
        }
        // <target>/<profile dir>/deps/<this test>
        let exe = std::env::current_exe().expect("the test's own path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>");
        let target = profile_dir.parent().expect("the target directory");
        let profile = match profile_dir.file_name().and_then(|s| s.to_str()) {
            Some("debug") => "dev",
            Some(p) => p,
            None => "dev",
        };
        let bin = profile_dir.join(format!("ternion{}", std::env::consts::EXE_SUFFIX));
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        // Built after the last source change (e.g. by `cargo test --workspace`): use it as
        // is; a build here would resolve features differently and rebuild for nothing.
        if modified(&bin).is_some_and(|b| b >= newest_source(&root)) {
            return bin;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = root.join("Cargo.toml");
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "ternion-cli", "--bin", "ternion"])
            .args(["--profile", profile, "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", target)
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the ternion binary failed");
        assert!(bin.exists(), "no ternion binary at {}", bin.display());
        bin
    })
}

pub fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the workspace's manifests and Rust sources.
pub fn newest_source(root: &Path) -> std::time::SystemTime {
    pub fn walk(dir: &Path, newest: &mut std::time::SystemTime) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, newest);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "toml") {
                if let Some(t) = modified(&p) {
                    *newest = (*newest).max(t);
                }
            }
        }
    }
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for f in ["Cargo.toml", "Cargo.lock"] {
        if let Some(t) = modified(&root.join(f)) {
            newest = newest.max(t);
        }
    }
    walk(&root.join("crates"), &mut newest);
    newest
}

pub fn tmp_dir() -> PathBuf {
    ternion_testkit::scratch::dir("ternion-server")
}

/// A tiny BitNet b1.58 model with a truncated Llama-3 vocabulary, written once.
pub fn tiny_model() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = tmp_dir().join("tiny.gguf");
        let vocab = shared().join("vocab/ggml-vocab-llama3.gguf");
        let o = Command::new(ternion_bin())
            .args(["synth", "--shape", "tiny", "--type", "i2_s", "--vocab"])
            .arg(&vocab)
            .args(["--vocab-limit", "4000", "--out"])
            .arg(&out)
            .output()
            .expect("ternion synth runs");
        assert!(
            o.status.success(),
            "ternion synth failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    })
}

/// A running `ternion serve`, killed when dropped.
pub struct Server {
    /// The server process.
    pub child: Child,
    /// host:port.
    pub addr: String,
    /// Standard error so far (the server's log lines included).
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_env(extra, &[])
    }

    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(ternion_bin())
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--model")
            .arg(tiny_model())
            .args(["--port", "0", "--threads", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ternion serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let addr = loop {
            match lines.next() {
                Some(Ok(l)) => {
                    seen.push_str(&l);
                    seen.push('\n');
                    if let Some(i) = l.find("http://") {
                        let rest = &l[i + "http://".len()..];
                        break rest.split_whitespace().next().unwrap().to_string();
                    }
                }
                _ => {
                    let _ = child.kill();
                    panic!("ternion serve did not report its address:\n{seen}")
                }
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        let log = std::sync::Arc::new(std::sync::Mutex::new(seen));
        let sink = log.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&l);
                s.push('\n');
            }
        });
        let s = Server { child, addr, log };
        let t0 = Instant::now();
        // 401: the health check needs the key (--api-key-all).
        while !matches!(get(&s.url("/health")).0, 200 | 401) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "never became healthy"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = post_raw(&self.url(path), &body.to_string());
        let v = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("answer is not JSON ({e}): {text}"));
        (status, v)
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = get(&self.url("/metrics"));
        assert_eq!(status, 200);
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(' '))
                    .map(|v| v.trim().parse::<f64>().unwrap())
            })
            .unwrap_or_else(|| panic!("metric {name} missing from\n{text}"))
    }

    /// What the server wrote to standard error so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

pub fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("HTTP transport error: {e}"),
    }
}

pub fn get(url: &str) -> (u16, String) {
    match agent().get(url).call() {
        Err(ureq::Error::Transport(_)) => (0, String::new()),
        r => answer(r),
    }
}

pub fn post_raw(url: &str, body: &str) -> (u16, String) {
    answer(
        agent()
            .post(url)
            .set("Content-Type", "application/json")
            .send_string(body),
    )
}

/// POSTs a streaming request and returns every `data:` payload, `[DONE]` included.
pub fn post_stream(server: &Server, path: &str, body: &Value) -> Vec<String> {
    let r = agent()
        .post(&server.url(path))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
        .expect("streaming request succeeds");
    assert_eq!(r.status(), 200);
    assert!(
        r.content_type().starts_with("text/event-stream"),
        "content type {}",
        r.content_type()
    );
    let mut out = Vec::new();
    for line in BufReader::new(r.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            out.push(d.to_string());
        }
    }
    out
}

pub fn assert_error(v: &Value, code_hint: &str) {
    let e = &v["error"];
    assert!(e["message"].is_string(), "error shape: {v}");
    assert!(e["type"].is_string(), "error shape: {v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if !code_hint.is_empty() {
        assert_eq!(e["code"], code_hint, "{v}");
    }
}

pub fn assert_usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    let p = u["prompt_tokens"].as_u64().expect("prompt_tokens");
    let c = u["completion_tokens"].as_u64().expect("completion_tokens");
    assert_eq!(u["total_tokens"].as_u64(), Some(p + c), "{v}");
    (p, c)
}

pub fn chat_body(content: &str, max_tokens: u64) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Runs `tests/SCRIPT` with python3 against `s` (`http://ADDR` first, then `args`) and
/// checks that it prints `done` and succeeds.
pub fn python_checks(s: &Server, script: &str, args: &[&str], done: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let o = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}", s.addr))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains(done),
        "{} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}
