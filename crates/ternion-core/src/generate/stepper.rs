//! One sequence's generation as a state machine. A [`Stepper`] plans its next step (the
//! next prompt chunk, or the token it sampled last), takes that step's row back, and
//! decides everything else: which token comes next, whether the sequence ends (an
//! end-of-generation token, a stop string, the token budget, the context), and the text
//! each token completes. It does no I/O and runs no model: the caller runs the planned
//! tokens on a backend.

use std::borrow::BorrowMut;

use super::chunking::next_chunk;
use super::constraint::{allows, Constraint, Mask};
use super::rows::{Need, Row};
use super::stop::StopFilter;
use crate::sample::{logprobs, Sampler, TokenLogprobs};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token was sampled or a stop string was produced.
    Stop,
    /// The token budget ran out.
    Length,
    /// The context ran out.
    Context,
    /// The caller asked to stop.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI-style name (a full context counts as "length").
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::Context => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// The rules of one generation.
#[derive(Clone, Debug)]
pub struct StepperOptions {
    /// Most tokens to sample.
    pub max_tokens: usize,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Stop strings: generation ends before the first one, which is not emitted.
    pub stop: Vec<String>,
    /// Positions the sequence's context holds.
    pub n_ctx: usize,
    /// Most prompt tokens the backend runs in one step.
    pub max_chunk: usize,
}

/// The end of a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    /// Why it ended.
    pub finish: FinishReason,
    /// Text released at the end (bytes of an unfinished character, text held back as a
    /// possible stop string); may be empty.
    pub text: String,
    /// Set when the sequence could not go on (its constraint failed): what went wrong.
    pub error: Option<String>,
}

/// What one [`Stepper::advance`] produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Advance {
    /// The token drawn by this step (an end-of-generation token included), if the prompt
    /// is in.
    pub drawn: Option<u32>,
    /// The text the drawn token completes, when it was emitted as a generated token
    /// (possibly empty while a character or a possible stop string is incomplete).
    pub text: Option<String>,
    /// Set when the sequence ended with this step.
    pub end: Option<End>,
    /// The drawn token's log-probabilities, when asked for ([`Stepper::with_logprobs`]).
    pub logprobs: Option<TokenLogprobs>,
}

/// One sequence being generated: its sampler `S` (owned, or borrowed as `&mut Sampler`),
/// its KV state `K` (a backend's sequence, or `()` where the backend holds it), and the
/// rules of [`StepperOptions`].
pub struct Stepper<S, K = ()> {
    sampler: S,
    kv: K,
    opts: StepperOptions,
    /// Tokens to evaluate before the first draw (a prompt).
    input: Vec<u32>,
    /// Tokens of `input` evaluated.
    fed: usize,
    /// Tokens planned for the current step (0: none).
    in_flight: usize,
    /// The token drawn last and not evaluated yet.
    last: Option<u32>,
    /// Every token evaluated into the sequence, in order (penalties look at them).
    history: Vec<u32>,
    generated: Vec<u32>,
    decoder: StreamDecoder,
    stop: StopFilter,
    finish: Option<FinishReason>,
    /// What the output must match (`None`: anything, at no cost).
    constraint: Option<Box<dyn Constraint>>,
    /// The mask of the next draw, computed before its step ran ([`Stepper::prepare_mask`]),
    /// or why the constraint could not give one.
    ready_mask: Option<Result<Vec<u32>, String>>,
    /// Scratch for the allowed pairs of a masked top-k row.
    allowed: Vec<(u32, f32)>,
    /// How many of the row's best tokens to report with each draw's log-probability
    /// (`None`: no log-probabilities).
    top_logprobs: Option<usize>,
}

impl<S: BorrowMut<Sampler>, K> Stepper<S, K> {
    /// A sequence that already holds `history` (evaluated tokens) and evaluates `input`
    /// (non-empty, checked by the caller against the context) before its first draw.
    pub fn new(
        sampler: S,
        kv: K,
        history: Vec<u32>,
        input: Vec<u32>,
        opts: StepperOptions,
    ) -> Stepper<S, K> {
        Stepper {
            sampler,
            kv,
            stop: StopFilter::new(opts.stop.clone()),
            opts,
            input,
            fed: 0,
            in_flight: 0,
            last: None,
            history,
            generated: Vec::new(),
            decoder: StreamDecoder::new(),
            finish: None,
            constraint: None,
            ready_mask: None,
            allowed: Vec::new(),
            top_logprobs: None,
        }
    }

    /// Draws only tokens `constraint` allows; the sequence ends when it is complete. An
    /// end-of-generation token always ends a constrained sequence.
    pub fn with_constraint(mut self, constraint: Box<dyn Constraint>) -> Stepper<S, K> {
        self.constraint = Some(constraint);
        self
    }

    /// Another sequence going on from this one's prompt, right after the step that
    /// evaluated the prompt's last chunk: it holds the same evaluated tokens, draws with
    /// its own `sampler`, and its KV state `kv` holds this one's positions (a fork of it:
    /// [`BatchBackend::fork`]). Hand it the row this one just drew from with
    /// [`Stepper::advance`] before planning its first step.
    ///
    /// [`BatchBackend::fork`]: super::BatchBackend::fork
    pub fn fork<T: BorrowMut<Sampler>, L>(
        &self,
        sampler: T,
        kv: L,
        opts: StepperOptions,
    ) -> Stepper<T, L> {
        let mut s = Stepper::new(sampler, kv, self.history.clone(), self.input.clone(), opts);
        s.fed = s.input.len();
        s
    }

    /// Reports each draw's log-probability and those of the row's `top` best tokens.
    pub fn with_logprobs(mut self, top: usize) -> Stepper<S, K> {
        self.top_logprobs = Some(top);
        self
    }

    /// Plans the next step: the next prompt chunk, taken from `budget` (see
    /// [`next_chunk`]), or the token drawn last. Returns whether the sequence runs a step
    /// now; [`Stepper::tokens`] are its tokens.
    pub fn plan(&mut self, budget: &mut usize) -> bool {
        self.in_flight = if self.finish.is_some() {
            0
        } else if self.in_prompt() {
            let n = next_chunk(self.input.len() - self.fed, self.opts.max_chunk, *budget);
            *budget -= n;
            n
        } else {
            usize::from(self.last.is_some())
        };
        self.in_flight > 0
    }

    /// True while prompt tokens are left to evaluate.
    pub fn in_prompt(&self) -> bool {
        self.fed < self.input.len()
    }

    /// The tokens of the planned step.
    pub fn tokens(&self) -> &[u32] {
        planned(&self.input, self.fed, self.in_flight, &self.last)
    }

    /// The KV state and the tokens of the planned step, to hand to a backend together,
    /// with the mask of the draw that follows it when [`Stepper::prepare_mask`] computed one.
    pub fn step_parts(&mut self) -> (&mut K, &[u32], Option<&Mask>) {
        let tokens = planned(&self.input, self.fed, self.in_flight, &self.last);
        let mask = match &self.ready_mask {
            Some(Ok(m)) => Some(m.as_slice()),
            _ => None,
        };
        (&mut self.kv, tokens, mask)
    }

    /// The least this sequence's next draw needs from a row, where the backend's top-k
    /// holds `top_k` pairs (0: none) and, with `masked`, selects under a step's token mask
    /// ([`BatchBackend::masks_top`]): a constrained draw then takes the top-k as an
    /// unconstrained one does (greedy or a top-k sampler without penalties).
    ///
    /// [`BatchBackend::masks_top`]: super::BatchBackend::masks_top
    pub fn need(&self, top_k: usize, masked: bool) -> Need {
        let s = self.sampler.borrow();
        let cfg = s.config();
        let constrained = self.constraint.is_some();
        if self.top_logprobs.is_some() || (constrained && !masked) {
            Need::Logits
        } else if !constrained && cfg.temperature <= 0.0 && !cfg.penalties_active() {
            Need::Argmax
        } else if top_k > 0 && s.needs_only_top(top_k) {
            Need::Top
        } else {
            Need::Logits
        }
    }

    /// Computes the token mask of the draw that follows the planned step now, before the
    /// step runs, for a backend that applies it to its top-k ([`Stepper::step_parts`]
    /// hands it out; [`Stepper::advance`] draws under it). Does nothing for a sequence
    /// without a constraint, a step after which nothing is drawn, or a mask already
    /// computed for this step.
    pub fn prepare_mask(&mut self) {
        let draws = self.in_flight > 0
            && self.fed + self.in_flight >= self.input.len()
            && self.generated.len() < self.opts.max_tokens;
        if !draws || self.ready_mask.is_some() {
            return;
        }
        // As in `draw`, where the step's tokens are in the history.
        let left = self.left(self.history.len() + self.in_flight);
        if let Some(c) = self.constraint.as_mut() {
            self.ready_mask = Some(c.mask(left).map(<[u32]>::to_vec));
        }
    }

    /// Tokens a constrained draw may still add, where the history holds `evaluated` tokens:
    /// the rest of the budget, within the context.
    fn left(&self, evaluated: usize) -> usize {
        (self.opts.max_tokens - self.generated.len())
            .min(self.opts.n_ctx.saturating_sub(evaluated + 1))
    }

    /// Takes the planned step's row back after the backend ran it: records the evaluated
    /// tokens, and once the prompt is in draws the next token and applies the rules.
    pub fn advance(&mut self, row: Row<'_>, tok: &Tokenizer) -> Advance {
        let mut out = Advance::default();
        if self.in_prompt() {
            let end = self.fed + self.in_flight;
            self.history.extend_from_slice(&self.input[self.fed..end]);
            self.fed = end;
            self.in_flight = 0;
            if self.in_prompt() {
                return out;
            }
        } else if let Some(id) = self.last.take() {
            self.history.push(id);
        }
        self.in_flight = 0;
        if self.generated.len() >= self.opts.max_tokens {
            out.end = Some(self.end(FinishReason::Length));
            return out;
        }
        let (id, complete) = match self.draw(row) {
            Ok(d) => d,
            Err(e) => {
                let mut end = self.end(FinishReason::Stop);
                end.error = Some(e);
                out.end = Some(end);
                return out;
            }
        };
        out.drawn = Some(id);
        if let (Some(top), Row::Logits(logits)) = (self.top_logprobs, row) {
            out.logprobs = Some(logprobs(logits, id, top));
        }
        let constrained = self.constraint.is_some();
        if tok.is_eog(id) && (!self.opts.ignore_eos || constrained) {
            out.end = Some(self.end(FinishReason::Stop));
            return out;
        }
        self.generated.push(id);
        let piece = self.decoder.push(tok, id);
        let f = self.stop.push(&piece);
        out.text = Some(f.text);
        if f.stopped {
            self.finish = Some(FinishReason::Stop);
            out.end = Some(End {
                finish: FinishReason::Stop,
                text: String::new(),
                error: None,
            });
            return out;
        }
        self.last = Some(id);
        if complete {
            let shortened = self.constraint.as_ref().is_some_and(|c| c.shortened());
            out.end = Some(self.end(if shortened {
                FinishReason::Length
            } else {
                FinishReason::Stop
            }));
        } else if self.generated.len() >= self.opts.max_tokens {
            out.end = Some(self.end(FinishReason::Length));
        } else if self.opts.n_ctx.saturating_sub(self.history.len()) <= 1 {
            out.end = Some(self.end(FinishReason::Context));
        }
        out
    }

    /// Ends the sequence at the caller's request after this step's token (the token drawn
    /// last stays unevaluated). `ended` is the end that step reported, if any: its
    /// released text is kept. Returns the end, [`FinishReason::Cancelled`].
    pub fn cancel(&mut self, ended: Option<End>) -> End {
        let text = match ended {
            Some(e) => e.text,
            None => self.end(FinishReason::Cancelled).text,
        };
        self.finish = Some(FinishReason::Cancelled);
        End {
            finish: FinishReason::Cancelled,
            text,
            error: None,
        }
    }

    /// Draws the next token from `row` (among those the constraint allows), and records it
    /// with the constraint. Returns the token and whether the constraint is complete. A
    /// constrained draw takes a whole row, or top-k pairs selected under its mask (pairs the
    /// mask does not allow are dropped: those of a masked top-k are −inf and weigh nothing).
    fn draw(&mut self, row: Row<'_>) -> Result<(u32, bool), String> {
        let left = self.left(self.history.len());
        let ready = self.ready_mask.take();
        let sampler = self.sampler.borrow_mut();
        let Some(c) = self.constraint.as_mut() else {
            let id = match row {
                Row::Logits(logits) => sampler.sample(logits, &self.history),
                Row::Top(top) => sampler.sample_top(top),
                Row::Argmax(id) => id,
            };
            return Ok((id, false));
        };
        let mask = match &ready {
            Some(Ok(m)) => m.as_slice(),
            Some(Err(e)) => return Err(e.clone()),
            None => c.mask(left)?,
        };
        let id = match row {
            Row::Logits(logits) => sampler.sample_masked(logits, &self.history, mask),
            Row::Top(top) => {
                self.allowed.clear();
                (self.allowed).extend(top.iter().filter(|p| allows(mask, p.0)));
                sampler.sample_top(&self.allowed)
            }
            Row::Argmax(_) => {
                return Err(
                    "a constrained sequence needs whole logits rows or a masked \
                            top-k"
                        .into(),
                )
            }
        };
        Ok((id, c.commit(id)?))
    }

    /// Ends the sequence with `reason`, releasing the text held back.
    fn end(&mut self, mut finish: FinishReason) -> End {
        let rest = self.decoder.finish();
        let f = self.stop.push(&rest);
        let mut text = f.text;
        if f.stopped {
            finish = FinishReason::Stop;
        } else {
            text.push_str(&self.stop.finish());
        }
        self.finish = Some(finish);
        End {
            finish,
            text,
            error: None,
        }
    }

    /// Why the sequence ended (`None` while it runs).
    pub fn finish(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Tokens of the prompt given to [`Stepper::new`].
    pub fn prompt_len(&self) -> usize {
        self.input.len()
    }

    /// Tokens planned for the current step.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The tokens generated so far (an end-of-generation token is not one).
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Takes the generated tokens out.
    pub fn take_generated(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.generated)
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        self.sampler.borrow()
    }

    /// The KV state.
    pub fn kv(&self) -> &K {
        &self.kv
    }

    /// The evaluated tokens and the token drawn last but not evaluated (which a following
    /// generation feeds first).
    pub fn into_parts(self) -> (Vec<u32>, Option<u32>) {
        (self.history, self.last)
    }
}

/// The tokens of a planned step: the next `in_flight` prompt tokens after `fed`, or the
/// token drawn last.
fn planned<'a>(input: &'a [u32], fed: usize, in_flight: usize, last: &'a Option<u32>) -> &'a [u32] {
    if fed < input.len() {
        &input[fed..fed + in_flight]
    } else {
        match (last, in_flight) {
            (Some(id), 1) => std::slice::from_ref(id),
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests;
