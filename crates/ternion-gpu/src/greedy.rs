//! Greedy decoding that keeps the GPU fed: each step's argmax is copied on the GPU into the
//! next step's token buffer, so step n+1 is recorded and submitted while step n runs, and
//! the ids come back [`CHAIN`] steps at a time (two staging buffers, one being read while
//! the other fills). Stop conditions are checked on the returned ids; steps submitted past
//! a stop are discarded by truncating the sequence.

use std::collections::VecDeque;

use super::exec::{GpuModel, Out};
use crate::{Error, Result};

/// Steps whose ids come back together (and the most steps submitted past a stop).
pub(crate) const CHAIN: usize = 8;

/// Chained greedy steps of a model's sequence, read back one batch of ids at a time
/// ([`GreedyChain::next_ids`]), so that the caller can look at each batch (and let its
/// host run other work) while the next one runs on the GPU. Made by
/// [`GpuModel::greedy_chain`]; ended by [`GreedyChain::finish`], or by dropping it, which
/// keeps every id returned.
pub struct GreedyChain<'a> {
    model: &'a mut GpuModel,
    /// The token of the first step (sampled, not yet in the cache).
    first: u32,
    /// Positions cached before the first step.
    start: usize,
    /// Steps in all.
    max: usize,
    submitted: usize,
    /// Ids handed to the caller.
    returned: usize,
    /// Batches submitted and not read yet, oldest first: (staging buffer, steps, the
    /// submission of its last step).
    queued: VecDeque<(usize, usize, Option<wgpu::SubmissionIndex>)>,
    /// The staging buffer read last: the next read refills it first.
    refill: Option<usize>,
}

impl GpuModel {
    /// Starts greedy decoding of the model's sequence: evaluates `first` (sampled, not yet
    /// in the cache), then each argmax in turn, at most `max` steps (fewer where the context
    /// ends). Two batches of up to `CHAIN` (8) steps are submitted now.
    pub fn greedy_chain(&mut self, first: u32, max: usize) -> Result<GreedyChain<'_>> {
        let start = self.pos();
        let mut chain = GreedyChain {
            first,
            start,
            max: max.min(self.n_ctx().saturating_sub(start)),
            model: self,
            submitted: 0,
            returned: 0,
            queued: VecDeque::with_capacity(2),
            refill: None,
        };
        for buf in 0..2 {
            chain.submit(buf)?;
        }
        Ok(chain)
    }

    /// Greedy decoding of the model's sequence: evaluates `first` (sampled, not yet in the
    /// cache), then each argmax in turn, at most `max` steps, calling `keep(id)` on every id
    /// in order until it returns false. Returns the ids (the one `keep` refused included);
    /// the cache then holds `first` and every returned id but the last, as after the same
    /// [`GpuModel::argmax_step`] calls, which give the same ids.
    pub async fn greedy_async(
        &mut self,
        first: u32,
        max: usize,
        mut keep: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let mut chain = self.greedy_chain(first, max)?;
        let max = chain.max;
        let mut ids = Vec::with_capacity(max);
        loop {
            let got = chain.next_ids().await?;
            if got.is_empty() {
                break;
            }
            for id in got {
                ids.push(id);
                if !keep(id) {
                    chain.finish(ids.len())?;
                    return Ok(ids);
                }
            }
        }
        if ids.len() != max {
            return Err(Error::DeviceFault {
                what: "greedy decoding".into(),
                message: format!("the device returned {} of {max} ids", ids.len()),
            });
        }
        Ok(ids)
    }

    /// Blocking [`GpuModel::greedy_async`].
    pub fn greedy(
        &mut self,
        first: u32,
        max: usize,
        keep: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        pollster::block_on(self.greedy_async(first, max, keep))
    }
}

impl GreedyChain<'_> {
    /// Submits the next batch of up to [`CHAIN`] steps into staging buffer `buf`, if steps
    /// are left.
    fn submit(&mut self, buf: usize) -> Result<()> {
        let n = CHAIN.min(self.max - self.submitted);
        if n == 0 {
            return Ok(());
        }
        let mut last = None;
        for at in 0..n {
            let from_gpu = self.submitted > 0;
            let tok = if from_gpu { 0 } else { self.first };
            let slot = self.model.main_slot();
            last = Some(self.model.step(
                &[(slot, std::slice::from_ref(&tok))],
                Out::Chained {
                    buf,
                    at: at as u64,
                    from_gpu,
                },
            )?);
            self.submitted += 1;
        }
        self.queued.push_back((buf, n, last));
        Ok(())
    }

    /// The ids of the next batch of steps, in order (empty once every step's id came
    /// back). The staging buffer of the batch before is refilled with the steps after
    /// those queued first, so one batch runs while this one is read and looked at.
    pub async fn next_ids(&mut self) -> Result<Vec<u32>> {
        if let Some(buf) = self.refill.take() {
            self.submit(buf)?;
        }
        let Some((buf, n, filled)) = self.queued.pop_front() else {
            return Ok(Vec::new());
        };
        // Only this batch is waited for: the batch queued after it keeps the GPU busy while
        // its ids are read and the next batch is recorded.
        let ids: Vec<u32> = self
            .model
            .context()
            .map_read_after(&self.model.chain[buf].buf, n as u64 * 4, filled, |b| {
                bytemuck::cast_slice(b).to_vec()
            })
            .await?;
        self.refill = Some(buf);
        self.returned += ids.len();
        Ok(ids)
    }

    /// Ends the chain after the first `kept` ids returned (at most those returned): the
    /// cache then holds `first` and each of them but the last, as after `kept`
    /// [`GpuModel::argmax_step`] calls; the steps past them are discarded (their cache rows
    /// are overwritten later).
    pub fn finish(mut self, kept: usize) -> Result<()> {
        self.returned = kept.min(self.returned);
        let ctx = self.model.context().clone();
        drop(self);
        ctx.check()
    }
}

impl Drop for GreedyChain<'_> {
    /// Keeps the ids returned (see [`GreedyChain::finish`]) and discards the steps past
    /// them.
    fn drop(&mut self) {
        self.model.truncate(self.start + self.returned);
    }
}
