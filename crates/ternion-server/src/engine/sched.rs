//! The scheduler: admits queued jobs into free slots, gives every active sequence a step
//! (its next prompt chunk within the iteration's prompt budget, or its last token), runs
//! the steps as one batched forward pass (or one pass per sequence with
//! [`Batching::OneByOne`]), and retires the sequences that ended.
//!
//! A request of `n` choices is one job: on a backend that shares KV pages it is admitted
//! when its `n` sequences fit beside the running ones, evaluates its prompt once and
//! starts its other choices from there; with more choices than `max_active`, or on a
//! backend that cannot share pages, its choices queue as jobs of their own.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ternion::embed::Embedder;
use ternion::generate::{BatchStep, Need, PREFILL_CHUNK};
use ternion::model::Model;
use ternion::tokenizer::Tokenizer;

use super::seq::{advance_all, Seq};
use super::{Batching, EmbedJob, EngineBackend, Event, Job, Shared, Work};
use crate::error::EngineError;
use crate::metrics::Metrics;

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
pub(super) struct Scheduler<'m, B: EngineBackend> {
    pub model: &'m Model,
    pub tok: &'m Tokenizer,
    pub runner: B,
    pub n_ctx: usize,
    pub max_active: usize,
    pub batching: Batching,
    pub prefill_per_step: usize,
    /// Jobs taken from the queue and not admitted yet (a request's choices split apart,
    /// or a job waiting for room for all its choices), admitted before the queue's.
    pub pending: VecDeque<Job>,
    /// The front of `pending` is a generation request read off the queue while every slot
    /// was busy (to reach the embeddings behind it): it still counts in the queue's length.
    pub held: bool,
    /// The device fault an embeddings job met: the engine cannot go on.
    pub fault: Option<Arc<ternion::Error>>,
}

impl<B: EngineBackend> Scheduler<'_, B> {
    /// The scheduler loop. Returns once shutdown was asked for and no sequence is left, or
    /// when every queue sender is gone.
    pub fn run(&mut self, rx: &Receiver<Work>, shared: &Shared) {
        let m = &shared.metrics;
        let mut active: Vec<Seq<B::Seq>> = Vec::new();
        let mut rate = RateWindow::new(m);
        loop {
            rate.tick(m);
            let shutting = shared.shutdown.load(Acquire);
            if !self.admit(rx, shutting, &mut active, m) {
                return;
            }
            if let Some(e) = self.fault.take() {
                self.fail(e, rx, &mut active, shared);
                return;
            }
            if shutting && shared.cancel_all.load(Acquire) {
                for s in active.drain(..) {
                    m.cancelled_total.fetch_add(1, Relaxed);
                    s.send(Event::Error(EngineError::ShuttingDown));
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
            let mut stepping: Vec<&mut Seq<B::Seq>> = active
                .iter_mut()
                .filter_map(|s| s.st.plan(&mut budget).then_some(s))
                .collect();
            let group = match self.batching {
                Batching::Stacked => stepping.len().max(1),
                Batching::OneByOne => 1,
            };
            for g in stepping.chunks_mut(group) {
                if let Err(e) = self.forward(g, m) {
                    drop(stepping);
                    self.fail(e.into(), rx, &mut active, shared);
                    return;
                }
            }
            m.engine_steps_total.fetch_add(1, Relaxed);
            let born: Vec<_> = active.iter_mut().flat_map(|s| s.born.drain(..)).collect();
            active.extend(born);
            active.retain(|s| !s.ended);
            self.publish(active.len(), m);
        }
    }

    /// Admits queued jobs into free slots (or, when shutting down, answers them 503).
    /// Returns `false` when every queue sender is gone.
    fn admit(
        &mut self,
        rx: &Receiver<Work>,
        shutting: bool,
        active: &mut Vec<Seq<B::Seq>>,
        m: &Metrics,
    ) -> bool {
        loop {
            if shutting {
                self.release_held(m);
                for job in self.pending.drain(..) {
                    m.cancelled_total.fetch_add(1, Relaxed);
                    let _ = job.events.send(Event::Error(EngineError::ShuttingDown));
                }
                while let Ok(work) = rx.try_recv() {
                    m.queue_length.fetch_sub(1, Relaxed);
                    m.cancelled_total.fetch_add(1, Relaxed);
                    work.refuse(EngineError::ShuttingDown);
                }
                return true;
            }
            // Every active sequence and the forks it will start.
            let used: usize = active.iter().map(|s| 1 + s.forks.len()).sum();
            if used >= self.max_active {
                return self.embeds_while_full(rx, m);
            }
            let mut job = if let Some(j) = self.pending.pop_front() {
                self.release_held(m);
                j
            } else {
                let j = if active.is_empty() {
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
                match j {
                    Work::Generate(j) => j,
                    Work::Embed(e) => {
                        self.embed(e);
                        if self.fault.is_some() {
                            return true;
                        }
                        continue;
                    }
                }
            };
            if job.events.is_closed() {
                m.cancelled_total.fetch_add(1, Relaxed);
                continue;
            }
            // Forks need a slot each beside the first choice: more than fit run apart.
            if !B::FORKS || job.width() > self.max_active {
                for f in job.split().into_iter().rev() {
                    self.pending.push_front(f);
                }
            } else if used + job.width() > self.max_active {
                self.pending.push_front(job);
                return true;
            }
            match Seq::new(&mut self.runner, self.n_ctx, PREFILL_CHUNK, job) {
                Some(s) => active.push(s),
                None => {
                    m.failed_total.fetch_add(1, Relaxed);
                }
            }
        }
    }

    /// Runs one forward pass over `group` and advances each sequence. When the pass fails,
    /// each sequence is retried alone, so only the one at fault ends (with its error). A
    /// device fault (lost, out of memory) is returned: the engine cannot go on.
    fn forward(
        &mut self,
        group: &mut [&mut Seq<B::Seq>],
        m: &Metrics,
    ) -> Result<(), ternion::Error> {
        m.forward_passes_total.fetch_add(1, Relaxed);
        // The k best of each row are all the samplers need unless one of them has
        // penalties or looks past the top-k; a constrained sequence's mask then goes with
        // its step when the backend selects under it.
        let (k, masked) = (self.runner.top_k(), self.runner.masks_top());
        let top = k > 0 && group.iter().all(|s| s.st.need(k, masked) != Need::Logits);
        if top && masked {
            for s in group.iter_mut() {
                s.st.prepare_mask();
            }
        }
        let mut steps: Vec<BatchStep<'_, B::Seq>> = group
            .iter_mut()
            .map(|s| {
                let (seq, tokens, mask) = s.st.step_parts();
                BatchStep { seq, tokens, mask }
            })
            .collect();
        let result = self.runner.forward(&mut steps, top);
        drop(steps);
        match result {
            Ok(rows) => advance_all(group, &rows, self.tok, m, B::fork),
            Err(e) if e.is_device_fault() => return Err(e),
            Err(_) if group.len() > 1 => {
                for s in group.iter_mut() {
                    self.forward(std::slice::from_mut(s), m)?;
                }
            }
            Err(e) => {
                m.failed_total.fetch_add(1, Relaxed);
                group[0].send(Event::Error(EngineError::Generation(e.into())));
                group[0].ended = true;
            }
        }
        Ok(())
    }

    /// With every slot taken, embeddings (which need none) still run: the queue is read up
    /// to its first generation request, which waits in `pending` for room (the queue stays
    /// first come, first served). Returns `false` when every queue sender is gone.
    fn embeds_while_full(&mut self, rx: &Receiver<Work>, m: &Metrics) -> bool {
        while self.pending.is_empty() && self.fault.is_none() {
            let work = match rx.try_recv() {
                Ok(w) => w,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return false,
            };
            match work {
                Work::Generate(job) => {
                    self.pending.push_back(job);
                    self.held = true;
                }
                Work::Embed(e) => {
                    m.queue_length.fetch_sub(1, Relaxed);
                    self.embed(e);
                }
            }
        }
        true
    }

    /// The held generation request (see [`Scheduler::held`]) leaves the queue's count.
    fn release_held(&mut self, m: &Metrics) {
        if std::mem::take(&mut self.held) {
            m.queue_length.fetch_sub(1, Relaxed);
        }
    }

    /// Runs an embeddings job on the backend's device and answers it; a device fault is
    /// kept in [`Scheduler::fault`] for the loop to stop on.
    fn embed(&mut self, job: EmbedJob) {
        let Some(hidden) = self.runner.hidden() else {
            let e = ternion::Error::Request("this engine's backend runs no embeddings".into());
            let _ = job.reply.send(Err(EngineError::Generation(e.into())));
            return;
        };
        let vectors =
            Embedder::with_backend(self.model, Box::new(hidden), None, true).and_then(|mut emb| {
                job.inputs
                    .iter()
                    .map(|ids| emb.embed(ids).map(|mut v| v.swap_remove(0)))
                    .collect::<ternion::Result<Vec<_>>>()
            });
        let answer = match vectors {
            Ok(v) => Ok(v),
            Err(e) if e.is_device_fault() => {
                let e = Arc::new(e);
                self.fault = Some(e.clone());
                Err(EngineError::Stopped(e))
            }
            Err(e) => Err(EngineError::Generation(e.into())),
        };
        let _ = job.reply.send(answer);
    }

    /// The engine cannot go on (`e`, a device fault): answers every sequence and queued
    /// request with 503 and the reason, and marks the server unhealthy.
    fn fail(
        &mut self,
        e: Arc<ternion::Error>,
        rx: &Receiver<Work>,
        active: &mut Vec<Seq<B::Seq>>,
        shared: &Shared,
    ) {
        let reason = EngineError::Stopped(e);
        eprintln!("ternion-server: {reason}");
        let _ = shared.failed.set(reason.clone());
        let m = &shared.metrics;
        m.model_loaded.store(false, Relaxed);
        for s in active.drain(..) {
            m.failed_total.fetch_add(1, Relaxed);
            s.send(Event::Error(reason.clone()));
        }
        self.release_held(m);
        for job in self.pending.drain(..) {
            m.failed_total.fetch_add(1, Relaxed);
            let _ = job.events.send(Event::Error(reason.clone()));
        }
        while let Ok(work) = rx.try_recv() {
            m.queue_length.fetch_sub(1, Relaxed);
            m.failed_total.fetch_add(1, Relaxed);
            work.refuse(reason.clone());
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
