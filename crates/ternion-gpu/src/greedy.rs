//! Greedy decoding that keeps the GPU fed: each step's argmax is copied on the GPU into the
//! next step's token buffer, so step n+1 is recorded and submitted while step n runs, and
//! the ids come back [`CHAIN`] steps at a time (two staging buffers, one being read while
//! the other fills). Stop conditions are checked on the returned ids; steps submitted past
//! a stop are discarded by truncating the sequence.

use super::exec::{GpuModel, Out};
use crate::{Error, Result};

/// Steps whose ids come back together (and the most steps submitted past a stop).
pub(crate) const CHAIN: usize = 8;

impl GpuModel {
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
        let start = self.pos();
        let max = max.min(self.n_ctx().saturating_sub(start));
        let mut ids = Vec::with_capacity(max);
        let mut submitted = 0;
        // Batches of up to CHAIN steps, alternating staging buffers; one batch is always
        // queued behind the one being read.
        let mut batches = std::collections::VecDeque::new();
        let submit = |m: &mut GpuModel, submitted: &mut usize, buf: usize| -> Result<usize> {
            let n = CHAIN.min(max - *submitted);
            for at in 0..n {
                let from_gpu = *submitted > 0;
                let tok = if from_gpu { 0 } else { first };
                let slot = m.main_slot();
                m.step(
                    &[(slot, std::slice::from_ref(&tok))],
                    Out::Chained {
                        buf,
                        at: at as u64,
                        from_gpu,
                    },
                )?;
                *submitted += 1;
            }
            Ok(n)
        };
        let mut buf = 0;
        while batches.len() < 2 && submitted < max {
            batches.push_back((buf, submit(self, &mut submitted, buf)?));
            buf ^= 1;
        }
        while let Some((b, n)) = batches.pop_front() {
            let bytes = self
                .context()
                .map_read(&self.chain[b].buf, n as u64 * 4)
                .await?;
            let got: &[u32] = bytemuck::cast_slice(&bytes);
            for &id in got {
                ids.push(id);
                if !keep(id) {
                    // Discard the steps past this one (their cache rows are overwritten
                    // later).
                    self.truncate(start + ids.len());
                    self.context().check()?;
                    return Ok(ids);
                }
            }
            if submitted < max {
                batches.push_back((b, submit(self, &mut submitted, b)?));
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
