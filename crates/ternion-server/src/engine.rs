//! The engine: one dedicated thread owns the model and steps every active sequence.
//!
//! Requests arrive through a bounded queue ([`Job`]s on a `sync_channel`). Between two
//! iterations the engine admits queued jobs while fewer than `max_active` sequences run;
//! each admitted job gets its own [`Session`] (its own KV cache of `n_ctx` positions).
//! One iteration builds one [`Step`] per active sequence (a chunk of its prompt, or the
//! token it sampled last), hands the whole set to a [`ForwardBatch`] in one call, then
//! samples the next token of every sequence whose prompt is in. Today's implementation,
//! [`OneByOne`], runs the steps one after the other (round robin, one token per sequence
//! per iteration); a batched forward pass can replace it without touching the scheduler.
//!
//! A sequence whose client went away (its event receiver was dropped) is removed before
//! the next iteration; dropping it drops its `Session` and so frees its KV cache.

use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use ternion::chat::ChatTemplate;
use ternion::model::Model;
use ternion::sample::{Sampler, SamplerConfig};
use ternion::session::{FinishReason, Session, PREFILL_CHUNK};
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
    /// Newly generated text (never empty).
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
}

/// The input of one sequence to one forward pass.
pub struct Step<'a, 'm> {
    /// The sequence's session (model reference and KV cache).
    pub session: &'a mut Session<'m>,
    /// Tokens to evaluate: a chunk of the prompt, or the one token sampled last.
    pub tokens: &'a [u32],
}

/// Runs one forward pass for a set of sequences. After it returns `Ok` for a step, that
/// step's `session.last_logits()` are the logits of its last token.
///
/// This is the seam for batched decoding: an implementation backed by a model call such
/// as `forward_batch(&mut [seq])` evaluates every step in one pass over the weights.
pub trait ForwardBatch {
    /// Evaluates every step; one result per step, in order.
    fn forward_batch(&mut self, steps: &mut [Step<'_, '_>]) -> Vec<ternion::Result<()>>;
}

/// Today's forward: each sequence in turn, through [`Session::prefill`].
pub struct OneByOne;

impl ForwardBatch for OneByOne {
    fn forward_batch(&mut self, steps: &mut [Step<'_, '_>]) -> Vec<ternion::Result<()>> {
        steps
            .iter_mut()
            .map(|s| s.session.prefill(s.tokens).map(|_| ()))
            .collect()
    }
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
            shared.metrics.model_loaded.store(true, Relaxed);
            let _ = loaded.send(Ok(()));
            run(
                &model,
                &tokenizer,
                &rx,
                n_ctx,
                cfg.max_active,
                &shared,
                &mut OneByOne,
            );
        })
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
struct Seq<'m> {
    job: Job,
    session: Session<'m>,
    sampler: Sampler,
    /// Prompt tokens evaluated so far.
    fed: usize,
    /// Tokens handed to the current forward pass.
    in_flight: usize,
    /// The token sampled last (the next decode input).
    last: u32,
    generated: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopFilter,
}

impl<'m> Seq<'m> {
    /// A sequence for `job`; when its sampler settings are invalid, the job is answered
    /// with the error and dropped.
    fn new(model: &'m Model, n_ctx: usize, job: Job) -> Option<Seq<'m>> {
        let sampler = match Sampler::new(job.sampler.clone()) {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Error {
                    status: 400,
                    message: e.to_string(),
                });
                return None;
            }
        };
        Some(Seq {
            session: Session::new(model, n_ctx),
            sampler,
            fed: 0,
            in_flight: 0,
            last: 0,
            generated: Vec::new(),
            decoder: StreamDecoder::new(),
            stop: StopFilter::new(job.stop.clone()),
            job,
        })
    }

    /// This sequence's input to the next forward pass.
    fn step(&mut self) -> Step<'_, 'm> {
        let tokens = if self.fed < self.job.prompt.len() {
            let end = (self.fed + PREFILL_CHUNK).min(self.job.prompt.len());
            &self.job.prompt[self.fed..end]
        } else {
            std::slice::from_ref(&self.last)
        };
        self.in_flight = tokens.len();
        Step {
            session: &mut self.session,
            tokens,
        }
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

    /// After a successful forward pass: samples the next token when the prompt is in.
    /// Returns `true` when the sequence has ended (its `Done` event is sent).
    fn advance(&mut self, tok: &Tokenizer, m: &Metrics) -> bool {
        if self.fed < self.job.prompt.len() {
            self.fed += self.in_flight;
            m.prompt_tokens_total
                .fetch_add(self.in_flight as u64, Relaxed);
            if self.fed < self.job.prompt.len() {
                return false;
            }
        }
        let id = self
            .sampler
            .sample(self.session.last_logits(), self.session.tokens());
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
        self.send_text(f.text);
        if f.stopped {
            self.finish(FinishReason::Stop, true);
            return true;
        }
        if self.generated.len() >= self.job.max_tokens || self.session.room() <= 1 {
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

/// The scheduler loop. Returns once shutdown was asked for and no sequence is left, or
/// when every queue sender is gone.
pub fn run(
    model: &Model,
    tok: &Tokenizer,
    rx: &Receiver<Job>,
    n_ctx: usize,
    max_active: usize,
    shared: &Shared,
    forward: &mut dyn ForwardBatch,
) {
    let m = &shared.metrics;
    let mut active: Vec<Seq<'_>> = Vec::new();
    let mut rate = RateWindow::new(m);
    loop {
        rate.tick(m);
        let shutting = shared.shutdown.load(Acquire);
        // Admit queued jobs into free slots.
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
                break;
            }
            if active.len() >= max_active {
                break;
            }
            let job = if active.is_empty() {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(j) => j,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            };
            m.queue_length.fetch_sub(1, Relaxed);
            if job.events.is_closed() {
                m.cancelled_total.fetch_add(1, Relaxed);
                continue;
            }
            match Seq::new(model, n_ctx, job) {
                Some(s) => active.push(s),
                None => {
                    m.failed_total.fetch_add(1, Relaxed);
                }
            }
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
        // Clients that went away: dropping the sequence frees its KV cache.
        active.retain(|s| {
            let gone = s.job.events.is_closed();
            if gone {
                m.cancelled_total.fetch_add(1, Relaxed);
            }
            !gone
        });
        m.active_sequences.store(active.len() as u64, Relaxed);
        if active.is_empty() {
            if shutting {
                return;
            }
            continue;
        }
        let results = {
            let mut steps: Vec<Step<'_, '_>> = active.iter_mut().map(Seq::step).collect();
            forward.forward_batch(&mut steps)
        };
        m.engine_steps_total.fetch_add(1, Relaxed);
        let mut results = results.into_iter();
        active.retain_mut(|s| match results.next() {
            Some(Ok(())) => {
                let ended = s.advance(tok, m);
                if ended {
                    m.finished_total.fetch_add(1, Relaxed);
                }
                !ended
            }
            Some(Err(e)) => {
                m.failed_total.fetch_add(1, Relaxed);
                s.send(Event::Error {
                    status: 500,
                    message: format!("generation failed: {e}"),
                });
                false
            }
            None => {
                m.failed_total.fetch_add(1, Relaxed);
                s.send(Event::Error {
                    status: 500,
                    message: "the forward pass returned no result for this sequence".into(),
                });
                false
            }
        });
        m.active_sequences.store(active.len() as u64, Relaxed);
    }
}
