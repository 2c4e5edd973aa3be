//! One generation core behind every front end: the same request (a 513-token prompt,
//! sampler settings with a seed, a stop rule) through `ternion run --json`, through
//! `ternion serve` over HTTP on 127.0.0.1, and through the browser engine's native
//! harness gives the same token ids and text.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use serde_json::{json, Value};
use ternion::gguf::GgufFile;
use ternion::model::{LoadOptions, Model};
use ternion::sample::{Sampler, SamplerConfig};
use ternion::tokenizer::{Tokenizer, TokenizerOptions};
use ternion_web::engine::{Backend, CpuSeq, Engine, Host};

const N_CTX: usize = 1024;
const MAX_TOKENS: usize = 24;

/// A tiny BitNet b1.58 model with the 259-token byte vocabulary.
fn model(dir: &Path) -> PathBuf {
    let out = dir.join("tiny.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .args(["synth", "--shape", "tiny", "--type", "i2_s", "--seed", "5"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("ternion synth runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A prompt of 513 tokens: one more than a prefill chunk.
fn prompt() -> Vec<u32> {
    std::iter::once(256)
        .chain((0..512u32).map(|i| (i * 37 + 11) % 256))
        .collect()
}

/// One request: sampler settings and stop strings.
struct Request {
    sampler: SamplerConfig,
    stop: Vec<String>,
}

/// What a front end generated: ids, text, finish reason.
#[derive(Debug, PartialEq)]
struct Reply {
    ids: Vec<u32>,
    text: String,
    finish: String,
}

fn via_cli(model: &Path, r: &Request) -> Reply {
    let s = &r.sampler;
    let ids: Vec<String> = prompt().iter().map(u32::to_string).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ternion"));
    cmd.arg("run")
        .arg("-m")
        .arg(model)
        .args(["-t", "1", "--ctx", &N_CTX.to_string(), "--json"])
        .args(["--tokens", &ids.join(",")])
        .args(["-n", &MAX_TOKENS.to_string()])
        .args(["--temperature", &s.temperature.to_string()])
        .args(["--top-k", &s.top_k.to_string()])
        .args(["--top-p", &s.top_p.to_string()])
        .args(["--min-p", &s.min_p.to_string()])
        .args(["--repeat-penalty", &s.repeat_penalty.to_string()])
        .args(["--repeat-last-n", &s.repeat_last_n.to_string()])
        .args(["--seed", &s.seed.to_string()]);
    for stop in &r.stop {
        cmd.arg("--stop").arg(stop);
    }
    let o = cmd.output().expect("ternion run runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    Reply {
        ids: serde_json::from_value(v["tokens"].clone()).unwrap(),
        text: v["text"].as_str().unwrap().into(),
        finish: v["finish_reason"].as_str().unwrap().into(),
    }
}

/// A running `ternion serve`, killed when dropped.
struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(model: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ternion"))
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--port", "0", "--threads", "1", "--ctx", &N_CTX.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ternion serve starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => {
                let _ = child.kill();
                panic!("ternion serve did not report its address")
            }
        };
        if let Some(i) = line.find("http://") {
            break line[i + 7..].split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server(child, addr)
}

/// POSTs `body` (HTTP/1.1, one connection) and returns the status and the JSON answer.
fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).expect("the server accepts connections");
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let (_, json) = answer.split_once("\r\n\r\n").expect("a body");
    (status, serde_json::from_str(json).expect("a JSON body"))
}

fn via_server(server: &Server, r: &Request) -> Reply {
    let s = &r.sampler;
    let body = json!({
        "prompt": prompt(),
        "max_tokens": MAX_TOKENS,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repetition_penalty": s.repeat_penalty,
        "repeat_last_n": s.repeat_last_n,
        "seed": s.seed,
        "stop": r.stop,
        "return_token_ids": true,
    });
    // The server loads the model in the background: retry while it answers 503.
    let t0 = std::time::Instant::now();
    let v = loop {
        let (status, v) = post(&server.1, "/v1/completions", &body);
        if status == 200 {
            break v;
        }
        assert!(
            status == 503 && t0.elapsed().as_secs() < 60,
            "{status}: {v}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let c = &v["choices"][0];
    Reply {
        ids: serde_json::from_value(c["token_ids"].clone()).unwrap(),
        text: c["text"].as_str().unwrap().into(),
        finish: c["finish_reason"].as_str().unwrap().into(),
    }
}

struct Native;

impl Host for Native {
    fn now_ms(&self) -> f64 {
        0.0
    }

    async fn pause(&self) {}
}

fn via_web(model: &Path, r: &Request) -> Reply {
    let file = Arc::new(GgufFile::open(model).unwrap());
    let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default()).unwrap();
    let model = Model::from_file(file, &LoadOptions::default()).unwrap();
    let state = model.cpu_state(N_CTX);
    let seq = CpuSeq {
        model,
        state,
        n_ctx: N_CTX,
    };
    let mut engine = Engine::new(tok, Backend::Cpu(Box::new(seq)));
    engine.set_stops(r.stop.clone());
    let mut sampler = Sampler::new(r.sampler.clone()).unwrap();
    let g = pollster::block_on(engine.generate(
        &Native,
        &prompt(),
        &mut sampler,
        MAX_TOKENS,
        false,
        |_, _| true,
    ))
    .unwrap();
    let finish = match g.finish.as_str() {
        "context" => "length",
        f => f,
    };
    Reply {
        ids: g.tokens,
        text: g.text,
        finish: finish.into(),
    }
}

#[test]
fn cli_server_and_web_engine_generate_the_same_tokens() {
    let dir = ternion_testkit::scratch::dir("ternion-one-core");
    let model = model(&dir);
    let server = serve(&model);
    let sampled = SamplerConfig {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        seed: 7,
        ..SamplerConfig::default()
    };
    let mut requests = vec![
        Request {
            sampler: sampled,
            stop: Vec::new(),
        },
        Request {
            sampler: SamplerConfig::greedy(),
            stop: Vec::new(),
        },
    ];
    for r in &requests {
        let web = via_web(&model, r);
        assert!(!web.ids.is_empty());
        assert_eq!(via_cli(&model, r), web, "CLI vs web engine");
        assert_eq!(via_server(&server, r), web, "server vs web engine");
    }
    // A stop string from the middle of the greedy text ends all three at the same token.
    let free = via_web(&model, &requests[1]);
    let chars: Vec<char> = free.text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    requests[1].stop = vec![stop.clone()];
    let web = via_web(&model, &requests[1]);
    assert_eq!(web.finish, "stop", "{stop:?} in {:?}", free.text);
    assert!(web.ids.len() < free.ids.len());
    assert!(free.text.starts_with(&format!("{}{stop}", web.text)));
    assert_eq!(via_cli(&model, &requests[1]), web, "CLI vs web engine");
    assert_eq!(
        via_server(&server, &requests[1]),
        web,
        "server vs web engine"
    );
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}
