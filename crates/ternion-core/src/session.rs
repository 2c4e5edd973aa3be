//! A sequence being generated: prefill the prompt in batches, decode one token at a time,
//! sample, stop on end-of-generation or a length limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::cpu::CpuState;
use crate::generate::{
    check_room, next_chunk, Constraint, Mask, Need, Row, Stepper, StepperOptions,
};
use crate::kv::KvPool;
use crate::model::{Logits, Model};
use crate::sample::Sampler;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub use crate::generate::{FinishReason, PREFILL_CHUNK};

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
    /// Most tokens one forward pass takes (prompts run in chunks of at most this many).
    fn max_chunk(&self) -> usize {
        PREFILL_CHUNK
    }
    /// Pairs of the top-k this engine can read back instead of a whole row (0: none).
    fn top_k(&self) -> usize {
        0
    }
    /// True when [`Engine::decode_row`] selects its top-k under the token mask it is given
    /// (exactly the top-k of the row masked on the host).
    fn masks_top(&self) -> bool {
        false
    }
    /// Runs one token after the cached positions and returns its row: at least what
    /// `need` asks for, its top-k under `mask` (if any) where [`Engine::masks_top`] holds.
    /// This default reads back the whole logits row; an engine may read back less.
    fn decode_row(&mut self, id: u32, need: Need, mask: Option<&Mask>) -> Result<Row<'_>> {
        let _ = (need, mask);
        Ok(Row::Logits(self.forward(&[id], Logits::Last)?))
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

impl Drop for CpuEngine<'_> {
    /// The next CPU sequence of the model reuses this one's buffers.
    fn drop(&mut self) {
        self.model.give_back_cpu_state(&mut self.state);
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
    /// Stop strings of [`Session::generate`].
    stops: Vec<String>,
    /// What the next [`Session::generate`]'s output must match.
    constraint: Option<Box<dyn Constraint>>,
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
            stops: Vec::new(),
            constraint: None,
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

    /// Stop strings for the following generations: one ends before the first of them,
    /// which is not emitted (none by default).
    pub fn set_stops(&mut self, stops: Vec<String>) {
        self.stops = stops;
    }

    /// The next generation draws only what `constraint` allows and ends when it is
    /// complete (a grammar: `crate::constrain`).
    pub fn set_constraint(&mut self, constraint: Box<dyn Constraint>) {
        self.constraint = Some(constraint);
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
            return Err(Error::Request("no tokens to evaluate".into()));
        }
        let max_chunk = self.engine.max_chunk();
        let mut rest = all;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(next_chunk(rest.len(), max_chunk, usize::MAX));
            self.engine.forward(chunk, Logits::Last)?;
            self.tokens.extend_from_slice(chunk);
            rest = tail;
        }
        Ok(())
    }

    fn check_room(&self, n: usize) -> Result<()> {
        check_room(self.engine.len(), n, self.engine.n_ctx())
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
        let mut input = std::mem::take(&mut self.pending);
        input.extend_from_slice(prompt);
        if input.is_empty() {
            return Err(Error::Request("no tokens to evaluate".into()));
        }
        if let Err(e) = self.check_room(input.len()) {
            self.pending = input;
            self.pending.truncate(self.pending.len() - prompt.len());
            return Err(e);
        }
        let prompt_tokens = input.len();
        let rules = StepperOptions {
            max_tokens: opts.max_tokens,
            ignore_eos: opts.ignore_eos,
            stop: self.stops.clone(),
            n_ctx: self.engine.n_ctx(),
            max_chunk: self.engine.max_chunk(),
        };
        let history = std::mem::take(&mut self.tokens);
        let mut st = Stepper::new(sampler, (), history, input, rules);
        if let Some(c) = self.constraint.take() {
            st = st.with_constraint(c);
        }
        let mut stats = GenerationStats {
            prompt_tokens,
            prompt_time: Duration::ZERO,
            generated: Vec::new(),
            decode_time: Duration::ZERO,
            decode_steps: 0,
            finish: FinishReason::Length,
        };
        let mut t1 = None;
        let ran = self.steps(&mut st, tok, &mut stats, &mut t1, t0, &mut on_text);
        stats.decode_time = t1.map_or(Duration::ZERO, |t: Instant| t.elapsed());
        stats.generated = st.take_generated();
        let (history, last) = st.into_parts();
        self.tokens = history;
        self.pending.extend(last);
        let end = ran?;
        if !end.text.is_empty() {
            on_text(&end.text);
        }
        stats.finish = end.finish;
        Ok(stats)
    }

    /// Steps `st` to its end: prompt chunks, then one token per step.
    fn steps(
        &mut self,
        st: &mut Stepper<&mut Sampler>,
        tok: &Tokenizer,
        stats: &mut GenerationStats,
        t1: &mut Option<Instant>,
        t0: Instant,
        on_text: &mut impl FnMut(&str) -> bool,
    ) -> Result<crate::generate::End> {
        let (top_k, masked) = (self.engine.top_k(), self.engine.masks_top());
        loop {
            st.plan(&mut usize::MAX.clone());
            let row = if st.in_prompt() {
                Row::Logits(self.engine.forward(st.tokens(), Logits::Last)?)
            } else {
                stats.decode_steps += 1;
                let need = st.need(top_k, masked);
                if need == Need::Top && masked {
                    st.prepare_mask();
                }
                let (_, tokens, mask) = st.step_parts();
                self.engine.decode_row(tokens[0], need, mask)?
            };
            let adv = st.advance(row, tok);
            if t1.is_none() && !st.in_prompt() {
                stats.prompt_time = t0.elapsed();
                *t1 = Some(Instant::now());
            }
            if let Some(text) = &adv.text {
                if !on_text(text) {
                    return Ok(st.cancel(adv.end));
                }
            }
            if let Some(end) = adv.end {
                return Ok(end);
            }
        }
    }
}
