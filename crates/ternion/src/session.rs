//! A sequence being generated: prefill the prompt in batches, decode one token at a time,
//! sample, stop on end-of-generation or a length limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::cpu::CpuState;
use crate::kv::KvPool;
use crate::model::{Logits, Model};
use crate::sample::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::Result;

/// Largest number of prompt tokens evaluated as one batch.
pub const PREFILL_CHUNK: usize = 512;

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token was sampled.
    Stop,
    /// The token budget or the context ran out.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI-style name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Timings and counts of one `generate` call.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    /// Tokens evaluated in the prefill (the new prompt part).
    pub prompt_tokens: usize,
    /// Time spent in prefill.
    pub prompt_time: Duration,
    /// Tokens generated (sampled), end-of-generation token excluded.
    pub generated: Vec<u32>,
    /// Time spent decoding after the first sampled token.
    pub decode_time: Duration,
    /// Single-token forward passes run.
    pub decode_steps: usize,
    /// Why it stopped.
    pub finish: FinishReason,
}

impl GenerationStats {
    /// Prompt tokens per second.
    pub fn prompt_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Decode tokens per second.
    pub fn decode_tok_s(&self) -> f64 {
        self.decode_steps as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Options for [`Session::generate`].
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to sample.
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

/// What runs a sequence's forward passes and holds its KV cache: the CPU, or a GPU.
pub trait Engine {
    /// Vocabulary size (width of a logits row).
    fn n_vocab(&self) -> usize;
    /// Runs `tokens` after the cached positions as one batch and returns the requested rows
    /// of logits.
    fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]>;
    /// The logits rows of the last forward pass (empty before the first).
    fn logits(&self) -> &[f32];
    /// Positions cached.
    fn len(&self) -> usize;
    /// True when nothing is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions the cache can hold.
    fn n_ctx(&self) -> usize;
    /// Forgets every position after the first `len`.
    fn truncate(&mut self, len: usize);
    /// Runs one token after the cached positions and draws the next one with `sampler`
    /// (`history`: every token evaluated, `id` included, for penalties). This default
    /// samples the whole logits row; an engine may read back less when the sampler allows.
    fn decode_sample(&mut self, id: u32, sampler: &mut Sampler, history: &[u32]) -> Result<u32> {
        let logits = self.forward(&[id], Logits::Last)?;
        Ok(sampler.sample(logits, history))
    }
}

/// The CPU engine: a model and one sequence's state.
pub struct CpuEngine<'m> {
    model: &'m Model,
    state: CpuState,
}

impl<'m> CpuEngine<'m> {
    /// A CPU sequence with room for `n_ctx` positions, in a KV pool of its own.
    pub fn new(model: &'m Model, n_ctx: usize) -> CpuEngine<'m> {
        CpuEngine {
            model,
            state: model.cpu_state(n_ctx),
        }
    }

    /// A CPU sequence with room for `n_ctx` positions whose KV pages come from `pool`.
    pub fn in_pool(model: &'m Model, pool: Arc<KvPool>, n_ctx: usize) -> CpuEngine<'m> {
        CpuEngine {
            model,
            state: model.cpu_state_in(pool, n_ctx),
        }
    }
}

impl Engine for CpuEngine<'_> {
    fn n_vocab(&self) -> usize {
        self.model.config().n_vocab
    }

    fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        self.model.forward_cpu(tokens, which, &mut self.state)
    }

    fn logits(&self) -> &[f32] {
        self.state.logits(self.model.graph())
    }

    fn len(&self) -> usize {
        self.state.kv().len()
    }

    fn n_ctx(&self) -> usize {
        self.state.kv().n_ctx()
    }

    fn truncate(&mut self, len: usize) {
        self.state.truncate(len);
    }
}

/// One sequence: an engine and the tokens it holds.
pub struct Session<'m> {
    engine: Box<dyn Engine + 'm>,
    /// Tokens evaluated into the KV cache, in order.
    tokens: Vec<u32>,
    /// Tokens sampled but not yet evaluated (fed first by the next call).
    pending: Vec<u32>,
    /// Reused buffer for pending + new ids.
    batch: Vec<u32>,
}

impl<'m> Session<'m> {
    /// A CPU session with room for `n_ctx` positions.
    pub fn new(model: &'m Model, n_ctx: usize) -> Session<'m> {
        Session::with_engine(Box::new(CpuEngine::new(model, n_ctx)))
    }

    /// A session on any engine.
    pub fn with_engine(engine: Box<dyn Engine + 'm>) -> Session<'m> {
        let n_ctx = engine.n_ctx();
        Session {
            engine,
            tokens: Vec::with_capacity(n_ctx),
            pending: Vec::new(),
            batch: Vec::new(),
        }
    }

    /// Tokens evaluated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Context size in positions.
    pub fn n_ctx(&self) -> usize {
        self.engine.n_ctx()
    }

    /// Positions still free (pending tokens count as used).
    pub fn room(&self) -> usize {
        self.engine.n_ctx() - self.engine.len() - self.pending.len()
    }

    /// Forgets everything.
    pub fn reset(&mut self) {
        self.engine.truncate(0);
        self.tokens.clear();
        self.pending.clear();
    }

    /// Evaluates `ids` (after any pending tokens) in batches of at most [`PREFILL_CHUNK`];
    /// returns the last token's logits.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<&[f32]> {
        let mut all = std::mem::take(&mut self.batch);
        all.clear();
        all.append(&mut self.pending);
        all.extend_from_slice(ids);
        let result = self.run_chunks(&all);
        self.batch = all;
        result?;
        Ok(self.last_logits())
    }

    fn run_chunks(&mut self, all: &[u32]) -> Result<()> {
        self.check_room(all.len())?;
        if all.is_empty() {
            return Err(crate::Error::Request("no tokens to evaluate".into()));
        }
        for chunk in all.chunks(PREFILL_CHUNK) {
            self.engine.forward(chunk, Logits::Last)?;
            self.tokens.extend_from_slice(chunk);
        }
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<()> {
        if self.engine.len() + n > self.engine.n_ctx() {
            return Err(crate::Error::Request(format!(
                "context full: {} positions used + {n} new > context size {}",
                self.engine.len(),
                self.engine.n_ctx()
            )));
        }
        Ok(())
    }

    /// The logits of the last evaluated token.
    pub fn last_logits(&self) -> &[f32] {
        let all = self.engine.logits();
        &all[all.len().saturating_sub(self.engine.n_vocab())..]
    }

    /// Evaluates `ids` as one batch and returns logits for every position
    /// (`ids.len() × n_vocab`).
    pub fn logits_all(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        self.check_room(self.pending.len() + ids.len())?;
        let pending = std::mem::take(&mut self.pending);
        if !pending.is_empty() {
            self.engine.forward(&pending, Logits::Last)?;
            self.tokens.extend_from_slice(&pending);
        }
        let out = self.engine.forward(ids, Logits::All)?.to_vec();
        self.tokens.extend_from_slice(ids);
        Ok(out)
    }

    /// Evaluates one token (nothing may be pending) and draws the next with `sampler`.
    fn decode_sample(&mut self, id: u32, sampler: &mut Sampler) -> Result<u32> {
        self.check_room(1)?;
        self.tokens.push(id);
        let drawn = self.engine.decode_sample(id, sampler, &self.tokens);
        if drawn.is_err() {
            self.tokens.pop();
        }
        drawn
    }

    /// Evaluates one token and returns its logits.
    pub fn decode(&mut self, id: u32) -> Result<&[f32]> {
        self.prefill(&[id])
    }

    /// Prefills `prompt`, then samples up to `opts.max_tokens` tokens. `on_text` receives
    /// the newly complete UTF-8 text after each token and returns `false` to stop.
    /// The last sampled token stays pending, so a following call continues the sequence.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        tok: &Tokenizer,
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<GenerationStats> {
        let t0 = Instant::now();
        let prompt_tokens = self.pending.len() + prompt.len();
        self.prefill(prompt)?;
        let prompt_time = t0.elapsed();
        let mut stats = GenerationStats {
            prompt_tokens,
            prompt_time,
            generated: Vec::new(),
            decode_time: Duration::ZERO,
            decode_steps: 0,
            finish: FinishReason::Length,
        };
        let mut stream = StreamDecoder::default();
        let t1 = Instant::now();
        // The token drawn by the last decode step (the prompt's is drawn from its logits).
        let mut drawn = None;
        loop {
            if stats.generated.len() >= opts.max_tokens {
                break;
            }
            let id = match drawn.take() {
                Some(id) => id,
                None => sampler.sample(self.last_logits(), &self.tokens),
            };
            if tok.is_eog(id) && !opts.ignore_eos {
                stats.finish = FinishReason::Stop;
                break;
            }
            stats.generated.push(id);
            let text = stream.push(tok, id);
            if !on_text(&text) {
                self.pending.push(id);
                stats.finish = FinishReason::Cancelled;
                break;
            }
            if stats.generated.len() >= opts.max_tokens || self.room() <= 1 {
                self.pending.push(id);
                break;
            }
            drawn = Some(self.decode_sample(id, sampler)?);
            stats.decode_steps += 1;
        }
        let rest = stream.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
        stats.decode_time = t1.elapsed();
        Ok(stats)
    }
}

/// A GPU engine: a [`GpuModel`](crate::backend::gpu::GpuModel) (which holds its own KV
/// cache on the device) driving one sequence.
#[cfg(feature = "gpu")]
pub struct GpuEngine<'a> {
    model: &'a mut crate::backend::gpu::GpuModel,
    n_ctx: usize,
    logits: Vec<f32>,
}

#[cfg(feature = "gpu")]
impl<'a> GpuEngine<'a> {
    /// Starts a new sequence on `model` (its cache is emptied).
    pub fn new(model: &'a mut crate::backend::gpu::GpuModel) -> GpuEngine<'a> {
        model.truncate(0);
        let n_ctx = model.n_ctx();
        GpuEngine {
            model,
            n_ctx,
            logits: Vec::new(),
        }
    }
}

#[cfg(feature = "gpu")]
impl Engine for GpuEngine<'_> {
    fn n_vocab(&self) -> usize {
        self.model.config().n_vocab
    }

    fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        self.logits = self.model.forward(tokens, which)?;
        Ok(&self.logits)
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn len(&self) -> usize {
        self.model.pos()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn truncate(&mut self, len: usize) {
        self.model.truncate(len);
    }

    /// Reads back only the GPU top-k when the sampler draws from it exactly as from the
    /// whole row ([`Sampler::needs_only_top`]): k pairs instead of a vocabulary of floats.
    fn decode_sample(&mut self, id: u32, sampler: &mut Sampler, history: &[u32]) -> Result<u32> {
        if !sampler.needs_only_top(self.model.top_k()) {
            let logits = self.forward(&[id], Logits::Last)?;
            return Ok(sampler.sample(logits, history));
        }
        let top = self.model.topk_step(id)?;
        // The row is not on the host: the next prompt refreshes the logits.
        self.logits.clear();
        Ok(sampler.sample_top(&top))
    }
}
