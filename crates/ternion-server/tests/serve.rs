//! End-to-end tests of `ternion serve`: the real binary on 127.0.0.1 (a free port), a tiny
//! synthetic BitNet model, and raw HTTP.
//!
//! The `ternion` binary is built (or found up to date) in this test's target directory
//! once per run; set `TERNION_BIN` to use another one. `../shared` (beside the repository)
//! must hold the Llama-3 vocabulary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "support/server.rs"]
mod server;

#[path = "support/python.rs"]
mod python;

use server::*;

// ---------------------------------------------------------------- tests

#[test]
fn health_models_and_metrics() {
    let s = Server::start(&[]);
    let (status, body) = get(&s.url("/health"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = get(&s.url("/v1/models"));
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny");
    assert_eq!(v["data"][0]["object"], "model");
    let (status, _) = get(&s.url("/v1/models/tiny"));
    assert_eq!(status, 200);
    let (status, _) = get(&s.url("/v1/models/other"));
    assert_eq!(status, 404);
    let (status, text) = get(&s.url("/metrics"));
    assert_eq!(status, 200);
    for name in [
        "ternion_queue_length",
        "ternion_active_sequences",
        "ternion_generated_tokens_total",
        "ternion_tokens_per_second",
        "ternion_time_to_first_token_seconds_bucket",
        "ternion_time_to_first_token_seconds_count",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    let (status, _) = get(&s.url("/nowhere"));
    assert_eq!(status, 404);
}

#[test]
fn chat_completion_whole_and_streamed() {
    let s = Server::start(&[]);
    let (status, v) = s.post("/v1/chat/completions", &chat_body("Hello there", 12));
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["model"], "tiny");
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    assert_eq!(c["message"]["role"], "assistant");
    let whole = c["message"]["content"].as_str().unwrap().to_string();
    let finish = c["finish_reason"].as_str().unwrap().to_string();
    assert!(finish == "stop" || finish == "length", "{v}");
    let (p, n) = assert_usage(&v);
    assert!(p > 3 && n <= 12, "{v}");
    assert_eq!(s.metric("ternion_time_to_first_token_seconds_count"), 1.0);

    let mut body = chat_body("Hello there", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events = post_stream(&s, "/v1/chat/completions", &body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finishes = Vec::new();
    for ch in &chunks[..chunks.len() - 1] {
        assert_eq!(ch["object"], "chat.completion.chunk");
        assert_eq!(ch["id"], id);
        assert_eq!(ch["model"], "tiny");
        assert!(
            ch["usage"].is_null(),
            "usage must be null before the end: {ch}"
        );
        let choice = &ch["choices"][0];
        assert_eq!(choice["index"], 0);
        if let Some(t) = choice["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finishes.push(f.to_string());
        }
    }
    assert_eq!(text, whole);
    assert_eq!(finishes, vec![finish]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(assert_usage(last), (p, n));

    // Without include_usage there is no usage field and no usage chunk.
    body["stream_options"] = Value::Null;
    let events = post_stream(&s, "/v1/chat/completions", &body);
    for e in &events[..events.len() - 1] {
        let ch: Value = serde_json::from_str(e).unwrap();
        assert!(ch.get("usage").is_none(), "{ch}");
        assert_eq!(ch["choices"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn completions_whole_and_streamed() {
    let s = Server::start(&[]);
    let body = json!({"prompt": "The capital of France is", "max_tokens": 10, "temperature": 0});
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "tiny");
    let c = &v["choices"][0];
    assert_eq!(c["index"], 0);
    let whole = c["text"].as_str().unwrap().to_string();
    assert_usage(&v);

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let events = post_stream(&s, "/v1/completions", &sb);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut text = String::new();
    for e in &events[..events.len() - 1] {
        let ch: Value = serde_json::from_str(e).unwrap();
        assert_eq!(ch["object"], "text_completion");
        text.push_str(ch["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, whole);

    // A prompt given as token ids (in a list of one) works too.
    let ids = json!({"prompt": [[1, 2, 3]], "max_tokens": 3});
    let (status, v) = s.post("/v1/completions", &ids);
    assert_eq!(status, 200, "{v}");
    assert_eq!(assert_usage(&v).0, 3);
}

#[test]
fn greedy_output_equals_ternion_run() {
    greedy_equals_run(&[]);
}

/// Prompts fed in small chunks over several engine steps give the same tokens.
#[test]
fn greedy_output_with_a_small_prompt_budget_equals_ternion_run() {
    greedy_equals_run(&["--prefill-per-step", "4"]);
}

fn greedy_equals_run(server_args: &[&str]) {
    let s = Server::start(server_args);
    let prompt = "Once upon a time, in a quiet village,";
    let o = Command::new(ternion_bin())
        .arg("run")
        .arg("--model")
        .arg(tiny_model())
        .args([
            "--prompt",
            prompt,
            "-n",
            "24",
            "--temperature",
            "0",
            "--json",
        ])
        .args(["--threads", "1"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let run: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert!(!run["tokens"].as_array().unwrap().is_empty());

    let body = json!({
        "model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0,
        "return_token_ids": true,
    });
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["prompt_token_ids"], run["prompt_tokens"]);
    assert_eq!(v["choices"][0]["token_ids"], run["tokens"]);
    assert_eq!(v["choices"][0]["text"], run["text"]);
    assert_eq!(v["choices"][0]["finish_reason"], run["finish_reason"]);

    // Streamed: the same text.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let events = post_stream(&s, "/v1/completions", &sb);
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            let ch: Value = serde_json::from_str(e).unwrap();
            ch["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, run["text"].as_str().unwrap());
    // With return_token_ids, one chunk per generated token carries its id.
    let ids: Vec<Value> = events[..events.len() - 1]
        .iter()
        .filter_map(|e| {
            let ch: Value = serde_json::from_str(e).unwrap();
            let ids = ch["choices"][0]["token_ids"].as_array()?.clone();
            assert_eq!(ids.len(), 1, "{ch}");
            Some(ids[0].clone())
        })
        .collect();
    assert_eq!(Value::Array(ids), run["tokens"]);
}

#[test]
fn sixteen_concurrent_clients_are_all_answered() {
    let s = Server::start(&["--max-active", "4", "--queue", "32"]);
    let prompts = ["Tell me a story", "Why is the sky blue?"];
    // One at a time first: what each prompt gives greedily.
    let expected: Vec<Value> = prompts
        .iter()
        .map(|p| {
            let (status, v) = s.post("/v1/chat/completions", &chat_body(p, 24));
            assert_eq!(status, 200, "{v}");
            v["choices"][0]["message"]["content"].clone()
        })
        .collect();
    let addr = s.url("/v1/chat/completions");
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let url = addr.clone();
            let body = chat_body(prompts[i % 2], 24);
            std::thread::spawn(move || {
                let (status, text) = post_raw(&url, &body.to_string());
                (i, status, text)
            })
        })
        .collect();
    for h in handles {
        let (i, status, text) = h.join().unwrap();
        assert_eq!(status, 200, "client {i}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        // Interleaved decoding must not change any sequence's tokens.
        assert_eq!(
            v["choices"][0]["message"]["content"],
            expected[i % 2],
            "client {i}"
        );
    }
    // The engine retires a sequence just after its last event reaches the client.
    wait_for("active sequences back to 0", || {
        s.metric("ternion_active_sequences") == 0.0
            && s.metric("ternion_sequences_finished_total") == 18.0
    });
    assert_eq!(s.metric("ternion_queue_length"), 0.0);
    let generated = s.metric("ternion_generated_tokens_total");
    assert!(generated > 0.0);
    // Concurrent sequences shared forward passes: fewer passes than tokens generated.
    let passes = s.metric("ternion_forward_passes_total");
    assert!(passes < generated, "{passes} passes for {generated} tokens");
    assert_eq!(s.metric("ternion_kv_pages_in_use"), 0.0);
}

/// Sends a streaming request over a raw socket and waits for `chunks` data events.
fn open_stream(s: &Server, body: &Value, chunks: usize) -> BufReader<TcpStream> {
    let mut sock = TcpStream::connect(&s.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = body.to_string();
    write!(
        sock,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        s.addr,
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(sock);
    let mut seen = 0;
    let mut line = String::new();
    while seen < chunks {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream ended early");
        if line.starts_with("data: ") {
            seen += 1;
        }
    }
    r
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn client_disconnect_cancels_and_frees_the_sequence() {
    let s = Server::start(&["--ctx", "4096"]);
    let mut body = chat_body("Write a very long essay.", 4000);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let r = open_stream(&s, &body, 3);
    assert_eq!(s.metric("ternion_active_sequences"), 1.0);
    assert!(s.metric("ternion_kv_pages_in_use") >= 1.0);
    assert!(s.metric("ternion_kv_pages_capacity") >= 4096.0 / 32.0);
    drop(r); // closes the socket mid-stream
    wait_for("the sequence and its KV pages are freed", || {
        s.metric("ternion_active_sequences") == 0.0 && s.metric("ternion_kv_pages_in_use") == 0.0
    });
    assert_eq!(s.metric("ternion_sequences_cancelled_total"), 1.0);
    assert_eq!(s.metric("ternion_sequences_finished_total"), 0.0);
    let generated = s.metric("ternion_generated_tokens_total");
    assert!(generated < 4000.0, "generated {generated} tokens");
    // The server still serves.
    let (status, v) = s.post("/v1/chat/completions", &chat_body("Hi", 4));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn exhausted_kv_pool_is_a_clear_error_and_frees_its_pages() {
    // Two pages of 32 positions: a sequence that outgrows them ends with an error.
    let s = Server::start(&["--ctx", "4096", "--kv-pages", "2"]);
    assert_eq!(s.metric("ternion_kv_pages_capacity"), 2.0);
    let mut body = chat_body("Write a very long essay.", 200);
    body["ignore_eos"] = json!(true);
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 503, "{v}");
    assert_error(&v, "");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("KV cache pool exhausted"), "{msg}");
    wait_for("pages returned", || {
        s.metric("ternion_kv_pages_in_use") == 0.0
    });
    assert_eq!(s.metric("ternion_sequences_failed_total"), 1.0);
    // A request that fits is served.
    let (status, v) = s.post("/v1/chat/completions", &chat_body("Hi", 4));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn queue_full_is_429() {
    let s = Server::start(&["--max-active", "1", "--queue", "1"]);
    let mut long = chat_body("Keep talking.", 4000);
    long["stream"] = json!(true);
    long["ignore_eos"] = json!(true);
    let first = open_stream(&s, &long, 2); // occupies the only slot
    let url = s.url("/v1/chat/completions");
    let queued =
        std::thread::spawn(move || post_raw(&url, &chat_body("Wait for me", 4).to_string()));
    wait_for("one request queued", || {
        s.metric("ternion_queue_length") == 1.0
    });
    let (status, v) = s.post("/v1/chat/completions", &chat_body("No room", 4));
    assert_eq!(status, 429, "{v}");
    assert_error(&v, "queue_full");
    assert_eq!(s.metric("ternion_requests_rejected_queue_full_total"), 1.0);
    drop(first); // frees the slot: the queued request runs
    let (status, text) = queued.join().unwrap();
    assert_eq!(status, 200, "{text}");
}

#[test]
fn bad_requests_get_openai_errors() {
    let s = Server::start(&[]);
    let chat = s.url("/v1/chat/completions");

    let (status, text) = post_raw(&chat, "{\"messages\": [");
    assert_eq!(status, 400, "{text}");
    assert_error(&serde_json::from_str(&text).unwrap(), "invalid_json");
    let (status, text) = post_raw(&chat, "{\"messages\": \"not a list\"}");
    assert_eq!(status, 400, "{text}");

    let mut b = chat_body("hi", 4);
    b["n"] = json!(9);
    let (status, v) = s.post("/v1/chat/completions", &b);
    assert_eq!(status, 400, "{v}");
    assert_error(&v, "invalid_value");
    assert_eq!(v["error"]["param"], "n");

    let mut b = chat_body("hi", 4);
    b["model"] = json!("gpt-4o");
    let (status, v) = s.post("/v1/chat/completions", &b);
    assert_eq!(status, 404, "{v}");
    assert_error(&v, "model_not_found");
    let (status, v) = s.post("/v1/completions", &json!({"model": "x", "prompt": "a"}));
    assert_eq!(status, 404, "{v}");

    for (field, value) in [
        ("temperature", json!(-0.5)),
        ("temperature", json!(7)),
        ("top_p", json!(0)),
        ("top_p", json!(1.5)),
        ("min_p", json!(2)),
        ("presence_penalty", json!(3)),
        ("frequency_penalty", json!(-3)),
        ("repetition_penalty", json!(0)),
        ("max_tokens", json!(0)),
        ("temperature", json!("warm")),
    ] {
        let mut b = chat_body("hi", 4);
        b[field] = value.clone();
        let (status, v) = s.post("/v1/chat/completions", &b);
        assert_eq!(status, 400, "{field}={value}: {v}");
        assert_error(&v, "");
    }

    let (status, v) = s.post("/v1/chat/completions", &json!({"messages": []}));
    assert_eq!(status, 400, "{v}");
    let (status, v) = s.post("/v1/completions", &json!({"prompt": [999999]}));
    assert_eq!(status, 400, "{v}");

    // Context overflow: the numbers are in the message.
    let (status, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 5000}),
    );
    assert_eq!(status, 400, "{v}");
    assert_error(&v, "context_length_exceeded");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("4096") && msg.contains("5000"),
        "message lacks the numbers: {msg}"
    );
    assert_eq!(s.metric("ternion_requests_total"), 0.0);
}

#[test]
fn prompt_longer_than_the_context_is_400() {
    let s = Server::start(&["--ctx", "32"]);
    let long = "word ".repeat(100);
    let (status, v) = s.post("/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(status, 400, "{v}");
    assert_error(&v, "context_length_exceeded");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("32"), "{msg}");
    // Without max_tokens the completion gets the rest of the context.
    let (status, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "hi", "ignore_eos": true}),
    );
    assert_eq!(status, 200, "{v}");
    let (p, c) = assert_usage(&v);
    assert_eq!(p + c, 32, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[test]
fn oversize_body_is_413() {
    let s = Server::start(&[]);
    let big = format!(
        "{{\"model\":\"tiny\",\"prompt\":\"{}\"}}",
        "a".repeat(2 << 20)
    );
    // Announced length over the limit: refused before the body is sent.
    let mut sock = TcpStream::connect(&s.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        sock,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        big.len()
    )
    .unwrap();
    let mut head = [0u8; 512];
    let n = sock.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.contains("request_too_large"), "{head}");
    // A chunked body (no length announced) is cut off at the limit.
    let r = agent()
        .post(&s.url("/v1/completions"))
        .set("Content-Type", "application/json")
        .send(std::io::Cursor::new(big.into_bytes()));
    match r {
        Err(ureq::Error::Status(413, r)) => {
            let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
            assert_error(&v, "request_too_large");
        }
        // The server may close before the whole body is written.
        Err(ureq::Error::Transport(_)) => {}
        other => panic!("expected 413, got {:?}", other.map(|r| r.status())),
    }
}

#[test]
fn stop_sequences_end_generation_and_are_not_sent() {
    let s = Server::start(&[]);
    let mut body = json!({
        "prompt": "Numbers:", "max_tokens": 40, "temperature": 0, "ignore_eos": true,
    });
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let full = v["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the middle of the greedy text.
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() > 12, "text too short: {full:?}");
    let (a, b) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 3].0);
    let stop = full[a..b].to_string();
    let expected = &full[..full.find(&stop).unwrap()];
    body["stop"] = json!(["never-appears-xyz", stop]);
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], expected, "stop {stop:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Streamed, the stop text is not sent either.
    body["stream"] = json!(true);
    let events = post_stream(&s, "/v1/completions", &body);
    let mut text = String::new();
    let mut finish = Value::Null;
    for e in &events[..events.len() - 1] {
        let ch: Value = serde_json::from_str(e).unwrap();
        text.push_str(ch["choices"][0]["text"].as_str().unwrap());
        if !ch["choices"][0]["finish_reason"].is_null() {
            finish = ch["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!(text, expected);
    assert_eq!(finish, "stop");
}

#[cfg(unix)]
#[test]
fn sigterm_finishes_running_streams_then_exits() {
    let mut s = Server::start(&[]);
    let mut body = chat_body("Count slowly.", 400);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let mut r = open_stream(&s, &body, 2);
    let kill = Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // The running stream is finished, not cut.
    let mut rest = String::new();
    r.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("data: [DONE]"), "stream was cut: {rest}");
    assert!(
        rest.contains("\"completion_tokens\":400"),
        "stream did not run to its end: {rest}"
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "server did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}");
    assert!(TcpStream::connect(&s.addr).is_err(), "still accepting");
}

#[test]
fn official_openai_python_client() {
    if !python::openai_available() {
        return;
    }
    let s = Server::start(&[]);
    python_checks(&s, "openai_client.py", &["tiny"], "all checks passed");
}

#[test]
fn a_model_that_cannot_load_ends_the_server_with_an_error() {
    let missing = tmp_dir().join("missing.gguf");
    let o = Command::new(ternion_bin())
        .arg("serve")
        .arg("--model")
        .arg(&missing)
        .args(["--port", "0", "--threads", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing.gguf"), "{err}");
}

/// 1,000 malformed requests of many kinds, mixed with good ones: every malformed one gets a
/// 4xx with an OpenAI error object, every good one its completion, and the server stays up.
#[test]
fn survives_a_thousand_malformed_requests_mixed_with_good_ones() {
    let s = Server::start(&["--queue", "64", "--ctx", "256"]);
    let url = s.url("/v1/chat/completions");
    let bad: Vec<String> = vec![
        "".into(),
        "{".into(),
        "null".into(),
        "[]".into(),
        "\"text\"".into(),
        "{\"messages\": 3}".into(),
        "{\"messages\": []}".into(),
        "{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}".into(),
        "{\"messages\": [{\"role\": \"user\"}]}".into(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": -1}".into(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": \"hot\"}"
            .into(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_p\": 7}".into(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 99}".into(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"model\": \"nope\"}".into(),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 5}".into(),
        "\u{0}\u{1}\u{2}garbage".into(),
        format!(
            "{{\"messages\": [{{\"role\": \"user\", \"content\": \"x\"}}], \"max_tokens\": {}}}",
            u64::MAX
        ),
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"seed\": 1.5}".into(),
    ];
    let good = chat_body("Hi", 2).to_string();
    let mut n_bad = 0;
    let mut i = 0;
    while n_bad < 1000 {
        if i % 50 == 49 {
            let (status, text) = post_raw(&url, &good);
            assert_eq!(status, 200, "good request {i}: {text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
        } else {
            let body = &bad[i % bad.len()];
            let (status, text) = post_raw(&url, body);
            assert!(
                (400..500).contains(&status),
                "{body:?} answered {status}: {text}"
            );
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{body:?}: error is not JSON ({e}): {text}"));
            assert!(v["error"]["message"].is_string(), "{body:?}: {v}");
            n_bad += 1;
        }
        i += 1;
    }
    assert_eq!(get(&s.url("/health")).0, 200);
    wait_for("no active sequences", || {
        s.metric("ternion_active_sequences") == 0.0
    });
}

/// GPU tests run on lavapipe in CI; TERNION_SKIP_GPU_TESTS=1 skips them where no Vulkan
/// driver is installed.
fn skip_gpu() -> bool {
    let skip = std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1");
    if skip {
        eprintln!("skipping GPU server test: TERNION_SKIP_GPU_TESTS=1");
    }
    skip
}

/// `ternion run --backend gpu` greedy ids for `prompt`.
fn gpu_run_tokens(prompt: &str, n: usize) -> Value {
    let o = Command::new(ternion_bin())
        .arg("run")
        .arg("--model")
        .arg(tiny_model())
        .args(["--prompt", prompt, "-n", &n.to_string()])
        .args(["--temperature", "0", "--json", "--backend", "gpu"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8(o.stdout).unwrap();
    let run: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    run["tokens"].clone()
}

/// On the GPU, sequences decoded together in one batched step give each the tokens it
/// gets alone (`ternion run --backend gpu`): four concurrent greedy requests of different
/// prompts and lengths, joining while others decode.
#[test]
fn gpu_server_batches_sequences_and_matches_gpu_run() {
    if skip_gpu() {
        return;
    }
    let prompts = [
        "Once upon a time, in a quiet village,",
        "The quick brown fox",
        "In 1905 Einstein published four papers that",
        "Hello",
    ];
    let want: Vec<Value> = prompts.iter().map(|p| gpu_run_tokens(p, 20)).collect();
    let s = Server::start(&["--backend", "gpu", "--max-active", "4"]);
    let got: Vec<Value> = std::thread::scope(|sc| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    let body = json!({
                        "model": "tiny", "prompt": p, "max_tokens": 20, "temperature": 0,
                        "return_token_ids": true,
                    });
                    let (status, v) = s.post("/v1/completions", &body);
                    assert_eq!(status, 200, "{v}");
                    v["choices"][0]["token_ids"].clone()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    assert!(s.metric("ternion_forward_passes_total") < (4 * 21) as f64);
    wait_for("pages freed", || s.metric("ternion_kv_pages_in_use") == 0.0);
}

/// A GPU that is lost mid-generation (a real `wgpu::Device::destroy`, injected by the test
/// hook) ends the engine, not the server: the request gets a 503 with the reason,
/// `/health` reports unhealthy, new requests get 503, and the server keeps answering.
#[test]
fn gpu_device_lost_keeps_the_server_up_and_unhealthy() {
    if skip_gpu() {
        return;
    }
    let s = Server::start_env(
        &["--backend", "gpu"],
        &[("TERNION_TEST_GPU_LOST_AFTER", "3")],
    );
    // Greedy: "Hello" runs past the fourth step, where the device goes (sampled tokens
    // could end the request at the first step, with a 200 and no tokens).
    let body = json!({"model": "tiny", "prompt": "Hello", "max_tokens": 20, "temperature": 0});
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("the engine stopped: GPU device lost (Destroyed)"),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "service_unavailable", "{v}");
    let (status, health) = get(&s.url("/health"));
    assert_eq!(status, 503);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "unhealthy", "{health}");
    assert!(
        health["error"]
            .as_str()
            .unwrap()
            .contains("GPU device lost"),
        "{health}"
    );
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 503, "{v}");
    assert_eq!(get(&s.url("/v1/models")).0, 200, "the server is still up");
    assert_eq!(s.metric("ternion_model_loaded"), 0.0);
}
