//! `ternion bench-serve`: a load benchmark of the HTTP server. N concurrent clients each
//! stream completions; the run reports aggregate generated tokens per second, time to
//! first token and inter-token latency (p50/p99). The server is either started in this
//! process on 127.0.0.1 (from `--model` or `--synthetic`) or reached at `--url`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use ternion_server::ServerConfig;

use crate::common;
use crate::constrain::ConstrainArgs;

/// Arguments of `ternion bench-serve`.
#[derive(Args)]
pub struct BenchServeArgs {
    /// GGUF model file to serve in-process.
    #[arg(long, short = 'm', conflicts_with_all = ["synthetic", "url"])]
    model: Option<PathBuf>,
    /// A synthetic model `SHAPE-TYPE` (as `ternion bench`) to serve in-process.
    #[arg(long, conflicts_with = "url")]
    synthetic: Option<String>,
    /// A running server (e.g. http://127.0.0.1:8080) instead of an in-process one.
    #[arg(long)]
    url: Option<String>,
    /// API key the running server (--url) requires, sent as `Authorization: Bearer KEY`.
    #[arg(
        long,
        env = "TERNION_API_KEY",
        hide_env_values = true,
        requires = "url"
    )]
    api_key: Option<String>,
    /// Worker threads of the in-process server (default: the cores this process may use).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    #[command(flatten)]
    backend: crate::common::BackendArgs,
    /// Concurrent streams to measure, comma-separated; one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    streams: Vec<usize>,
    /// Prompt tokens per request (random ids below 256, valid in every vocabulary).
    #[arg(short = 'P', long, default_value_t = 32)]
    prompt_tokens: usize,
    /// Tokens generated per request (end-of-generation tokens are ignored), as `-n` in
    /// `run`; sent as the request's `max_tokens`.
    #[arg(
        short = 'n',
        long = "n-predict",
        alias = "max-tokens",
        default_value_t = 32
    )]
    max_tokens: usize,
    /// Requests each client sends, one after the other.
    #[arg(long, default_value_t = 1)]
    requests: usize,
    /// Instead of --requests: each client keeps sending requests until this many seconds
    /// have passed (a soak test).
    #[arg(long)]
    duration: Option<u64>,
    /// In-process server: one sequence per forward pass instead of batching.
    #[arg(long)]
    no_batch: bool,
    /// In-process server on a GPU: constrained requests read back whole logits rows
    /// instead of the top-k under their token masks (see `ternion serve`).
    #[arg(long)]
    no_gpu_mask: bool,
    /// In-process server: prompt tokens evaluated per engine step (see `ternion serve`).
    #[arg(long, default_value_t = 256)]
    prefill_per_step: usize,
    /// In-process server: context size per sequence (default: prompt + max tokens).
    #[arg(long)]
    ctx: Option<usize>,
    /// Every request asks for constrained output (sent as `response_format`, `regex` or
    /// `grammar`), to measure the token mask's cost end to end.
    #[command(flatten)]
    constrain: ConstrainArgs,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
}

/// What one streamed request saw.
struct Trace {
    /// Request sent → first token.
    ttft: Duration,
    /// Gaps between consecutive tokens.
    gaps: Vec<Duration>,
    tokens: usize,
}

/// The `p`-th percentile (0–100) of sorted values, in milliseconds.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// The HTTP client; every request carries the API key as a bearer token when given.
#[derive(Clone)]
struct Client {
    agent: ureq::Agent,
    bearer: Option<String>,
}

impl Client {
    fn new(key: Option<&str>) -> Client {
        Client {
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(600))
                .build(),
            bearer: key.map(|k| format!("Bearer {k}")),
        }
    }

    /// A `method` request to `url`, with the key.
    fn request(&self, method: &str, url: &str) -> ureq::Request {
        let r = self.agent.request(method, url);
        match &self.bearer {
            Some(b) => r.set("Authorization", b),
            None => r,
        }
    }
}

/// Streams one completion and timestamps every token chunk.
fn stream_one(agent: &Client, url: &str, body: &Value) -> Result<Trace> {
    let t0 = Instant::now();
    let r = agent
        .request("POST", &format!("{url}/v1/completions"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
        .map_err(|e| match e {
            ureq::Error::Status(code, r) => {
                anyhow::anyhow!("HTTP {code}: {}", r.into_string().unwrap_or_default())
            }
            e => anyhow::anyhow!("{e}"),
        })?;
    let mut last = None;
    let mut trace = Trace {
        ttft: Duration::ZERO,
        gaps: Vec::new(),
        tokens: 0,
    };
    for line in BufReader::new(r.into_reader()).lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).context("a chunk is not JSON")?;
        if let Some(e) = v.get("error") {
            bail!("the server answered an error: {e}");
        }
        let n = v["choices"][0]["token_ids"].as_array().map_or(0, Vec::len);
        if n == 0 {
            continue;
        }
        let now = Instant::now();
        match last {
            None => trace.ttft = now - t0,
            Some(prev) => trace.gaps.push(now - prev),
        }
        last = Some(now);
        trace.tokens += n;
    }
    Ok(trace)
}

/// One measurement: `streams` clients, each sending `requests` requests in turn.
fn measure(
    a: &BenchServeArgs,
    agent: &Client,
    url: &str,
    model_id: &str,
    streams: usize,
) -> Result<Value> {
    let fields = a.constrain.request_fields()?;
    let t0 = Instant::now();
    let handles: Vec<_> = (0..streams)
        .map(|c| {
            let (url, model_id, agent) = (url.to_string(), model_id.to_string(), agent.clone());
            let (n_prompt, max_tokens, requests) = (a.prompt_tokens, a.max_tokens, a.requests);
            let duration = a.duration.map(Duration::from_secs);
            let fields = fields.clone();
            std::thread::spawn(move || -> Result<Vec<Trace>> {
                let mut rng = rand::rngs::StdRng::seed_from_u64(c as u64);
                let mut traces = Vec::new();
                for r in 0.. {
                    let more = match duration {
                        Some(d) => t0.elapsed() < d,
                        None => r < requests,
                    };
                    if !more {
                        break;
                    }
                    let prompt: Vec<u32> =
                        (0..n_prompt).map(|_| rng.random_range(0..256)).collect();
                    let mut body = json!({
                        "model": model_id, "prompt": [prompt], "max_tokens": max_tokens,
                        "stream": true, "ignore_eos": true, "return_token_ids": true,
                        "temperature": 0.8, "seed": c * 1_000_000 + r,
                    });
                    if let Some(b) = body.as_object_mut() {
                        b.extend(fields.clone());
                    }
                    traces.push(stream_one(&agent, &url, &body)?);
                }
                Ok(traces)
            })
        })
        .collect();
    let mut traces = Vec::new();
    for h in handles {
        match h.join() {
            Ok(t) => traces.extend(t?),
            Err(_) => bail!("a client thread panicked"),
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let tokens: usize = traces.iter().map(|t| t.tokens).sum();
    let mut ttft: Vec<Duration> = traces.iter().map(|t| t.ttft).collect();
    let mut itl: Vec<Duration> = traces.iter().flat_map(|t| t.gaps.clone()).collect();
    ttft.sort_unstable();
    itl.sort_unstable();
    Ok(json!({
        "streams": streams,
        "requests": traces.len(),
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": tokens as f64 / wall,
        "ttft_p50_ms": percentile_ms(&ttft, 50.0),
        "ttft_p99_ms": percentile_ms(&ttft, 99.0),
        "itl_p50_ms": percentile_ms(&itl, 50.0),
        "itl_p99_ms": percentile_ms(&itl, 99.0),
    }))
}

/// A server started in this process, stopped when dropped.
struct InProcess {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl InProcess {
    fn start(a: &BenchServeArgs, model: PathBuf) -> Result<InProcess> {
        let max_streams = a.streams.iter().copied().max().unwrap_or(1);
        let cfg = ServerConfig {
            n_ctx: Some(a.ctx.unwrap_or(a.prompt_tokens + a.max_tokens + 1)),
            max_active: max_streams,
            queue: max_streams.max(1) * 2,
            prefill_per_step: a.prefill_per_step,
            batching: crate::serve::batching(a.no_batch),
            device: crate::serve::device(&a.backend),
            kv_type: a.backend.kv_type,
            gpu_mask: !a.no_gpu_mask,
            ..ServerConfig::new(model)
        };
        let rt = crate::serve::http_runtime()?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .context("listening on 127.0.0.1")?;
        let url = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(ternion_server::run(cfg, listener, async {
                let _ = rx.await;
            }))
            .map_err(anyhow::Error::from)
        });
        Ok(InProcess {
            url,
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until `url/health` answers 200 and returns the served model id.
fn wait_ready(agent: &Client, url: &str, server: Option<&InProcess>) -> Result<String> {
    let t0 = Instant::now();
    loop {
        if let Ok(r) = agent.request("GET", &format!("{url}/health")).call() {
            if r.status() == 200 {
                break;
            }
        }
        if server.is_some_and(|s| s.thread.as_ref().is_some_and(|t| t.is_finished())) {
            bail!("the in-process server stopped while loading (see the message above)");
        }
        if t0.elapsed() > Duration::from_secs(600) {
            bail!("{url} did not become healthy within 600 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let v: Value = agent
        .request("GET", &format!("{url}/v1/models"))
        .call()
        .context("GET /v1/models")?
        .into_json()?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("/v1/models lists no model")
}

/// Runs `ternion bench-serve`.
pub fn run(a: BenchServeArgs) -> Result<()> {
    if a.streams.contains(&0) || a.requests == 0 || a.max_tokens == 0 || a.prompt_tokens == 0 {
        bail!("--streams, --requests, -n/--n-predict and -P/--prompt-tokens must be at least 1");
    }
    if a.prefill_per_step < ternion_server::engine::MIN_PREFILL_PER_STEP {
        bail!(
            "--prefill-per-step must be at least {}",
            ternion_server::engine::MIN_PREFILL_PER_STEP
        );
    }
    let server = match (&a.url, &a.model, &a.synthetic) {
        (Some(_), _, _) => None,
        (None, Some(m), _) => Some(m.clone()),
        (None, None, Some(name)) => Some(crate::bench::synthetic_path(name)?),
        (None, None, None) => bail!("give --model FILE, --synthetic NAME or --url URL"),
    };
    let threads = match server {
        Some(_) => Some(common::init_threads(a.threads)?),
        None => None,
    };
    let server = server.map(|m| InProcess::start(&a, m)).transpose()?;
    let url = match (&server, &a.url) {
        (Some(s), _) => s.url.clone(),
        (None, Some(u)) => u.trim_end_matches('/').to_string(),
        (None, None) => unreachable!("checked above"),
    };
    let agent = Client::new(a.api_key.as_deref());
    let model_id = wait_ready(&agent, &url, server.as_ref())?;
    // Warm-up: touches every weight page, starts the worker pool and builds the grammar
    // compiler of the vocabulary (with the constraint asked for).
    let mut warm = json!({"model": model_id, "prompt": [[1, 2, 3, 4]], "max_tokens": 2,
                          "stream": true, "ignore_eos": true, "return_token_ids": true});
    if let Some(b) = warm.as_object_mut() {
        b.extend(a.constrain.request_fields()?);
    }
    stream_one(&agent, &url, &warm).context("warm-up request")?;
    let mut runs = Vec::new();
    for &n in &a.streams {
        let r = measure(&a, &agent, &url, &model_id, n)?;
        eprintln!(
            "{n:>3} streams: {:>8.1} tok/s aggregate, TTFT p50 {:.0} ms p99 {:.0} ms, \
             inter-token p50 {:.1} ms p99 {:.1} ms ({} tokens in {:.1} s)",
            r["aggregate_tok_s"].as_f64().unwrap_or(0.0),
            r["ttft_p50_ms"].as_f64().unwrap_or(0.0),
            r["ttft_p99_ms"].as_f64().unwrap_or(0.0),
            r["itl_p50_ms"].as_f64().unwrap_or(0.0),
            r["itl_p99_ms"].as_f64().unwrap_or(0.0),
            r["tokens"],
            r["wall_s"].as_f64().unwrap_or(0.0),
        );
        runs.push(r);
    }
    if a.json {
        let out = json!({
            "url": a.url,
            "model": model_id,
            "threads": threads,
            "batching": server.as_ref().map(|_| if a.no_batch { "one-by-one" } else { "stacked" }),
            "gpu_mask": server.as_ref().map(|_| !a.no_gpu_mask),
            "prompt_tokens": a.prompt_tokens,
            "max_tokens": a.max_tokens,
            "requests_per_stream": a.requests,
            "constraint": a.constrain.request_fields()?,
            "duration_s": a.duration,
            "runs": runs,
        });
        println!("{out}");
    }
    Ok(())
}
