//! `ternion serve`: the OpenAI-compatible HTTP server.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ternion_server::{Access, Batching, Device, ServerConfig};

use crate::common::{self, ModelArgs};
use crate::{check, hub};

/// Arguments of `ternion serve`.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Most sequences generated at once (each holds a KV cache of --ctx positions).
    #[arg(long, default_value_t = 4)]
    max_active: usize,
    /// Most requests waiting for a free sequence; more are answered 429.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// The model id clients use (default: the file name without .gguf).
    #[arg(long)]
    alias: Option<String>,
    /// Largest request body in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Seconds running sequences may continue after SIGTERM/Ctrl-C before they are cancelled.
    #[arg(long, default_value_t = 10)]
    shutdown_grace: u64,
    /// KV-cache pages (32 positions each) shared by all sequences; bounds KV memory
    /// (default: enough for --max-active full contexts). A sequence that needs a page when
    /// none is free ends with an error.
    #[arg(long)]
    kv_pages: Option<usize>,
    /// Prompt tokens evaluated per engine step, over all newly admitted requests: smaller
    /// values shorten the stall of running streams when prompts arrive (at least 3).
    #[arg(long, default_value_t = 256)]
    prefill_per_step: usize,
    /// Run one sequence per forward pass instead of batching the active sequences
    /// (the scheduler before batching; for comparisons).
    #[arg(long)]
    no_batch: bool,
    /// On a GPU, read back a constrained request's whole logits row and mask it on the
    /// host instead of selecting its top-k under the token mask on the GPU (the way before
    /// GPU masks; for comparisons).
    #[arg(long)]
    no_gpu_mask: bool,
    /// Require `Authorization: Bearer KEY` on every request (401 otherwise); `/health`
    /// and `/metrics` stay open unless --api-key-all.
    #[arg(long, env = "TERNION_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Require the API key for `/health` and `/metrics` too.
    #[arg(long, requires = "api_key")]
    api_key_all: bool,
    /// Origin a browser page may call the API from (repeatable; `*`: any), with CORS
    /// preflight answers.
    #[arg(long)]
    cors_origin: Vec<String>,
    /// Do not print the log line of each request (standard error, info level).
    #[arg(long)]
    quiet: bool,
}

/// The engine's batching for a `--no-batch` flag.
pub(crate) fn batching(no_batch: bool) -> Batching {
    if no_batch {
        Batching::OneByOne
    } else {
        Batching::Stacked
    }
}

/// Where the engine runs for `--backend` / `--device`: `auto` takes the GPU when an
/// adapter opens.
pub(crate) fn device(b: &common::BackendArgs) -> Device {
    let Some(index) = b.adapter() else {
        return Device::Cpu;
    };
    if b.backend == common::Backend::Auto {
        let opts = ternion::backend::gpu::GpuOptions {
            device_index: index,
            ..Default::default()
        };
        if let Err(e) = ternion::backend::gpu::GpuContext::new(&opts) {
            eprintln!("no GPU ({e}); serving on the CPU");
            return Device::Cpu;
        }
    }
    Device::Gpu(index)
}

/// The async runtime the HTTP side runs on (two worker threads: the engine has its own).
pub(crate) fn http_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ternion-http")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs `ternion serve` until SIGTERM or Ctrl-C.
pub fn run(a: ServeArgs) -> Result<()> {
    let Some(model) = &a.model.model else {
        bail!("give the model file with --model FILE");
    };
    let model = hub::resolve(model)?;
    if let Some(want) = &a.model.sha256 {
        common::verify_sha256(&model, want)?;
    }
    check::special_tokens_at(&model)?;
    if a.model.ctx == Some(0) {
        bail!("--ctx must be at least 1");
    }
    if a.prefill_per_step < ternion_server::engine::MIN_PREFILL_PER_STEP {
        bail!(
            "--prefill-per-step must be at least {}",
            ternion_server::engine::MIN_PREFILL_PER_STEP
        );
    }
    let threads = common::init_threads(a.model.threads)?;
    let cfg = ServerConfig {
        model_id: a.alias.clone(),
        tokenizer: common::tokenizer_options(a.model.pre_tokenizer),
        n_ctx: a.model.ctx,
        max_active: a.max_active,
        queue: a.queue,
        max_body: a.max_body,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
        kv_pages: a.kv_pages,
        prefill_per_step: a.prefill_per_step,
        batching: batching(a.no_batch),
        device: device(&a.model.backend),
        kv_type: a.model.backend.kv_type,
        gpu_mask: !a.no_gpu_mask,
        access: Access {
            api_key: a.api_key.clone().filter(|k| !k.is_empty()),
            api_key_all: a.api_key_all,
            cors_origins: a.cors_origin.clone(),
        },
        ..ServerConfig::new(&model)
    };
    let level = if a.quiet {
        tracing_subscriber::filter::LevelFilter::WARN
    } else {
        tracing_subscriber::filter::LevelFilter::INFO
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(false)
        .init();
    let (max_active, queue) = (cfg.max_active, cfg.queue);
    let key = if cfg.access.api_key.is_some() {
        "API key required"
    } else {
        "no API key"
    };
    let rt = http_runtime()?;
    rt.block_on(async {
        let t0 = std::time::Instant::now();
        let server = ternion_server::Server::load(cfg)
            .await
            .with_context(|| format!("loading {}", model.display()))?;
        eprintln!(
            "ternion serve: loaded {} in {:.2} s (context {} tokens)",
            model.display(),
            t0.elapsed().as_secs_f64(),
            server.n_ctx()
        );
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "ternion serve: listening on http://{addr} ({threads} threads, {max_active} active \
             sequences, queue {queue}, {key})"
        );
        server
            .serve(listener, ternion_server::shutdown_signal())
            .await?;
        anyhow::Ok(())
    })
}
