//! The engine: one dedicated thread owns the model and steps every active sequence.
//!
//! Requests arrive through a bounded queue ([`Job`]s on a `sync_channel`). Between two
//! iterations the engine admits queued jobs while fewer than `max_active` sequences run;
//! each admitted job gets a KV cache ([`KvSeq`]) whose pages come from one [`KvPool`]
//! shared by all sequences. One iteration gives every active sequence a step (the token
//! it sampled last, or the next chunk of its prompt while the iteration's prompt budget
//! ([`EngineConfig::prefill_per_step`] tokens) lasts) and runs all steps as ONE batched
//! forward pass
//! ([`Model::forward_batch`]: each weight read once for every sequence), then samples the
//! next token of every sequence whose prompt is in. With [`Batching::OneByOne`] the same
//! steps run one sequence per pass (the scheduler before batching, kept for comparison).
//!
//! A sequence whose client went away (its event receiver was dropped) is removed before
//! the next iteration; dropping it returns its KV pages to the pool at once.
//!
//! On a GPU ([`Device::Gpu`]) the sequences are [`GpuSeq`]s of one [`GpuModel`] (paged KV
//! caches on the device) and an iteration is one [`GpuModel::forward_seqs`] step. A GPU
//! failure (device lost, out of memory) is fatal to the engine but not to the server: every
//! sequence and queued request gets a 503 with the reason, `/health` reports the engine
//! unhealthy, and the HTTP side keeps answering.

use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use ternion::backend::cpu::{SeqStep, Workspace};
#[cfg(feature = "gpu")]
use ternion::backend::gpu::{
    GpuContext, GpuModel, GpuModelOptions, GpuOptions, GpuSeq, GpuSeqStep,
};
use ternion::chat::ChatTemplate;
use ternion::kv::{KvPool, KvSeq};
use ternion::model::graph::Graph;
use ternion::model::{Logits, Model};
use ternion::sample::{Sampler, SamplerConfig};
use ternion::session::{FinishReason, PREFILL_CHUNK};
use ternion::tokenizer::{StreamDecoder, Tokenizer, TokenizerOptions};

use crate::metrics::Metrics;
use crate::stop::StopFilter;

/// One generation request, ready for the engine: already tokenized and validated.
#[derive(Debug)]
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
    /// When the request arrived (time to first token counts from here).
    pub arrived: Instant,
    /// Where the engine sends text and the end of the sequence. A dropped receiver
    /// cancels the sequence.
    pub events: UnboundedSender<Event>,
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
    },
    /// Text released at the end of the sequence (never empty).
    Text(String),
    /// The sequence ended; nothing follows.
    Done(Done),
    /// The sequence failed or was cancelled by the server; nothing follows.
    Error {
        /// HTTP status that describes it (500 engine error, 503 shutting down).
        status: u16,
        /// What happened.
        message: String,
    },
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
    /// The bounded request queue.
    pub jobs: SyncSender<Job>,
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
    pub failed: OnceLock<String>,
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
}

/// Candidates per sequence the GPU engine reads back when the samplers allow it.
#[cfg(feature = "gpu")]
const GPU_TOP_K: u32 = ternion::backend::gpu::MAX_TOPK;

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
    loaded: tokio::sync::oneshot::Sender<Result<(), String>>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ternion-engine".into())
        .spawn(move || {
            let _guard = LoadedFlag(&shared);
            let model = match load(&cfg, &shared) {
                Ok(m) => m,
                Err(e) => {
                    let _ = loaded.send(Err(e));
                    return;
                }
            };
            let (model, tokenizer, rx, n_ctx) = model;
            let prefill_per_step = cfg.prefill_per_step.max(MIN_PREFILL_PER_STEP);
            let runner = match Runner::new(&cfg, &model, n_ctx, prefill_per_step) {
                Ok(r) => r,
                Err(e) => {
                    let _ = loaded.send(Err(e));
                    return;
                }
            };
            let m = &shared.metrics;
            let (_, capacity) = runner.pages();
            m.kv_pages_capacity.store(capacity as u64, Relaxed);
            m.kv_page_bytes
                .store(model.kv_geometry().page_bytes() as u64, Relaxed);
            m.model_loaded.store(true, Relaxed);
            let _ = loaded.send(Ok(()));
            let mut sched = Scheduler {
                tok: &tokenizer,
                runner,
                n_vocab: model.config().n_vocab,
                n_ctx,
                max_active: cfg.max_active,
                batching: cfg.batching,
                prefill_per_step,
            };
            sched.run(&rx, &shared);
        })
}

/// The backend the scheduler steps, with its KV pages.
enum Runner<'m> {
    Cpu {
        model: &'m Model,
        pool: Arc<KvPool>,
        ws: Box<Workspace>,
    },
    #[cfg(feature = "gpu")]
    Gpu {
        gpu: Box<GpuModel>,
        /// Fault injection for tests: destroy the device before this many more steps
        /// (`TERNION_TEST_GPU_LOST_AFTER`), to check a real device loss end to end.
        lose_after: Option<u64>,
    },
}

impl<'m> Runner<'m> {
    fn new(
        cfg: &EngineConfig,
        model: &'m Model,
        n_ctx: usize,
        prefill_per_step: usize,
    ) -> Result<Runner<'m>, String> {
        match cfg.device {
            Device::Cpu => {
                let pool = match cfg.kv_pages {
                    Some(pages) => KvPool::new(model.kv_geometry(), pages),
                    None => model.kv_pool(n_ctx, cfg.max_active),
                };
                Ok(Runner::Cpu {
                    model,
                    pool,
                    ws: Box::default(),
                })
            }
            #[cfg(feature = "gpu")]
            Device::Gpu(device_index) => {
                let opts = GpuOptions {
                    device_index,
                    ..GpuOptions::default()
                };
                let ctx = GpuContext::new(&opts).map_err(|e| format!("GPU: {e}"))?;
                // One step holds a prompt budget's chunk and a token of every other sequence.
                let gopts = GpuModelOptions {
                    n_ctx,
                    max_batch: prefill_per_step.min(PREFILL_CHUNK) + cfg.max_active,
                    max_seqs: cfg.max_active,
                    kv_pages: cfg.kv_pages,
                    top_k: GPU_TOP_K,
                    ..GpuModelOptions::default()
                };
                let gpu = GpuModel::from_model(Arc::new(ctx), model, gopts)
                    .map_err(|e| format!("loading the model onto the GPU: {e}"))?;
                let lose_after = std::env::var("TERNION_TEST_GPU_LOST_AFTER")
                    .ok()
                    .and_then(|v| v.parse().ok());
                Ok(Runner::Gpu {
                    gpu: Box::new(gpu),
                    lose_after,
                })
            }
            #[cfg(not(feature = "gpu"))]
            Device::Gpu(_) => {
                let _ = prefill_per_step;
                Err("this server was built without the GPU backend".into())
            }
        }
    }

    /// A KV cache for a new sequence.
    fn new_kv(&self, n_ctx: usize) -> ternion::Result<SeqKv> {
        match self {
            Runner::Cpu { pool, .. } => Ok(SeqKv::Cpu(KvSeq::new(pool.clone(), n_ctx))),
            #[cfg(feature = "gpu")]
            Runner::Gpu { gpu, .. } => gpu.new_seq().map(SeqKv::Gpu),
        }
    }

    /// Pages in use and pages in all.
    fn pages(&self) -> (usize, usize) {
        match self {
            Runner::Cpu { pool, .. } => (pool.pages_in_use(), pool.capacity()),
            #[cfg(feature = "gpu")]
            Runner::Gpu { gpu, .. } => gpu.kv_pages(),
        }
    }
}

/// A sequence's KV cache on the engine's backend.
enum SeqKv {
    Cpu(KvSeq),
    #[cfg(feature = "gpu")]
    Gpu(GpuSeq),
}

impl SeqKv {
    fn len(&self) -> usize {
        match self {
            SeqKv::Cpu(kv) => kv.len(),
            #[cfg(feature = "gpu")]
            SeqKv::Gpu(seq) => seq.len(),
        }
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

type LoadedModel = (Model, Arc<Tokenizer>, Receiver<Job>, usize);

fn load(cfg: &EngineConfig, shared: &Shared) -> Result<LoadedModel, String> {
    let path = cfg.model_path.display();
    let (file, model) =
        ternion::model::load(&cfg.model_path).map_err(|e| format!("loading {path}: {e}"))?;
    let tokenizer = Tokenizer::from_gguf(&file, &cfg.tokenizer)
        .map_err(|e| format!("reading the tokenizer of {path}: {e}"))?;
    let template = file
        .get_str("tokenizer.chat_template")
        .map_err(|e| format!("reading the chat template of {path}: {e}"))?;
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
        jobs,
    };
    let tokenizer = ready.tokenizer.clone();
    if shared.ready.set(ready).is_err() {
        return Err("the engine was started twice".into());
    }
    Ok((model, tokenizer, rx, n_ctx))
}

/// One sequence being generated.
struct Seq {
    job: Job,
    /// Its KV cache (pages from the shared pool, returned on drop).
    kv: SeqKv,
    /// Most positions of its cache.
    n_ctx: usize,
    /// Tokens evaluated into the cache, in order (penalties look at them).
    history: Vec<u32>,
    sampler: Sampler,
    /// Prompt tokens evaluated so far.
    fed: usize,
    /// Tokens handed to this iteration's forward pass (0: none this iteration).
    in_flight: usize,
    /// Finished, failed or cancelled: removed after this iteration.
    ended: bool,
    /// The token sampled last (the next decode input).
    last: u32,
    generated: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopFilter,
}

impl Seq {
    /// A sequence for `job` with the cache `runner` makes; when its sampler settings are
    /// invalid or no cache is left, the job is answered with the error and dropped.
    fn new(runner: &Runner<'_>, n_ctx: usize, job: Job) -> Option<Seq> {
        let made = Sampler::new(job.sampler.clone())
            .map_err(|e| (400, e.to_string()))
            .and_then(|s| Ok((s, runner.new_kv(n_ctx).map_err(|e| (503, e.to_string()))?)));
        let (sampler, kv) = match made {
            Ok(m) => m,
            Err((status, message)) => {
                let _ = job.events.send(Event::Error { status, message });
                return None;
            }
        };
        Some(Seq {
            kv,
            n_ctx,
            history: Vec::with_capacity(n_ctx),
            sampler,
            fed: 0,
            in_flight: 0,
            ended: false,
            last: 0,
            generated: Vec::new(),
            decoder: StreamDecoder::new(),
            stop: StopFilter::new(job.stop.clone()),
            job,
        })
    }

    /// Plans this iteration's step: the token sampled last, or the next prompt chunk (at
    /// most [`PREFILL_CHUNK`] tokens) taken from the iteration's prompt `budget`. A prompt
    /// is never split so that a chunk of one token remains (a single token runs with decode
    /// numerics), so chunked prompts give the same logits as one whole batch. Returns
    /// whether the sequence runs this iteration.
    fn plan(&mut self, budget: &mut usize) -> bool {
        self.in_flight = if self.fed < self.job.prompt.len() {
            let left = self.job.prompt.len() - self.fed;
            let mut n = left.min(PREFILL_CHUNK).min(*budget);
            if n < left && (n < 2 || left - n == 1) {
                n = if n >= 3 { n - 1 } else { 0 };
            }
            *budget -= n;
            n
        } else {
            1
        };
        self.in_flight > 0
    }

    /// This sequence's cache and the tokens of its part of the forward pass.
    fn step_parts(&mut self) -> (&mut SeqKv, &[u32]) {
        let tokens = if self.fed < self.job.prompt.len() {
            &self.job.prompt[self.fed..self.fed + self.in_flight]
        } else {
            std::slice::from_ref(&self.last)
        };
        (&mut self.kv, tokens)
    }

    fn send(&self, ev: Event) {
        // A closed receiver is noticed before the next iteration.
        let _ = self.job.events.send(ev);
    }

    fn send_text(&self, text: String) {
        if !text.is_empty() {
            self.send(Event::Text(text));
        }
    }

    /// After a successful forward pass with `logits` as its last row: samples the next
    /// token when the prompt is in. Returns `true` when the sequence has ended (its `Done`
    /// event is sent).
    fn advance(&mut self, row: Row<'_>, tok: &Tokenizer, m: &Metrics) -> bool {
        if self.fed < self.job.prompt.len() {
            self.history
                .extend_from_slice(&self.job.prompt[self.fed..self.fed + self.in_flight]);
        } else {
            self.history.push(self.last);
        }
        if self.fed < self.job.prompt.len() {
            self.fed += self.in_flight;
            m.prompt_tokens_total
                .fetch_add(self.in_flight as u64, Relaxed);
            if self.fed < self.job.prompt.len() {
                return false;
            }
        }
        let id = match row {
            Row::Logits(logits) => self.sampler.sample(logits, &self.history),
            Row::Top(top) => self.sampler.sample_top(top),
        };
        if self.generated.is_empty() {
            m.observe_ttft(self.job.arrived.elapsed());
        }
        if tok.is_eog(id) && !self.job.ignore_eos {
            self.finish(FinishReason::Stop, false);
            return true;
        }
        self.generated.push(id);
        m.generated_tokens_total.fetch_add(1, Relaxed);
        let piece = self.decoder.push(tok, id);
        let f = self.stop.push(&piece);
        self.send(Event::Token { id, text: f.text });
        if f.stopped {
            self.finish(FinishReason::Stop, true);
            return true;
        }
        if self.generated.len() >= self.job.max_tokens || self.n_ctx - self.kv.len() <= 1 {
            self.finish(FinishReason::Length, false);
            return true;
        }
        self.last = id;
        false
    }

    fn finish(&mut self, mut reason: FinishReason, stopped: bool) {
        if !stopped {
            let rest = self.decoder.finish();
            let f = self.stop.push(&rest);
            self.send_text(f.text);
            if f.stopped {
                reason = FinishReason::Stop;
            } else {
                let held = self.stop.finish();
                self.send_text(held);
            }
        }
        let tokens = std::mem::take(&mut self.generated);
        self.send(Event::Done(Done {
            finish: reason,
            prompt_tokens: self.job.prompt.len(),
            completion_tokens: tokens.len(),
            tokens,
        }));
    }
}

/// What a forward pass hands each sequence to sample from.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "gpu"), allow(dead_code))] // `Top` comes from the GPU
enum Row<'a> {
    /// Its whole logits row.
    Logits(&'a [f32]),
    /// The best (id, logit) pairs of its row, best first (the GPU top-k).
    Top(&'a [(u32, f32)]),
}

/// The rows of one forward pass, one per sequence.
#[cfg_attr(not(feature = "gpu"), allow(dead_code))] // `Logits` and `Top` come from the GPU
enum Rows<'a> {
    /// The CPU workspace's rows, where the graph puts them (not copied).
    Cpu(&'a Workspace, &'a Graph),
    /// `n_vocab` logits per sequence, back to back.
    Logits(Vec<f32>),
    /// The top-k pairs of each sequence.
    Top(Vec<Vec<(u32, f32)>>),
}

impl Rows<'_> {
    fn get(&self, i: usize, vocab: usize) -> Row<'_> {
        match self {
            Rows::Cpu(ws, graph) => Row::Logits(ws.logits(graph, i)),
            Rows::Logits(l) => Row::Logits(&l[i * vocab..(i + 1) * vocab]),
            Rows::Top(t) => Row::Top(&t[i]),
        }
    }
}

/// Samples the next token of every sequence of a pass from its row. Sampling a whole
/// 128k-vocabulary row costs about a millisecond, so many sequences are sampled on several
/// threads (the forward pass is done: the cores are free).
fn advance_all(
    group: &mut [&mut Seq],
    rows: &Rows<'_>,
    vocab: usize,
    tok: &Tokenizer,
    m: &Metrics,
) {
    let one = |s: &mut Seq, row: Row<'_>| {
        if s.advance(row, tok, m) {
            m.finished_total.fetch_add(1, Relaxed);
            s.ended = true;
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = group.len().div_ceil(threads.max(1)).max(2);
    if matches!(rows, Rows::Top(_)) || group.len() <= per {
        for (i, s) in group.iter_mut().enumerate() {
            one(s, rows.get(i, vocab));
        }
        return;
    }
    std::thread::scope(|sc| {
        for (c, seqs) in group.chunks_mut(per).enumerate() {
            sc.spawn(move || {
                for (j, s) in seqs.iter_mut().enumerate() {
                    one(s, rows.get(c * per + j, vocab));
                }
            });
        }
    });
}

/// Measures generated tokens per second over windows of about a second.
struct RateWindow {
    start: Instant,
    tokens_at_start: u64,
}

impl RateWindow {
    fn new(m: &Metrics) -> Self {
        RateWindow {
            start: Instant::now(),
            tokens_at_start: m.generated_tokens_total.load(Relaxed),
        }
    }

    fn tick(&mut self, m: &Metrics) {
        let dt = self.start.elapsed();
        if dt >= Duration::from_secs(1) {
            let now = m.generated_tokens_total.load(Relaxed);
            m.set_tokens_per_second((now - self.tokens_at_start) as f64 / dt.as_secs_f64());
            *self = RateWindow::new(m);
        }
    }
}

/// The scheduler: admits jobs, steps the active sequences, retires them.
struct Scheduler<'m> {
    tok: &'m Tokenizer,
    runner: Runner<'m>,
    n_vocab: usize,
    n_ctx: usize,
    max_active: usize,
    batching: Batching,
    prefill_per_step: usize,
}

impl Scheduler<'_> {
    /// The scheduler loop. Returns once shutdown was asked for and no sequence is left, or
    /// when every queue sender is gone.
    fn run(&mut self, rx: &Receiver<Job>, shared: &Shared) {
        let m = &shared.metrics;
        let mut active: Vec<Seq> = Vec::new();
        let mut rate = RateWindow::new(m);
        loop {
            rate.tick(m);
            let shutting = shared.shutdown.load(Acquire);
            if !self.admit(rx, shutting, &mut active, m) {
                return;
            }
            if shutting && shared.cancel_all.load(Acquire) {
                for s in active.drain(..) {
                    m.cancelled_total.fetch_add(1, Relaxed);
                    s.send(Event::Error {
                        status: 503,
                        message: "the server is shutting down".into(),
                    });
                }
            }
            // Clients that went away: dropping the sequence frees its KV pages.
            active.retain(|s| {
                let gone = s.job.events.is_closed();
                if gone {
                    m.cancelled_total.fetch_add(1, Relaxed);
                }
                !gone
            });
            self.publish(active.len(), m);
            if active.is_empty() {
                if shutting {
                    return;
                }
                continue;
            }
            let mut budget = self.prefill_per_step;
            let mut stepping: Vec<&mut Seq> = active
                .iter_mut()
                .filter_map(|s| s.plan(&mut budget).then_some(s))
                .collect();
            let group = match self.batching {
                Batching::Stacked => stepping.len().max(1),
                Batching::OneByOne => 1,
            };
            for g in stepping.chunks_mut(group) {
                if let Err(e) = self.forward(g, m) {
                    drop(stepping);
                    self.fail(e, rx, &mut active, shared);
                    return;
                }
            }
            m.engine_steps_total.fetch_add(1, Relaxed);
            active.retain(|s| !s.ended);
            self.publish(active.len(), m);
        }
    }

    /// Admits queued jobs into free slots (or, when shutting down, answers them 503).
    /// Returns `false` when every queue sender is gone.
    fn admit(
        &self,
        rx: &Receiver<Job>,
        shutting: bool,
        active: &mut Vec<Seq>,
        m: &Metrics,
    ) -> bool {
        loop {
            if shutting {
                while let Ok(job) = rx.try_recv() {
                    m.queue_length.fetch_sub(1, Relaxed);
                    m.cancelled_total.fetch_add(1, Relaxed);
                    let _ = job.events.send(Event::Error {
                        status: 503,
                        message: "the server is shutting down".into(),
                    });
                }
                return true;
            }
            if active.len() >= self.max_active {
                return true;
            }
            let job = if active.is_empty() {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(j) => j,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => return true,
                    Err(TryRecvError::Disconnected) => return false,
                }
            };
            m.queue_length.fetch_sub(1, Relaxed);
            if job.events.is_closed() {
                m.cancelled_total.fetch_add(1, Relaxed);
                continue;
            }
            match Seq::new(&self.runner, self.n_ctx, job) {
                Some(s) => active.push(s),
                None => {
                    m.failed_total.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Runs one forward pass over `group` and advances each sequence. When the pass fails,
    /// each sequence is retried alone, so only the one at fault ends (with its error). A
    /// GPU fault is returned: the engine cannot go on.
    fn forward(&mut self, group: &mut [&mut Seq], m: &Metrics) -> Result<(), ternion::Error> {
        m.forward_passes_total.fetch_add(1, Relaxed);
        let vocab = self.n_vocab;
        let result = match &mut self.runner {
            Runner::Cpu { model, ws, .. } => {
                let steps: Result<Vec<SeqStep<'_>>, _> = group
                    .iter_mut()
                    .map(|s| match s.step_parts() {
                        (SeqKv::Cpu(kv), tokens) => Ok(SeqStep {
                            kv,
                            tokens,
                            logits: Logits::Last,
                        }),
                        #[cfg(feature = "gpu")]
                        (SeqKv::Gpu(_), _) => Err(ternion::Error::Request(
                            "a GPU cache in the CPU engine".into(),
                        )),
                    })
                    .collect();
                let model: &Model = model;
                steps
                    .and_then(|mut steps| model.forward_batch(&mut steps, ws))
                    .map(|()| Rows::Cpu(ws, model.graph()))
            }
            #[cfg(feature = "gpu")]
            Runner::Gpu { gpu, lose_after } => {
                if let Some(n) = lose_after {
                    if *n == 0 {
                        gpu.context().device.destroy();
                    }
                    *n = n.saturating_sub(1);
                }
                // The k best of each row are all the samplers need unless one of them has
                // penalties or looks past the top-k.
                let k = GPU_TOP_K as usize;
                let top = group.iter().all(|s| s.sampler.needs_only_top(k));
                let steps: Vec<GpuSeqStep<'_>> = group
                    .iter_mut()
                    .map(|s| match s.step_parts() {
                        (SeqKv::Gpu(seq), tokens) => Ok(GpuSeqStep { seq, tokens }),
                        (SeqKv::Cpu(_), _) => {
                            Err(ternion::Error::Gpu("a CPU cache in the GPU engine".into()))
                        }
                    })
                    .collect::<Result<_, _>>()?;
                if top {
                    gpu.forward_seqs_topk(&steps).map(Rows::Top)
                } else {
                    gpu.forward_seqs(&steps).map(Rows::Logits)
                }
            }
        };
        match result {
            Ok(rows) => advance_all(group, &rows, vocab, self.tok, m),
            Err(e @ ternion::Error::Gpu(_)) => return Err(e),
            Err(_) if group.len() > 1 => {
                for s in group.iter_mut() {
                    self.forward(std::slice::from_mut(s), m)?;
                }
            }
            Err(e) => {
                m.failed_total.fetch_add(1, Relaxed);
                let status = match e {
                    ternion::Error::KvPoolExhausted { .. } => 503,
                    _ => 500,
                };
                group[0].send(Event::Error {
                    status,
                    message: format!("generation failed: {e}"),
                });
                group[0].ended = true;
            }
        }
        Ok(())
    }

    /// The engine cannot go on (`e`, a GPU fault): answers every sequence and queued
    /// request with 503 and the reason, and marks the server unhealthy.
    fn fail(&self, e: ternion::Error, rx: &Receiver<Job>, active: &mut Vec<Seq>, shared: &Shared) {
        let reason = format!("the engine stopped: {e}");
        eprintln!("ternion-server: {reason}");
        let _ = shared.failed.set(reason.clone());
        let m = &shared.metrics;
        m.model_loaded.store(false, Relaxed);
        for s in active.drain(..) {
            m.failed_total.fetch_add(1, Relaxed);
            s.send(Event::Error {
                status: 503,
                message: reason.clone(),
            });
        }
        while let Ok(job) = rx.try_recv() {
            m.queue_length.fetch_sub(1, Relaxed);
            m.failed_total.fetch_add(1, Relaxed);
            let _ = job.events.send(Event::Error {
                status: 503,
                message: reason.clone(),
            });
        }
        self.publish(0, m);
    }

    /// Publishes the active-sequence and KV-page gauges.
    fn publish(&self, active: usize, m: &Metrics) {
        m.active_sequences.store(active as u64, Relaxed);
        m.kv_pages_in_use
            .store(self.runner.pages().0 as u64, Relaxed);
    }
}
