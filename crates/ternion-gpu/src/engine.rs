//! The GPU [`Engine`] of a [`Session`](crate::session::Session): one sequence on a
//! [`GpuModel`].

use crate::generate::{Mask, Need, Row, PREFILL_CHUNK};
use crate::model::Logits;
use crate::session::Engine;
use crate::{GpuModel, Result};

/// Greedy steps a [`GpuEngine`] runs ahead (the GPU feeding each argmax to the next step).
const GREEDY_AHEAD: usize = 8;

/// A GPU engine: a [`GpuModel`] (which holds its own KV
/// cache on the device) driving one sequence. Greedy decoding runs [`GREEDY_AHEAD`] steps
/// at a time on the GPU (`GpuModel::greedy`); the ids not yet asked for wait in `ahead`,
/// and whatever the caller does not take (a stop, another token, a prompt) is truncated
/// away, so the cache always looks as if one step ran per call.
pub struct GpuEngine<'a> {
    model: &'a mut GpuModel,
    n_ctx: usize,
    logits: Vec<f32>,
    top: Vec<(u32, f32)>,
    /// Argmax ids computed ahead, in order; the first answers `expect`.
    ahead: std::collections::VecDeque<u32>,
    /// The token the next greedy call must bring for `ahead` to hold (the last id given).
    expect: Option<u32>,
}

impl<'a> GpuEngine<'a> {
    /// Starts a new sequence on `model` (its cache is emptied).
    pub fn new(model: &'a mut GpuModel) -> GpuEngine<'a> {
        model.truncate(0);
        let n_ctx = model.n_ctx();
        GpuEngine {
            model,
            n_ctx,
            logits: Vec::new(),
            top: Vec::new(),
            ahead: std::collections::VecDeque::with_capacity(GREEDY_AHEAD),
            expect: None,
        }
    }

    /// Forgets the steps run ahead (the cache drops their positions).
    fn drop_ahead(&mut self) {
        if !self.ahead.is_empty() {
            let len = self.model.pos() - self.ahead.len();
            self.model.truncate(len);
            self.ahead.clear();
        }
        self.expect = None;
    }
}

impl Engine for GpuEngine<'_> {
    fn n_vocab(&self) -> usize {
        self.model.config().n_vocab
    }

    fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        self.drop_ahead();
        self.logits = self.model.forward(tokens, which)?;
        Ok(&self.logits)
    }

    fn logits(&self) -> &[f32] {
        &self.logits
    }

    fn len(&self) -> usize {
        self.model.pos() - self.ahead.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn truncate(&mut self, len: usize) {
        self.drop_ahead();
        self.model.truncate(len);
    }

    fn max_chunk(&self) -> usize {
        self.model.max_batch().min(PREFILL_CHUNK)
    }

    fn top_k(&self) -> usize {
        self.model.top_k()
    }

    fn masks_top(&self) -> bool {
        true
    }

    /// Reads back only the argmax (greedy) or the GPU top-k (under `mask`, if any) when
    /// the sampler draws from it exactly as from the whole row: an id or k pairs instead
    /// of a vocabulary of floats. The row is then not on the host: the next prompt
    /// refreshes the logits.
    fn decode_row(&mut self, id: u32, need: Need, mask: Option<&Mask>) -> Result<Row<'_>> {
        match need {
            Need::Argmax => {
                self.logits.clear();
                if self.expect == Some(id) {
                    if let Some(next) = self.ahead.pop_front() {
                        self.expect = Some(next);
                        return Ok(Row::Argmax(next));
                    }
                }
                self.drop_ahead();
                let mut ids = self.model.greedy(id, GREEDY_AHEAD, |_| true)?.into_iter();
                let next = ids.next().ok_or_else(|| {
                    crate::Error::Request("context full: no room for a greedy step".into())
                })?;
                self.ahead.extend(ids);
                self.expect = Some(next);
                Ok(Row::Argmax(next))
            }
            Need::Top => {
                self.drop_ahead();
                self.logits.clear();
                self.top = self.model.topk_step_masked(id, mask)?;
                Ok(Row::Top(&self.top))
            }
            Need::Logits => Ok(Row::Logits(self.forward(&[id], Logits::Last)?)),
        }
    }
}
