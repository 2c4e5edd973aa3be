//! One sequence on a loaded model: the asynchronous generation loop the browser API drives
//! (native tests drive the same code). The forward pass is the core crate's: the GPU plan
//! ([`GpuModel`]) or, for small files, the CPU model ([`Model`]).

use std::future::Future;

use ternion::backend::cpu::CpuState;
use ternion::backend::gpu::GpuModel;
use ternion::generate::{End, FinishReason, Need, Row, Stepper, StepperOptions, PREFILL_CHUNK};
use ternion::model::{Logits, Model};
use ternion::sample::Sampler;
use ternion::tokenizer::Tokenizer;
use ternion::{Error, Result};

/// What the engine needs from its host: a clock and a way to let the host's event loop
/// run between tokens (a browser tab stays responsive and a `stop` call gets through).
pub trait Host {
    /// Milliseconds since an arbitrary origin.
    fn now_ms(&self) -> f64;
    /// Returns after the host has had a chance to run other work.
    fn pause(&self) -> impl Future<Output = ()>;
}

/// The forward pass a sequence runs on.
pub enum Backend {
    /// The WebGPU (or native wgpu) plan; the KV cache lives on the device.
    Gpu(Box<GpuModel>),
    /// The CPU model with its sequence state (whole file in memory: small models only).
    Cpu(Box<CpuSeq>),
}

/// A sequence on the CPU model.
pub struct CpuSeq {
    /// The model.
    pub model: Model,
    /// Its KV cache and scratch.
    pub state: CpuState,
    /// Positions the state holds.
    pub n_ctx: usize,
}

impl Backend {
    /// "webgpu" or "cpu".
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Gpu(_) => "webgpu",
            Backend::Cpu(_) => "cpu",
        }
    }

    /// Positions a sequence may hold.
    pub fn n_ctx(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.n_ctx(),
            Backend::Cpu(c) => c.n_ctx,
        }
    }

    /// The model's vocabulary size (rows of its LM head).
    pub fn n_vocab(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.config().n_vocab,
            Backend::Cpu(c) => c.model.config().n_vocab,
        }
    }

    /// Most tokens one forward pass takes (prompts run in chunks of at most this many).
    fn max_chunk(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.max_batch().min(PREFILL_CHUNK),
            Backend::Cpu(_) => PREFILL_CHUNK,
        }
    }

    /// Feeds `tokens` after those already cached and returns the last one's logits.
    async fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self {
            Backend::Gpu(g) => g.forward_async(tokens, Logits::Last).await,
            Backend::Cpu(c) => Ok(c
                .model
                .forward_cpu(tokens, Logits::Last, &mut c.state)?
                .to_vec()),
        }
    }

    /// Feeds one token and returns the argmax of its logits (on the GPU only the id comes
    /// back).
    async fn argmax(&mut self, token: u32) -> Result<u32> {
        match self {
            Backend::Gpu(g) => g.argmax_step_async(token).await,
            Backend::Cpu(_) => Ok(ternion::sample::argmax(&self.logits(&[token]).await?)),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            Backend::Gpu(g) => g.truncate(len),
            Backend::Cpu(c) => c.state.truncate(len),
        }
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model produced an end-of-generation token.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The context is full.
    Context,
    /// The token callback asked to stop.
    Cancelled,
}

impl From<FinishReason> for Finish {
    fn from(r: FinishReason) -> Finish {
        match r {
            FinishReason::Stop => Finish::Stop,
            FinishReason::Length => Finish::Length,
            FinishReason::Context => Finish::Context,
            FinishReason::Cancelled => Finish::Cancelled,
        }
    }
}

impl Finish {
    /// "stop", "length", "context" or "cancelled".
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Context => "context",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// What one [`Engine::generate`] call did.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Tokens fed before the first new one (the prompt, plus a token left pending by the
    /// previous call).
    pub prompt_tokens: Vec<u32>,
    /// The new tokens, in order (an end-of-generation token is not included).
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
    /// Milliseconds spent on the prompt (up to the first new token).
    pub prompt_ms: f64,
    /// Milliseconds spent decoding the rest.
    pub decode_ms: f64,
}

impl Generated {
    /// Decode speed: tokens after the first, per second (0 when there were none).
    pub fn decode_tok_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || self.decode_ms <= 0.0 {
            0.0
        } else {
            n as f64 * 1e3 / self.decode_ms
        }
    }

    /// Prompt speed in tokens per second.
    pub fn prompt_tok_s(&self) -> f64 {
        if self.prompt_ms <= 0.0 {
            0.0
        } else {
            self.prompt_tokens.len() as f64 * 1e3 / self.prompt_ms
        }
    }
}

/// A model, its tokenizer and one sequence.
pub struct Engine {
    tokenizer: Tokenizer,
    backend: Backend,
    /// Every token fed to the model so far.
    fed: Vec<u32>,
    /// The last sampled token of a generation that stopped before feeding it.
    pending: Option<u32>,
    /// Stop strings of [`Engine::generate`].
    stops: Vec<String>,
}

impl Engine {
    /// A new, empty sequence.
    pub fn new(tokenizer: Tokenizer, backend: Backend) -> Engine {
        Engine {
            tokenizer,
            backend,
            fed: Vec::new(),
            pending: None,
            stops: Vec::new(),
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The forward pass in use.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The forward pass, to drive directly (the benchmark).
    pub(crate) fn backend_mut(&mut self) -> &mut Backend {
        &mut self.backend
    }

    /// Tokens fed so far.
    pub fn fed(&self) -> &[u32] {
        &self.fed
    }

    /// Encodes `text` as the continuation of this sequence (BOS only at its start, when the
    /// model wants one; special tokens are parsed).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let bos = self.fed.is_empty() && self.pending.is_none() && self.tokenizer.add_bos();
        Ok(self.tokenizer.encode(text, bos, true)?)
    }

    /// Stop strings for the following generations: one ends before the first of them,
    /// which is not emitted (none by default).
    pub fn set_stops(&mut self, stops: Vec<String>) {
        self.stops = stops;
    }

    /// Forgets the sequence.
    pub fn reset(&mut self) {
        self.fed.clear();
        self.pending = None;
        self.backend.truncate(0);
    }

    /// Feeds `prompt` and generates up to `max_tokens` tokens, calling
    /// `on_token(Some(id), text)` with each new token and the newly complete text (and
    /// `on_token(None, rest)` for bytes completed at the end); `on_token` returning `false`
    /// stops. The sequence continues across calls until [`Engine::reset`].
    pub async fn generate<H: Host>(
        &mut self,
        host: &H,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        ignore_eos: bool,
        mut on_token: impl FnMut(Option<u32>, &str) -> bool,
    ) -> Result<Generated> {
        let input: Vec<u32> = self.pending.iter().chain(prompt).copied().collect();
        if input.is_empty() {
            return Err(Error::Request(
                "nothing to feed: the prompt is empty".into(),
            ));
        }
        let n_ctx = self.backend.n_ctx();
        if self.fed.len() + input.len() >= n_ctx {
            return Err(Error::Request(format!(
                "{} tokens in the sequence + {} new leave no room in the context of {n_ctx} \
                 (reset to start over)",
                self.fed.len(),
                input.len()
            )));
        }
        self.pending = None;
        let rules = StepperOptions {
            max_tokens,
            ignore_eos,
            stop: self.stops.clone(),
            n_ctx,
            max_chunk: self.backend.max_chunk(),
        };
        let history = std::mem::take(&mut self.fed);
        let mut st = Stepper::new(sampler, (), history, input.clone(), rules);
        let mut out = Generated {
            prompt_tokens: input,
            tokens: Vec::new(),
            text: String::new(),
            finish: Finish::Length,
            prompt_ms: 0.0,
            decode_ms: 0.0,
        };
        let t0 = host.now_ms();
        let ran = self.steps(host, &mut st, &mut out, t0, &mut on_token).await;
        out.decode_ms = host.now_ms() - t0 - out.prompt_ms;
        out.tokens = st.take_generated();
        let (history, last) = st.into_parts();
        self.fed = history;
        self.pending = last;
        let end = ran?;
        if !end.text.is_empty() {
            on_token(None, &end.text);
            out.text.push_str(&end.text);
        }
        out.finish = end.finish.into();
        Ok(out)
    }

    /// Steps `st` to its end: prompt chunks, then one token per step (the host's event
    /// loop runs before each).
    async fn steps<H: Host>(
        &mut self,
        host: &H,
        st: &mut Stepper<&mut Sampler>,
        out: &mut Generated,
        t0: f64,
        on_token: &mut impl FnMut(Option<u32>, &str) -> bool,
    ) -> Result<End> {
        loop {
            st.plan(&mut usize::MAX.clone());
            let adv = if st.in_prompt() {
                let logits = self.backend.logits(st.tokens()).await?;
                let adv = st.advance(Row::Logits(&logits), &self.tokenizer);
                out.prompt_ms = host.now_ms() - t0;
                adv
            } else {
                host.pause().await;
                let id = st.tokens()[0];
                match st.need(0, false) {
                    Need::Argmax => {
                        let best = self.backend.argmax(id).await?;
                        st.advance(Row::Argmax(best), &self.tokenizer)
                    }
                    Need::Top | Need::Logits => {
                        let logits = self.backend.logits(&[id]).await?;
                        st.advance(Row::Logits(&logits), &self.tokenizer)
                    }
                }
            };
            if let (Some(id), Some(text)) = (adv.drawn, &adv.text) {
                out.text.push_str(text);
                if !on_token(Some(id), text) {
                    return Ok(st.cancel(adv.end));
                }
            }
            if let Some(end) = adv.end {
                return Ok(end);
            }
        }
    }
}
