//! `ternion serve`'s access rules and records through the real binary on 127.0.0.1: the
//! API key (with the official `openai` client), CORS preflights, the log line of each
//! request, `/v1/models`' context length, and a model that cannot be served failing
//! before the port opens.

use ternion_testkit::gguf_gen;
#[path = "support/python.rs"]
mod python;
#[path = "support/server.rs"]
mod server;

use std::process::Command;
use std::time::{Duration, Instant};

use gguf_gen::*;
use serde_json::{json, Value};
use server::*;

const KEY: &str = "sk-test-3f9a";

fn with_key(req: ureq::Request, key: &str) -> (u16, String) {
    let r = req.set("Authorization", &format!("Bearer {key}"));
    answer(r.call())
}

fn assert_401(status: u16, body: &str) {
    assert_eq!(status, 401, "{body}");
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
}

#[test]
fn api_key_is_required_and_the_openai_client_passes_with_it() {
    let s = Server::start(&["--api-key", KEY]);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let (status, text) = post_raw(&s.url("/v1/completions"), &body);
    assert_401(status, &text);
    let (status, text) = with_key(agent().get(&s.url("/v1/models")), "sk-test-3f9b");
    assert_401(status, &text);
    let (status, _) = with_key(agent().get(&s.url("/v1/models")), KEY);
    assert_eq!(status, 200);
    // Probes and scrapers need no key unless --api-key-all.
    assert_eq!(get(&s.url("/health")).0, 200);
    assert_eq!(get(&s.url("/metrics")).0, 200);
    if python::openai_available() {
        python_checks(&s, "openai_auth.py", &["tiny", KEY], "all checks passed");
    }
}

#[test]
fn api_key_from_the_environment_and_for_every_route() {
    let s = Server::start_env(&["--api-key-all"], &[("TERNION_API_KEY", KEY)]);
    for path in ["/health", "/metrics", "/v1/models"] {
        let (status, text) = get(&s.url(path));
        assert_401(status, &text);
        assert_eq!(with_key(agent().get(&s.url(path)), KEY).0, 200, "{path}");
    }
}

/// An OPTIONS preflight from `origin`; the answer's status and headers.
fn preflight(s: &Server, origin: &str) -> (u16, Vec<(String, String)>) {
    let r = agent()
        .request("OPTIONS", &s.url("/v1/chat/completions"))
        .set("Origin", origin)
        .set("Access-Control-Request-Method", "POST")
        .set(
            "Access-Control-Request-Headers",
            "authorization, content-type",
        )
        .call()
        .expect("the preflight is answered with a success");
    let headers = r
        .headers_names()
        .into_iter()
        .map(|n| (n.clone(), r.header(&n).unwrap_or("").to_owned()))
        .collect();
    (r.status(), headers)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[test]
fn cors_preflight_and_answers_name_the_allowed_origins() {
    let s = Server::start(&[
        "--cors-origin",
        "http://a.example",
        "--cors-origin",
        "http://b.example:3000",
        "--api-key",
        KEY,
    ]);
    // A preflight carries no key: it is answered all the same.
    let (status, h) = preflight(&s, "http://b.example:3000");
    assert!(matches!(status, 200 | 204), "{status}");
    assert_eq!(
        header(&h, "access-control-allow-origin"),
        Some("http://b.example:3000"),
        "{h:?}"
    );
    let methods = header(&h, "access-control-allow-methods").unwrap_or("");
    assert!(methods.contains("POST"), "{h:?}");
    let allowed = header(&h, "access-control-allow-headers")
        .unwrap_or("")
        .to_ascii_lowercase();
    assert!(
        allowed.contains("authorization") && allowed.contains("content-type"),
        "{h:?}"
    );
    let (_, h) = preflight(&s, "http://evil.example");
    assert_eq!(header(&h, "access-control-allow-origin"), None, "{h:?}");
    // The answer itself carries the origin too.
    let r = agent()
        .get(&s.url("/v1/models"))
        .set("Origin", "http://a.example")
        .set("Authorization", &format!("Bearer {KEY}"))
        .call()
        .unwrap();
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://a.example")
    );

    let any = Server::start(&["--cors-origin", "*"]);
    let (_, h) = preflight(&any, "http://anywhere.example");
    assert_eq!(
        header(&h, "access-control-allow-origin"),
        Some("*"),
        "{h:?}"
    );
}

#[test]
fn every_request_gets_one_log_line() {
    let s = Server::start(&["--ctx", "256"]);
    let r = agent()
        .post(&s.url("/v1/completions"))
        .set("Content-Type", "application/json")
        .send_string(
            &json!({"prompt": "Hello there", "max_tokens": 3, "ignore_eos": true}).to_string(),
        )
        .unwrap();
    let id = r.header("x-request-id").expect("x-request-id").to_owned();
    let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let (models_status, models) = get(&s.url("/v1/models"));
    assert_eq!(models_status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["context_length"], 256, "{models}");

    let line = log_line(&s, &format!("request_id={id}"));
    for want in [
        "INFO".to_string(),
        "method=POST".into(),
        "route=/v1/completions".into(),
        "status=200".into(),
        format!("prompt_tokens={prompt}"),
        "completion_tokens=3".into(),
        "ttft_ms=".into(),
        "total_ms=".into(),
    ] {
        assert!(line.contains(&want), "{want} missing from: {line}");
    }
    log_line(&s, "route=/v1/models status=200");
}

/// The first line of the server's log containing `needle`, waited for (standard error is
/// read on a thread of its own, so a line may show up just after its answer).
fn log_line(s: &Server, needle: &str) -> String {
    let t0 = Instant::now();
    loop {
        let log = s.log();
        if let Some(l) = log.lines().find(|l| l.contains(needle)) {
            return l.to_owned();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no log line with {needle}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_model_that_cannot_be_served_fails_before_listening() {
    let dir = ternion_testkit::scratch::dir("ternion-access");
    let mut r = micro_model();
    r.set("general.architecture", strv("mamba"));
    r.layout();
    let unsupported = dir.join("mamba.gguf");
    std::fs::write(&unsupported, r.bytes()).unwrap();
    let mut r = micro_model();
    r.set("tokenizer.ggml.bos_token_id", u32v(7));
    r.layout();
    let bad_bos = dir.join("bos.gguf");
    std::fs::write(&bad_bos, r.bytes()).unwrap();
    let folder = dir.join("folder");
    std::fs::create_dir_all(&folder).unwrap();
    for (model, says) in [
        (&unsupported, "mamba"),
        (&bad_bos, "bos_token_id = 7 is past the vocabulary"),
        (&folder, "is a directory"),
    ] {
        let o = Command::new(ternion_bin())
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--port", "0", "--threads", "1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("listening on"), "{err}");
    }
}

#[test]
fn bench_serve_sends_the_api_key_to_a_running_server() {
    let s = Server::start(&["--api-key", KEY, "--ctx", "64"]);
    let url = format!("http://{}", s.addr);
    let bench = |key: Option<&str>| {
        let mut c = Command::new(ternion_bin());
        c.args([
            "bench-serve",
            "--url",
            &url,
            "--streams",
            "1",
            "-P",
            "4",
            "-n",
            "2",
        ])
        .arg("--json")
        .env_remove("TERNION_API_KEY");
        if let Some(k) = key {
            c.args(["--api-key", k]);
        }
        c.output().unwrap()
    };
    let o = bench(Some(KEY));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let v: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(v["runs"][0]["tokens"], 2, "{v}");
    let o = bench(None);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"));
}
