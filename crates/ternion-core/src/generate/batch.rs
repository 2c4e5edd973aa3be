//! The batched backend interface: one forward step over several sequences, each with its
//! own KV state and tokens; the CPU implementation.

use std::sync::Arc;

use super::constraint::Mask;
use super::rows::Rows;
use crate::backend::cpu::{SeqStep, Workspace};
use crate::kv::{KvPool, KvSeq};
use crate::model::{Logits, Model};
use crate::{Error, Result};

/// One sequence's part of a batched step.
pub struct BatchStep<'a, S> {
    /// Its KV state (advanced by the step).
    pub seq: &'a mut S,
    /// Its tokens, after the positions it holds (at least one).
    pub tokens: &'a [u32],
    /// The tokens its draw may take (a constrained sequence's next mask), for a backend
    /// that applies it to its top-k ([`BatchBackend::masks_top`]); `None`: any token.
    pub mask: Option<&'a Mask>,
}

/// A backend that runs several sequences' steps as one forward pass.
pub trait BatchBackend {
    /// A sequence's KV state on this backend.
    type Seq: Send;

    /// A new, empty sequence with room for `n_ctx` positions (a backend with one context
    /// size for all sequences may use its own).
    fn new_seq(&mut self, n_ctx: usize) -> Result<Self::Seq>;

    /// True when [`BatchBackend::fork`] shares a sequence's cache (else it fails).
    const FORKS: bool = false;

    /// A new sequence holding the positions `seq` holds, in the same cache pages (a
    /// prompt evaluated once for several choices).
    fn fork(_seq: &Self::Seq) -> Result<Self::Seq> {
        Err(Error::UnsupportedFeature {
            what: "sharing a sequence's KV cache".into(),
            needs: "copy-on-write KV pages (the CPU and GPU backends)".into(),
        })
    }

    /// KV pages in use and in all.
    fn pages(&self) -> (usize, usize);

    /// Pairs of the top-k the backend can hand back instead of whole rows (0: none).
    fn top_k(&self) -> usize;

    /// True when the top-k of a step with a [`BatchStep::mask`] selects only among the
    /// tokens the mask allows (exactly the top-k of the row masked on the host), so that a
    /// constrained sequence can draw from k pairs. The default: masks are not applied.
    fn masks_top(&self) -> bool {
        false
    }

    /// Runs every step as one pass (checked first: on an error no sequence changed) and
    /// returns each step's last row: its top-k pairs when `top` is set (and
    /// [`BatchBackend::top_k`] is not 0; under each step's mask where
    /// [`BatchBackend::masks_top`] holds), else its logits.
    fn forward(&mut self, steps: &mut [BatchStep<'_, Self::Seq>], top: bool) -> Result<Rows<'_>>;
}

/// The CPU backend: a model, one KV pool shared by its sequences, and the scratch of a
/// batched pass.
pub struct CpuBatch<'m> {
    model: &'m Model,
    pool: Arc<KvPool>,
    ws: Box<Workspace>,
}

impl<'m> CpuBatch<'m> {
    /// Sequences of `model` whose KV pages come from `pool`.
    pub fn new(model: &'m Model, pool: Arc<KvPool>) -> CpuBatch<'m> {
        CpuBatch {
            model,
            pool,
            ws: Box::default(),
        }
    }
}

impl BatchBackend for CpuBatch<'_> {
    type Seq = KvSeq;

    fn new_seq(&mut self, n_ctx: usize) -> Result<KvSeq> {
        Ok(KvSeq::new(self.pool.clone(), n_ctx))
    }

    const FORKS: bool = true;

    fn fork(seq: &KvSeq) -> Result<KvSeq> {
        Ok(seq.fork())
    }

    fn pages(&self) -> (usize, usize) {
        (self.pool.pages_in_use(), self.pool.capacity())
    }

    fn top_k(&self) -> usize {
        0
    }

    fn forward(&mut self, steps: &mut [BatchStep<'_, KvSeq>], _top: bool) -> Result<Rows<'_>> {
        let mut steps: Vec<SeqStep<'_>> = steps
            .iter_mut()
            .map(|s| SeqStep {
                kv: &mut *s.seq,
                tokens: s.tokens,
                logits: Logits::Last,
            })
            .collect();
        self.model.forward_batch(&mut steps, &mut self.ws)?;
        Ok(Rows::Cpu(&self.ws, self.model.graph()))
    }
}
