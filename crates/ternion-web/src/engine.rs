//! One sequence on a loaded model: the asynchronous generation loop the browser API drives
//! (native tests drive the same code). The forward pass is the core crate's: the GPU plan
//! ([`GpuModel`]) or, for small files, the CPU model ([`Model`]). On the GPU, greedy
//! decode steps are chained as natively ([`GpuModel::greedy_chain`]: the ids come back a
//! few steps at a time) and sampled steps read back only the top-k where that suffices.

use std::future::Future;

use ternion::backend::cpu::CpuState;
use ternion::backend::gpu::GpuModel;
use ternion::generate::{
    Advance, End, FinishReason, Need, Row, Stepper, StepperOptions, PREFILL_CHUNK,
};
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

    /// Pairs of the GPU top-k a decode step can read back instead of a whole row (0: none,
    /// on the CPU).
    fn top_k(&self) -> usize {
        match self {
            Backend::Gpu(g) => g.top_k(),
            Backend::Cpu(_) => 0,
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
    /// Chained greedy steps and top-k read-backs on the GPU ([`Engine::set_chained`]).
    chained: bool,
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
            chained: true,
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

    /// On (the default), the GPU backend chains greedy decode steps (each argmax feeds the
    /// next step on the GPU, the ids come back a few steps at a time, steps past the end
    /// are discarded) and a sampled step reads back only the top-k where the sampler draws
    /// from it exactly as from the whole row. Off, every decode step reads back its argmax
    /// or its whole logits row before the next one runs. Both give the same tokens and
    /// leave the same cache; off is there to compare them.
    pub fn set_chained(&mut self, on: bool) {
        self.chained = on;
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
        let ran = self
            .steps(host, &mut st, max_tokens, &mut out, t0, &mut on_token)
            .await;
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

    /// Steps `st` to its end: prompt chunks, then the decode steps (the host's event loop
    /// runs before each, and between the batches of chained greedy steps). With
    /// [`Engine::set_chained`] on (the default) the GPU chains greedy steps
    /// ([`chained`]) and a sampled step reads back only the top-k when the sampler draws
    /// from it exactly as from the whole row; otherwise each step reads back its argmax or
    /// its whole logits row.
    async fn steps<H: Host>(
        &mut self,
        host: &H,
        st: &mut Stepper<&mut Sampler>,
        max_tokens: usize,
        out: &mut Generated,
        t0: f64,
        on_token: &mut impl FnMut(Option<u32>, &str) -> bool,
    ) -> Result<End> {
        let top_k = if self.chained {
            self.backend.top_k()
        } else {
            0
        };
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
                let (logits, top);
                let row = match (st.need(top_k, false), &mut self.backend) {
                    (Need::Argmax, Backend::Gpu(g)) if self.chained => {
                        let max = max_tokens.saturating_sub(st.generated().len());
                        match chained(g, host, &self.tokenizer, st, max, out, on_token).await? {
                            Some(end) => return Ok(end),
                            None => continue,
                        }
                    }
                    (Need::Argmax, b) => Row::Argmax(b.argmax(id).await?),
                    (Need::Top, Backend::Gpu(g)) => {
                        top = g.topk_step_async(id).await?;
                        Row::Top(&top)
                    }
                    (_, b) => {
                        logits = b.logits(&[id]).await?;
                        Row::Logits(&logits)
                    }
                };
                st.advance(row, &self.tokenizer)
            };
            if let Some(end) = emit(st, adv, out, on_token) {
                return Ok(end);
            }
        }
    }
}

/// Hands a step's drawn token and its text to `on_token` (and `out`); returns the end of
/// the sequence: the step's, or a cancellation when `on_token` returned false.
fn emit(
    st: &mut Stepper<&mut Sampler>,
    adv: Advance,
    out: &mut Generated,
    on_token: &mut impl FnMut(Option<u32>, &str) -> bool,
) -> Option<End> {
    if let (Some(id), Some(text)) = (adv.drawn, &adv.text) {
        out.text.push_str(text);
        if !on_token(Some(id), text) {
            return Some(st.cancel(adv.end));
        }
    }
    adv.end
}

/// Greedy decode steps chained on the GPU ([`GpuModel::greedy_chain`], as native greedy
/// decoding runs them): at most `max` steps from the token `st` planned, their ids back a
/// batch at a time, each handed to `st` and `on_token` in order as one
/// `argmax_step` per token would be; the host's event loop runs between batches. At the
/// end of the sequence the steps past it are discarded, so the cache holds exactly the
/// tokens `st` evaluated. Returns that end, or `None` when the steps ran out first.
async fn chained<H: Host>(
    g: &mut GpuModel,
    host: &H,
    tok: &Tokenizer,
    st: &mut Stepper<&mut Sampler>,
    max: usize,
    out: &mut Generated,
    on_token: &mut impl FnMut(Option<u32>, &str) -> bool,
) -> Result<Option<End>> {
    let mut chain = g.greedy_chain(st.tokens()[0], max)?;
    let mut kept = 0;
    loop {
        let ids = chain.next_ids().await?;
        if ids.is_empty() {
            return match kept {
                0 => Err(Error::Request(
                    "no room for a greedy step (token budget or context spent)".into(),
                )),
                _ => Ok(None),
            };
        }
        for id in ids {
            kept += 1;
            let adv = st.advance(Row::Argmax(id), tok);
            if let Some(end) = emit(st, adv, out, on_token) {
                chain.finish(kept)?;
                return Ok(Some(end));
            }
            st.plan(&mut usize::MAX.clone());
        }
        host.pause().await;
    }
}
