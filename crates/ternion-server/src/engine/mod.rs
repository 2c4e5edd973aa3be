//! The engine: one dedicated thread owns the model and steps every active sequence.
//!
//! Requests arrive through a bounded queue ([`Job`]s on a `sync_channel`). Between two
//! iterations the scheduler (`sched`) admits queued jobs while fewer than `max_active`
//! sequences run; each admitted job becomes a sequence (`seq`): the library's
//! [`Stepper`](ternion::generate::Stepper), which decides prompt chunks, sampling, stop
//! strings and the end, over a KV cache of the backend
//! ([`BatchBackend`](ternion::generate::BatchBackend): the CPU's pages from one shared
//! pool, or a GPU's paged device caches). One iteration gives every active sequence a
//! step (the token it sampled last, or the next chunk of its prompt while the iteration's
//! prompt budget ([`EngineConfig::prefill_per_step`] tokens) lasts) and runs all steps as
//! ONE batched forward pass (each weight read once for every sequence), then hands each
//! sequence its row. With [`Batching::OneByOne`] the same steps run one sequence per pass
//! (the scheduler before batching, kept for comparison).
//!
//! A sequence whose client went away (its event receiver was dropped) is removed before
//! the next iteration; dropping it returns its KV pages to the pool at once.
//!
//! On a GPU ([`Device::Gpu`]) the rows come back as the top-k candidates of each sequence
//! when every sampler allows it. A GPU failure (device lost, out of memory) is fatal to
//! the engine but not to the server: every sequence and queued request gets a 503 with the
//! reason, `/health` reports the engine unhealthy, and the HTTP side keeps answering.

#[cfg(feature = "gpu")]
mod backend;
mod sched;
mod seq;

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use ternion::chat::ChatTemplate;
use ternion::constrain::Grammars;
use ternion::embed::HiddenStates;
use ternion::generate::{BatchBackend, Constraint, FinishReason};
use ternion::model::Model;
use ternion::sample::{SamplerConfig, TokenLogprobs};
use ternion::tokenizer::{Tokenizer, TokenizerOptions};

use crate::error::{EngineError, StartError};
use crate::metrics::Metrics;

/// What the HTTP side queues for the engine thread.
pub enum Work {
    /// A generation request.
    Generate(Job),
    /// Embeddings on the engine's GPU (on the CPU they run beside the engine instead).
    Embed(EmbedJob),
}

impl Work {
    /// Answers the request with `e` instead of running it.
    fn refuse(self, e: EngineError) {
        match self {
            Work::Generate(job) => {
                let _ = job.events.send(Event::Error(e));
            }
            Work::Embed(job) => {
                let _ = job.reply.send(Err(e));
            }
        }
    }
}

/// The inputs of one embeddings request, for the engine's device.
pub struct EmbedJob {
    /// Token ids of each input (non-empty, within the context, ids in the vocabulary).
    pub inputs: Vec<Vec<u32>>,
    /// Where the pooled, L2-normalised vector of each input goes.
    pub reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, EngineError>>,
}

/// One generation request, ready for the engine: already tokenized and validated.
pub struct Job {
    /// Prompt token ids (non-empty, shorter than the context).
    pub prompt: Vec<u32>,
    /// Sampling settings (validated).
    pub sampler: SamplerConfig,
    /// Most tokens to generate (`prompt.len() + max_tokens <= n_ctx`).
    pub max_tokens: usize,
    /// Stop sequences: generation ends before the first one and it is not sent.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// What the output must match (a compiled grammar), if anything.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Report each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// When the request arrived (time to first token counts from here).
    pub arrived: Instant,
    /// Where the engine sends text and the end of the sequence. A dropped receiver
    /// cancels the sequence.
    pub events: Reply,
    /// The request's other choices. On a backend that shares KV pages
    /// ([`BatchBackend::FORKS`]) they go on from this sequence's prompt, evaluated once;
    /// elsewhere each runs as a sequence of its own ([`Job::split`]).
    pub forks: Vec<Fork>,
}

/// Another choice of a request: what it does not share with the request's first one.
pub struct Fork {
    /// Its sampling settings (its own seed).
    pub sampler: SamplerConfig,
    /// Its own compiled grammar, if the request has one.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Its way back to the request.
    pub events: Reply,
}

impl Job {
    /// Sequences the job runs: its own and its forks'.
    pub fn width(&self) -> usize {
        1 + self.forks.len()
    }

    /// The job of fork `f`, with `prompt` to evaluate (empty when it goes on from this
    /// job's prompt).
    fn sibling(&self, f: Fork, prompt: Vec<u32>) -> Job {
        Job {
            prompt,
            sampler: f.sampler,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            constraint: f.constraint,
            logprobs: self.logprobs,
            arrived: self.arrived,
            events: f.events,
            forks: Vec::new(),
        }
    }

    /// Takes the forks out as jobs of their own, each evaluating the prompt.
    pub fn split(&mut self) -> Vec<Job> {
        std::mem::take(&mut self.forks)
            .into_iter()
            .map(|f| self.sibling(f, self.prompt.clone()))
            .collect()
    }
}

/// A sequence's way back to its request: the request's channel and the sequence's choice
/// index (a request with `n` choices runs `n` sequences over one channel).
#[derive(Clone)]
pub struct Reply {
    /// The choice this sequence answers.
    pub choice: usize,
    /// The request's channel.
    pub tx: UnboundedSender<(usize, Event)>,
}

impl Reply {
    /// Sends `ev` tagged with the choice; fails when the request has gone away.
    pub fn send(&self, ev: Event) -> Result<(), Event> {
        self.tx.send((self.choice, ev)).map_err(|e| e.0 .1)
    }

    /// Whether the request has gone away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// What the engine tells a request's handler.
#[derive(Debug)]
pub enum Event {
    /// One generated token and the text it completes (empty while a character or a
    /// possible stop sequence is incomplete).
    Token {
        /// The token id.
        id: u32,
        /// Newly complete text.
        text: String,
        /// Its log-probabilities, when the request asked for them.
        logprobs: Option<TokenLogprobs>,
    },
    /// Text released at the end of the sequence (never empty).
    Text(String),
    /// The sequence ended; nothing follows.
    Done(Done),
    /// The sequence failed or was cancelled by the server; nothing follows.
    Error(EngineError),
}

/// The end of a sequence.
#[derive(Debug)]
pub struct Done {
    /// `Stop` (end-of-generation token or stop sequence) or `Length`.
    pub finish: FinishReason,
    /// Prompt tokens evaluated.
    pub prompt_tokens: usize,
    /// Tokens generated (an end-of-generation token is not counted).
    pub completion_tokens: usize,
    /// The generated ids.
    pub tokens: Vec<u32>,
}

/// What the HTTP side needs once the model is loaded.
pub struct Ready {
    /// The model's tokenizer (shared with the engine thread).
    pub tokenizer: Arc<Tokenizer>,
    /// The model's chat template.
    pub template: ChatTemplate,
    /// Text of the BOS token (for Jinja templates).
    pub bos_text: String,
    /// Text of the EOS token (for Jinja templates).
    pub eos_text: String,
    /// Context size of every sequence.
    pub n_ctx: usize,
    /// Vocabulary size (token ids given in a request must be below it).
    pub n_vocab: usize,
    /// The model (`crate::embeddings` runs CPU embeddings with it beside the engine).
    pub model: Arc<Model>,
    /// Embeddings run on the engine's GPU ([`Work::Embed`]) rather than on the CPU.
    pub gpu_embeddings: bool,
    /// The bounded request queue.
    pub jobs: SyncSender<Work>,
    /// Requests the queue holds at most (`--queue`): a generation request the scheduler took
    /// off the channel while every slot was busy still counts (`ternion_queue_length`).
    pub queue_capacity: usize,
    /// The grammar compiler of the vocabulary, built on the first structured request.
    pub grammars: OnceLock<ternion::Result<Grammars>>,
}

/// State shared by the HTTP side and the engine thread.
#[derive(Default)]
pub struct Shared {
    /// Server metrics.
    pub metrics: Metrics,
    /// Set once the model is loaded.
    pub ready: OnceLock<Ready>,
    /// Stop admitting requests; the engine exits once no sequence is left.
    pub shutdown: std::sync::atomic::AtomicBool,
    /// Cancel every active sequence now (the shutdown grace period is over).
    pub cancel_all: std::sync::atomic::AtomicBool,
    /// Why the engine stopped serving (a GPU fault): set once, reported by `/health`.
    pub failed: OnceLock<EngineError>,
}

/// Where the engine runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend (paged KV cache in host memory).
    #[default]
    Cpu,
    /// A GPU adapter (`Some(index)` as `--device` picks it; `None`: the default one).
    Gpu(Option<usize>),
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// GGUF model file.
    pub model_path: PathBuf,
    /// Tokenizer options (pre-tokenizer choice when the file names none).
    pub tokenizer: TokenizerOptions,
    /// Context size per sequence (default: the model's, at most 4096).
    pub n_ctx: Option<usize>,
    /// Most sequences generated at once (each holds a KV cache).
    pub max_active: usize,
    /// Most requests waiting for a slot; more are refused with 429.
    pub queue: usize,
    /// KV pages shared by all sequences (default: enough for `max_active` full contexts).
    pub kv_pages: Option<usize>,
    /// How the steps of an iteration are run.
    pub batching: Batching,
    /// Prompt tokens evaluated per iteration, over all new sequences (at least
    /// [`MIN_PREFILL_PER_STEP`]): bounds how long a step that admits prompts stalls the
    /// sequences already decoding.
    pub prefill_per_step: usize,
    /// CPU or GPU.
    pub device: Device,
    /// KV cache element type.
    pub kv_type: ternion::kv::KvType,
    /// On a GPU, select a constrained sequence's top-k under its token mask, so that only
    /// k pairs come back as for an unconstrained one (the default); `false` reads back its
    /// whole logits row and masks it on the host (for comparisons). The CPU always masks
    /// whole rows.
    pub gpu_mask: bool,
}

/// Smallest prompt budget of an iteration (a prompt chunk may not leave one token behind).
pub const MIN_PREFILL_PER_STEP: usize = 3;

/// How the engine runs the steps of one iteration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Batching {
    /// Every active sequence in one forward pass.
    #[default]
    Stacked,
    /// One forward pass per sequence (round robin), as before batching.
    OneByOne,
}

/// Starts the engine thread: it loads the model, publishes [`Ready`] in `shared`, reports
/// the outcome of loading through `loaded`, then serves jobs until shutdown.
pub fn spawn(
    cfg: EngineConfig,
    shared: Arc<Shared>,
    loaded: tokio::sync::oneshot::Sender<Result<(), StartError>>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ternion-engine".into())
        .spawn(move || {
            let _guard = LoadedFlag(&shared);
            let (model, tokenizer, rx, n_ctx) = match load(&cfg, &shared) {
                Ok(m) => m,
                Err(e) => {
                    let _ = loaded.send(Err(e));
                    return;
                }
            };
            let prefill_per_step = cfg.prefill_per_step.max(MIN_PREFILL_PER_STEP);
            let run = Run {
                cfg: &cfg,
                model: &model,
                tok: &tokenizer,
                rx: &rx,
                n_ctx,
                prefill_per_step,
                shared: &shared,
            };
            match cfg.device {
                Device::Cpu => {
                    let pool = match cfg.kv_pages {
                        Some(pages) => ternion::kv::KvPool::new(model.kv_geometry(), pages),
                        None => model.kv_pool(n_ctx, cfg.max_active),
                    };
                    run.serve(ternion::generate::CpuBatch::new(&model, pool), loaded);
                }
                #[cfg(feature = "gpu")]
                Device::Gpu(index) => {
                    match backend::gpu(&cfg, &model, n_ctx, prefill_per_step, index) {
                        Ok(gpu) => run.serve(gpu, loaded),
                        Err(e) => {
                            let _ = loaded.send(Err(e));
                        }
                    }
                }
                #[cfg(not(feature = "gpu"))]
                Device::Gpu(_) => {
                    let _ = loaded.send(Err(StartError::NoGpuBackend));
                }
            }
        })
}

/// What the engine thread serves with, once the model is loaded.
struct Run<'a> {
    cfg: &'a EngineConfig,
    model: &'a Model,
    tok: &'a Tokenizer,
    rx: &'a Receiver<Work>,
    n_ctx: usize,
    prefill_per_step: usize,
    shared: &'a Shared,
}

impl Run<'_> {
    /// Reports the model loaded, then runs the scheduler over `runner` until shutdown.
    fn serve<B: EngineBackend>(
        self,
        runner: B,
        loaded: tokio::sync::oneshot::Sender<Result<(), StartError>>,
    ) {
        let m = &self.shared.metrics;
        let (_, capacity) = runner.pages();
        m.kv_pages_capacity.store(capacity as u64, Relaxed);
        m.kv_page_bytes
            .store(self.model.kv_geometry().page_bytes() as u64, Relaxed);
        m.model_loaded.store(true, Relaxed);
        let _ = loaded.send(Ok(()));
        let mut sched = sched::Scheduler {
            model: self.model,
            tok: self.tok,
            runner,
            n_ctx: self.n_ctx,
            max_active: self.cfg.max_active,
            batching: self.cfg.batching,
            prefill_per_step: self.prefill_per_step,
            pending: Default::default(),
            held: false,
            fault: None,
        };
        sched.run(self.rx, self.shared);
    }
}

/// Clears the "model loaded" flag when the engine thread ends, however it ends.
struct LoadedFlag<'a>(&'a Shared);

impl Drop for LoadedFlag<'_> {
    fn drop(&mut self) {
        self.0.metrics.model_loaded.store(false, Relaxed);
        self.0.metrics.active_sequences.store(0, Relaxed);
    }
}

/// A backend the engine serves with: the steps of its sequences, and embeddings on its
/// device when it has one for them.
pub(crate) trait EngineBackend: BatchBackend {
    /// The hidden states of the backend's device, when embeddings run there.
    fn hidden(&mut self) -> Option<&mut dyn HiddenStates>;
}

/// CPU embeddings run beside the engine (`crate::embeddings`), not on its thread.
impl EngineBackend for ternion::generate::CpuBatch<'_> {
    fn hidden(&mut self) -> Option<&mut dyn HiddenStates> {
        None
    }
}

type LoadedModel = (Arc<Model>, Arc<Tokenizer>, Receiver<Work>, usize);

fn load(cfg: &EngineConfig, shared: &Shared) -> Result<LoadedModel, StartError> {
    let failed = |what| {
        move |e: ternion::Error| StartError::Load {
            what,
            path: cfg.model_path.display().to_string(),
            error: Box::new(e),
        }
    };
    let (file, model) = ternion::model::load(&cfg.model_path).map_err(failed("loading"))?;
    let model = Arc::new(model.with_kv_type(cfg.kv_type));
    let tokenizer = Tokenizer::from_gguf(&file, &cfg.tokenizer)
        .map_err(|e| failed("reading the tokenizer of")(e.into()))?;
    let template = file
        .get_str("tokenizer.chat_template")
        .map_err(|e| failed("reading the chat template of")(e.into()))?;
    let template = ChatTemplate::from_metadata(template);
    let n_ctx = cfg
        .n_ctx
        .unwrap_or(model.config().n_ctx_train.min(4096))
        .max(1);
    file.advise_will_need();
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tokenizer.token_bytes(i)).into_owned())
            .unwrap_or_default()
    };
    let (jobs, rx) = std::sync::mpsc::sync_channel(cfg.queue);
    let ready = Ready {
        bos_text: piece(tokenizer.bos_id()),
        eos_text: piece(tokenizer.eos_id()),
        tokenizer: Arc::new(tokenizer),
        template,
        n_ctx,
        n_vocab: model.config().n_vocab,
        model: model.clone(),
        gpu_embeddings: matches!(cfg.device, Device::Gpu(_)),
        jobs,
        queue_capacity: cfg.queue,
        grammars: OnceLock::new(),
    };
    let tokenizer = ready.tokenizer.clone();
    if shared.ready.set(ready).is_err() {
        return Err(StartError::StartedTwice);
    }
    Ok((model, tokenizer, rx, n_ctx))
}
