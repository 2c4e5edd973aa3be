//! `ternion serve`: the OpenAI-compatible HTTP server.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ternion_server::{Batching, Device, ServerConfig};

use crate::common::{self, ModelArgs};

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
    let gpu = Device::Gpu(b.device);
    match b.backend {
        common::Backend::Cpu => Device::Cpu,
        common::Backend::Gpu => gpu,
        common::Backend::Auto => {
            let opts = ternion::backend::gpu::GpuOptions {
                device_index: b.device,
                ..Default::default()
            };
            match ternion::backend::gpu::GpuContext::new(&opts) {
                Ok(_) => gpu,
                Err(e) => {
                    eprintln!("no GPU ({e}); serving on the CPU");
                    Device::Cpu
                }
            }
        }
    }
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
    let Some(model) = a.model.model.clone() else {
        bail!("give the model file with --model FILE");
    };
    if let Some(want) = &a.model.sha256 {
        common::verify_sha256(&model, want)?;
    }
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
        ..ServerConfig::new(model)
    };
    let rt = http_runtime()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "ternion serve: listening on http://{addr} ({threads} threads, {} active sequences, \
             queue {})",
            cfg.max_active, cfg.queue
        );
        ternion_server::run(cfg, listener, ternion_server::shutdown_signal()).await
    })
}
