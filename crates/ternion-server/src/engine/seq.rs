//! One request's sequence in the engine: the library's [`Stepper`] (prompt chunks,
//! sampling, stop strings, budget, context) with the request's event channel and the
//! server's metrics around it. The other choices of a request (its forks) start from the
//! first one's sequence once its prompt is in, sharing the prompt's KV pages.

use std::sync::atomic::Ordering::Relaxed;

use ternion::generate::{BatchBackend, End, Row, Rows, Stepper, StepperOptions};
use ternion::sample::Sampler;
use ternion::tokenizer::Tokenizer;

use super::{Done, Event, Fork, Job};
use crate::error::EngineError;
use crate::metrics::Metrics;

/// One sequence being generated.
pub(super) struct Seq<K> {
    /// The request (its prompt moved into the stepper).
    pub job: Job,
    /// The sequence's state machine and its KV cache (pages returned on drop).
    pub st: Stepper<Sampler, K>,
    /// Finished, failed or cancelled: removed after this iteration.
    pub ended: bool,
    /// The rules of its stepper (its forks' too).
    rules: StepperOptions,
    /// The request's other choices, started once the prompt is in.
    pub forks: Vec<Fork>,
    /// Forks started by the last step, for the scheduler to take into the active set.
    pub born: Vec<Seq<K>>,
}

/// The sampler of `job` and a KV cache from `kv`; when either fails, the job is answered
/// with the error.
fn parts<K>(job: &Job, kv: impl FnOnce() -> ternion::Result<K>) -> Option<(Sampler, K)> {
    let made = Sampler::new(job.sampler.clone())
        .map_err(|e| EngineError::Sampler(e.into()))
        .and_then(|s| Ok((s, kv().map_err(|e| EngineError::NoCache(e.into()))?)));
    match made {
        Ok(m) => Some(m),
        Err(e) => {
            let _ = job.events.send(Event::Error(e));
            None
        }
    }
}

/// Makes a backend sequence holding another's positions ([`BatchBackend::fork`]).
pub(super) type Forker<K> = fn(&K) -> ternion::Result<K>;

impl<K> Seq<K> {
    /// A sequence for `job` with a cache from `runner`; when its sampler settings are
    /// invalid or no cache is left, the job is answered with the error and dropped.
    pub fn new<B: BatchBackend<Seq = K>>(
        runner: &mut B,
        n_ctx: usize,
        max_chunk: usize,
        mut job: Job,
    ) -> Option<Seq<K>> {
        let (sampler, kv) = parts(&job, || runner.new_seq(n_ctx))?;
        let rules = StepperOptions {
            max_tokens: job.max_tokens,
            ignore_eos: job.ignore_eos,
            stop: job.stop.clone(),
            n_ctx,
            max_chunk,
        };
        let prompt = std::mem::take(&mut job.prompt);
        let st = Stepper::new(
            sampler,
            kv,
            Vec::with_capacity(n_ctx),
            prompt,
            rules.clone(),
        );
        Some(Seq::start(job, st, rules))
    }

    /// A sequence for `job` over the stepper `st` made with `rules`.
    fn start(mut job: Job, mut st: Stepper<Sampler, K>, rules: StepperOptions) -> Seq<K> {
        if let Some(c) = job.constraint.take() {
            st = st.with_constraint(c);
        }
        if let Some(top) = job.logprobs {
            st = st.with_logprobs(top);
        }
        Seq {
            forks: std::mem::take(&mut job.forks),
            st,
            job,
            ended: false,
            rules,
            born: Vec::new(),
        }
    }

    /// Starts fork `f` from this sequence, whose prompt is in; when it cannot start, its
    /// request is answered with the error.
    fn fork(&self, f: Fork, fork: Forker<K>) -> Option<Seq<K>> {
        let job = self.job.sibling(f, Vec::new());
        let (sampler, kv) = parts(&job, || fork(self.st.kv()))?;
        let st = self.st.fork(sampler, kv, self.rules.clone());
        Some(Seq::start(job, st, self.rules.clone()))
    }

    pub fn send(&self, ev: Event) {
        // A closed receiver is noticed before the next iteration.
        let _ = self.job.events.send(ev);
    }

    /// After a successful forward pass with `row` as this sequence's row: advances the
    /// stepper and sends what it produced. Returns `true` when the sequence has ended (its
    /// `Done` event is sent).
    fn advance(&mut self, row: Row<'_>, tok: &Tokenizer, m: &Metrics) -> bool {
        let prompt = self.st.in_prompt().then(|| self.st.in_flight());
        let first = self.st.generated().is_empty();
        let adv = self.st.advance(row, tok);
        if let Some(n) = prompt {
            m.prompt_tokens_total.fetch_add(n as u64, Relaxed);
        }
        if adv.drawn.is_some() && first {
            m.observe_ttft(self.job.arrived.elapsed());
        }
        if let (Some(id), Some(text)) = (adv.drawn, adv.text) {
            m.generated_tokens_total.fetch_add(1, Relaxed);
            self.send(Event::Token {
                id,
                text,
                logprobs: adv.logprobs,
            });
        }
        match adv.end {
            Some(end) => {
                self.finish(end);
                true
            }
            None => false,
        }
    }

    fn finish(&mut self, end: End) {
        if let Some(message) = end.error {
            self.send(Event::Error(EngineError::Constraint(message)));
            return;
        }
        if !end.text.is_empty() {
            self.send(Event::Text(end.text));
        }
        let tokens = self.st.take_generated();
        self.send(Event::Done(Done {
            finish: end.finish,
            prompt_tokens: self.st.prompt_len(),
            completion_tokens: tokens.len(),
            tokens,
        }));
    }
}

/// Samples the next token of every sequence of a pass from its row. Sampling a whole
/// 128k-vocabulary row costs about a millisecond, so many sequences are sampled on several
/// threads (the forward pass is done: the cores are free).
pub(super) fn advance_all<K: Send>(
    group: &mut [&mut Seq<K>],
    rows: &Rows<'_>,
    tok: &Tokenizer,
    m: &Metrics,
    fork: Forker<K>,
) {
    let one = |s: &mut Seq<K>, row: Row<'_>| {
        let step = |s: &mut Seq<K>| {
            if s.advance(row, tok, m) {
                m.finished_total.fetch_add(1, Relaxed);
                s.ended = true;
            }
        };
        step(s);
        if s.st.in_prompt() {
            return;
        }
        // The prompt is in: the forks start here and draw from the same row.
        for f in std::mem::take(&mut s.forks) {
            if let Some(mut b) = s.fork(f, fork) {
                step(&mut b);
                s.born.push(b);
            }
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = group.len().div_ceil(threads.max(1)).max(2);
    if rows.is_top() || group.len() <= per {
        for (i, s) in group.iter_mut().enumerate() {
            one(s, rows.get(i));
        }
        return;
    }
    std::thread::scope(|sc| {
        for (c, seqs) in group.chunks_mut(per).enumerate() {
            sc.spawn(move || {
                for (j, s) in seqs.iter_mut().enumerate() {
                    one(s, rows.get(c * per + j));
                }
            });
        }
    });
}
