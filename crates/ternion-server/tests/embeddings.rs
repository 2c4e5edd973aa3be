//! `POST /v1/embeddings` end to end: the server runs in this process on 127.0.0.1 (a free
//! port) over a tiny synthetic model, and its vectors are compared with the library's
//! `Embedder` on the CPU — over raw HTTP and through the official `openai` Python client
//! (`tests/openai_embeddings.py`; set `TERNION_SKIP_PYTHON=1` to skip that part where the
//! package is missing), from a CPU server (equal to 1e-6) and a GPU server (lavapipe in CI;
//! TERNION_SKIP_GPU_TESTS=1 skips it): within [`GPU_TOL`], the bound of the library's GPU
//! embedding test (`crates/ternion/tests/embed.rs`). `../shared` must hold the Llama-3
//! vocabulary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use ternion::embed::Embedder;
use ternion::quant::GgmlType;
use ternion::tokenizer::{Tokenizer, TokenizerOptions};
use ternion_server::{Device, ServerConfig};
use ternion_testkit::synth::{self, Shape, Spec, Vocab};

#[path = "support/python.rs"]
mod python;
use ternion_testkit::shared as support_shared;

/// The tiny synthetic model, in a file of its own per `name` (the tests run in parallel).
fn tiny_model(name: &str) -> PathBuf {
    let vocab = support_shared::shared_path("vocab/ggml-vocab-llama3.gguf");
    let dir = ternion_testkit::scratch::dir("ternion-embeddings");
    let path = dir.join(format!("tiny-{name}.gguf"));
    let spec = Spec {
        arch: "bitnet-b1.58",
        shape: Shape::named("tiny").unwrap(),
        weight_type: GgmlType::I2_S,
        vocab: Vocab::File {
            path: &vocab,
            limit: None,
        },
        seed: 3,
    };
    synth::write(&spec, &path).unwrap();
    path
}

/// The library's vectors for `texts` (and the tokens they took).
fn reference(model: &Path, texts: &[&str]) -> (Vec<Vec<f32>>, usize) {
    let (file, m) = ternion::model::load(model).unwrap();
    let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default()).unwrap();
    let mut e = Embedder::new(&m, None, true).unwrap();
    let mut n = 0;
    let vs = texts
        .iter()
        .map(|t| {
            let ids = e.tokenize(&tok, t).unwrap();
            n += ids.len();
            e.embed(&ids).unwrap().remove(0)
        })
        .collect();
    (vs, n)
}

fn post(base: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(&format!("{base}/v1/embeddings")).send_json(body.clone());
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("request failed: {e}"),
    };
    (resp.status(), resp.into_json().unwrap())
}

fn vectors(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let e = if e.get("embedding").is_some() {
                &e["embedding"]
            } else {
                e
            };
            e.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// Largest |GPU − CPU| over the values of unit vectors (`crates/ternion/tests/embed.rs`).
const GPU_TOL: f32 = 1e-2;

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: vector count");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "{what}: length");
        let max = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max <= tol, "{what}: max |diff| {max}");
    }
}

#[test]
fn embeddings_over_http_and_the_openai_client_equal_the_library() {
    serve_and_compare(Device::Cpu, 1e-6);
}

/// A GPU server embeds on its GPU plan, between the engine's steps.
#[test]
fn gpu_server_embeddings_equal_the_library_within_the_gpu_tolerance() {
    if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
        return eprintln!("skipping GPU server test: TERNION_SKIP_GPU_TESTS=1");
    }
    serve_and_compare(Device::Gpu(None), GPU_TOL);
}

/// A server running `cfg` in this process until [`Served::stop`].
struct Served {
    rt: tokio::runtime::Runtime,
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), ternion_server::StartError>>,
}

impl Served {
    /// Starts `cfg` on a free port and waits until it is healthy.
    fn start(cfg: ServerConfig) -> Served {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(ternion_server::run(cfg, listener, async {
            let _ = stopped.await;
        }));
        let t0 = Instant::now();
        while ureq::get(&format!("{base}/health")).call().is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "never became healthy"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Served {
            rt,
            base,
            stop,
            server,
        }
    }

    /// Shuts the server down.
    fn stop(self) {
        let _ = self.stop.send(());
        self.rt.block_on(self.server).unwrap().unwrap();
    }
}

/// A GPU server embeds a non-causal model's input (`attention.causal = false`) as one GPU
/// step even where it is longer than an engine step (prompt budget 3: the plan's steps
/// grow to the context), equal to the library's CPU vectors within [`GPU_TOL`].
#[test]
fn gpu_server_embeds_a_non_causal_model_in_one_step() {
    if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
        return eprintln!("skipping GPU server test: TERNION_SKIP_GPU_TESTS=1");
    }
    let tiny = tiny_model("non-causal");
    let model = tiny.with_extension("open.gguf");
    let key = [(
        "bitnet-b1.58.attention.causal",
        ternion::gguf::Value::Bool(false),
    )];
    ternion_testkit::variant::copy_with(&tiny, &model, &key, &[]).unwrap();
    let texts = ["the quick brown fox jumps over the lazy dog, twice over"];
    let (want, n_tokens) = reference(&model, &texts);
    assert!(n_tokens > 4, "{n_tokens} tokens fit one engine step");
    let mut cfg = ServerConfig::new(&model);
    cfg.device = Device::Gpu(None);
    cfg.max_active = 1;
    cfg.prefill_per_step = 3;
    let s = Served::start(cfg);
    let (status, v) = post(&s.base, &json!({"input": texts}));
    assert_eq!(status, 200, "{v}");
    assert_close(&vectors(&v["data"]), &want, GPU_TOL, "non-causal");
    s.stop();
}

/// Starts a server on `device` and compares its vectors with the library's (on the CPU)
/// within `tol`; checks the errors and the Python client.
fn serve_and_compare(device: Device, tol: f32) {
    let model = tiny_model(&format!("{device:?}"));
    let texts = ["hello world", "a second input"];
    let (want, n_tokens) = reference(&model, &texts);
    let mut cfg = ServerConfig::new(&model);
    cfg.model_id = Some("tiny".into());
    cfg.device = device;
    cfg.max_active = 1;
    let served = Served::start(cfg);
    let base = served.base.clone();

    let (status, v) = post(&base, &json!({"model": "tiny", "input": texts}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["usage"]["prompt_tokens"], n_tokens);
    assert_eq!(v["usage"]["total_tokens"], n_tokens);
    assert_close(&vectors(&v["data"]), &want, tol, "raw float");
    let (status, one) = post(&base, &json!({"input": texts[1]}));
    assert_eq!(status, 200, "{one}");
    assert_close(&vectors(&one["data"]), &want[1..], tol, "one string");

    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": ""}), "input"),
        (json!({"input": [[1, 2], [999999999]]}), "input"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
    ] {
        let (status, e) = post(&base, &body);
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["param"], param, "{body}: {e}");
    }

    python_client(&base, &want, n_tokens, tol);
    while_the_only_slot_generates(&base, texts[0], &want[0], tol);
    served.stop();
}

/// A server metric's value.
fn metric(base: &str, name: &str) -> f64 {
    let text = ureq::get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing from\n{text}"))
}

/// Embeddings take no sequence slot: with the server's only one taken by a long streamed
/// generation, an embeddings request is answered while it runs (the stream is then
/// dropped, which cancels it).
fn while_the_only_slot_generates(base: &str, text: &str, want: &[f32], tol: f32) {
    use std::io::BufRead;
    let body = json!({"prompt": "Hello", "max_tokens": 1500, "ignore_eos": true, "stream": true});
    let stream = ureq::post(&format!("{base}/v1/completions"))
        .send_json(body)
        .unwrap();
    let mut events = std::io::BufReader::new(stream.into_reader());
    let mut first = String::new();
    events.read_line(&mut first).unwrap();
    assert!(first.starts_with("data: "), "{first}");
    assert_eq!(metric(base, "ternion_active_sequences"), 1.0);
    let (status, v) = post(base, &json!({"input": text}));
    assert_eq!(status, 200, "{v}");
    assert_close(
        &vectors(&v["data"]),
        &[want.to_vec()],
        tol,
        "beside a generation",
    );
    assert_eq!(
        metric(base, "ternion_active_sequences"),
        1.0,
        "the generation still runs"
    );
}

/// The official client: default (base64) and float encodings, and token-id input.
fn python_client(base: &str, want: &[Vec<f32>], n_tokens: usize, tol: f32) {
    if !python::openai_available() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_embeddings.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(base)
        .arg("tiny")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "openai_embeddings.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_close(&vectors(&v["default"]), want, tol, "openai client, base64");
    assert_close(&vectors(&v["float"]), want, tol, "openai client, float");
    assert_eq!(vectors(&v["tokens"]).len(), 1);
    assert_eq!(v["usage"], json!([n_tokens, n_tokens]));
}
