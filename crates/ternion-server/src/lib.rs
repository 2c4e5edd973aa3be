//! Ternion's OpenAI-compatible HTTP server.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI request and response
//!   shapes, whole or streamed as server-sent events (`data: {...}` chunks, then
//!   `data: [DONE]`).
//! - `POST /v1/embeddings`: pooled, normalised vectors ([`embeddings`]; on the engine's GPU
//!   when it has one, else on the CPU beside the engine).
//! - `GET /v1/models`, `GET /v1/models/{id}`: the one served model.
//! - `GET /`: a small chat page that talks to the server (open without the API key; it
//!   asks for one).
//! - `GET /health`: 200 while the engine serves, 503 after it stopped (a GPU fault).
//! - `GET /metrics`: Prometheus text (queue length, active sequences, tokens, tokens/s,
//!   time-to-first-token histogram).
//!
//! The model lives on one engine thread ([`engine`]); HTTP handlers validate and tokenize,
//! then hand a [`engine::Job`] to the engine through a bounded queue and relay its events.
//! The model is loaded ([`Server::load`]) before the port is opened, so a model that cannot
//! be served fails before anything listens. [`access`]: the API key, CORS and the log line
//! of every request.

pub mod access;
pub mod api;
pub mod embeddings;
pub mod engine;
pub mod error;
pub mod http;
mod logprobs;
pub mod metrics;
mod respond;
pub mod structured;
pub mod tools;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ternion::kv::KvType;
use ternion::tokenizer::TokenizerOptions;

pub use crate::access::Access;
pub use crate::engine::{Batching, Device};
use crate::engine::{EngineConfig, Shared};
pub use crate::error::StartError;
use crate::http::AppState;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// GGUF model file.
    pub model_path: PathBuf,
    /// The id the model is served under (default: the file name without `.gguf`).
    pub model_id: Option<String>,
    /// Tokenizer options.
    pub tokenizer: TokenizerOptions,
    /// Context size of each sequence (default: the model's, at most 4096).
    pub n_ctx: Option<usize>,
    /// Most sequences generated at once.
    pub max_active: usize,
    /// Most requests waiting for a slot; more get 429.
    pub queue: usize,
    /// Largest request body in bytes; larger ones get 413.
    pub max_body: usize,
    /// After a shutdown signal, how long running sequences may continue before they are
    /// cancelled.
    pub shutdown_grace: Duration,
    /// KV-cache pages shared by all sequences (default: `max_active` full contexts).
    pub kv_pages: Option<usize>,
    /// How the engine runs the sequences of one step.
    pub batching: Batching,
    /// Prompt tokens evaluated per engine step over all new sequences.
    pub prefill_per_step: usize,
    /// CPU or GPU.
    pub device: Device,
    /// KV cache element type (F16 by default; F32 doubles its memory).
    pub kv_type: KvType,
    /// On a GPU, apply a constrained request's token mask to the GPU top-k (the default)
    /// instead of reading back its whole logits row (`false`, for comparisons).
    pub gpu_mask: bool,
    /// API key and CORS origins.
    pub access: Access,
}

impl ServerConfig {
    /// Defaults for `model_path`: 4 active sequences, a queue of 64, 1 MiB bodies, 10 s
    /// shutdown grace, 256 prompt tokens per step, an F16 KV cache, token masks applied on
    /// the GPU.
    pub fn new(model_path: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            model_path: model_path.into(),
            model_id: None,
            tokenizer: TokenizerOptions::default(),
            n_ctx: None,
            max_active: 4,
            queue: 64,
            max_body: 1 << 20,
            shutdown_grace: Duration::from_secs(10),
            kv_pages: None,
            batching: Batching::Stacked,
            prefill_per_step: 256,
            device: Device::Cpu,
            kv_type: KvType::F16,
            gpu_mask: true,
            access: Access::default(),
        }
    }

    fn id(&self) -> String {
        self.model_id.clone().unwrap_or_else(|| {
            self.model_path
                .file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
        })
    }
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// A server whose model is loaded, ready to serve.
pub struct Server {
    cfg: ServerConfig,
    shared: Arc<Shared>,
    engine: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts the engine thread and waits until it has loaded the model (and prepared the
    /// GPU when it runs there); a model that cannot be served is an error here.
    pub async fn load(cfg: ServerConfig) -> Result<Server, StartError> {
        let at_least_1 = |flag| StartError::Setting {
            flag,
            message: "must be at least 1".into(),
        };
        if cfg.max_active == 0 {
            return Err(at_least_1("--max-active"));
        }
        if cfg.queue == 0 {
            return Err(at_least_1("--queue"));
        }
        let shared = Arc::new(Shared::default());
        shared
            .metrics
            .max_active_sequences
            .store(cfg.max_active as u64, Relaxed);
        let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
        let engine = engine::spawn(
            EngineConfig {
                model_path: cfg.model_path.clone(),
                tokenizer: cfg.tokenizer,
                n_ctx: cfg.n_ctx,
                max_active: cfg.max_active,
                queue: cfg.queue,
                kv_pages: cfg.kv_pages,
                batching: cfg.batching,
                prefill_per_step: cfg.prefill_per_step,
                device: cfg.device,
                kv_type: cfg.kv_type,
                gpu_mask: cfg.gpu_mask,
            },
            shared.clone(),
            loaded_tx,
        )
        .map_err(|error| StartError::Io {
            what: "starting the engine thread",
            error,
        })?;
        let loaded = loaded_rx.await.unwrap_or(Err(StartError::EngineEnded));
        if let Err(e) = loaded {
            // The thread ends right after reporting; its panic, if any, is in `e` already.
            let _ = tokio::task::spawn_blocking(move || engine.join()).await;
            return Err(e);
        }
        Ok(Server {
            cfg,
            shared,
            engine,
        })
    }

    /// Context size of each sequence.
    pub fn n_ctx(&self) -> usize {
        self.shared.ready.get().map_or(0, |r| r.n_ctx)
    }

    /// Serves on `listener` until `shutdown` resolves. On shutdown: new connections are
    /// refused, queued requests get 503, running sequences finish within `shutdown_grace`
    /// or are cancelled, then the engine thread ends and this returns.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let Server {
            cfg,
            shared,
            engine,
        } = self;
        let state = Arc::new(AppState {
            shared: shared.clone(),
            model_id: cfg.id(),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            counter: AtomicU64::new(0),
        });
        let app = http::router(state, cfg.max_body, cfg.access.clone())?;
        let stop = {
            let shared = shared.clone();
            let grace = cfg.shutdown_grace;
            async move {
                shutdown.await;
                eprintln!("ternion-server: shutting down");
                shared.shutdown.store(true, Release);
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    shared.cancel_all.store(true, Release);
                });
            }
        };
        // Streamed tokens are small writes: send each at once rather than wait for an ACK.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await;
        shared.shutdown.store(true, Release);
        shared.cancel_all.store(true, Release);
        let joined = tokio::task::spawn_blocking(move || engine.join()).await;
        served.map_err(|error| StartError::Io {
            what: "serving HTTP",
            error,
        })?;
        match joined {
            Ok(Ok(())) => Ok(()),
            _ => Err(StartError::EnginePanicked),
        }
    }
}

/// Loads the model ([`Server::load`]), then serves on `listener` until `shutdown`
/// resolves ([`Server::serve`]).
pub async fn run(
    cfg: ServerConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    Server::load(cfg).await?.serve(listener, shutdown).await
}
