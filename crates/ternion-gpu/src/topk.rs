//! Steps whose result is the GPU top-k of each sequence's last row, each row optionally
//! under a token mask (a constrained sequence's allowed tokens): the mask goes up with the
//! step and only k (id, logit) pairs per sequence come back, never a row of logits.

use super::exec::{GpuModel, Out};
use crate::generate::Mask;
use crate::GpuSeqStep;
use crate::Result;

impl GpuModel {
    /// [`GpuModel::topk_step_async`] among the tokens `mask` allows (see
    /// [`allows`](crate::generate::allows)); `None` allows every token. The pairs are the
    /// top-k of the row with every other logit set to −inf (such pairs fill the list when
    /// fewer than k tokens are allowed).
    pub async fn topk_step_masked_async(
        &mut self,
        token: u32,
        mask: Option<&Mask>,
    ) -> Result<Vec<(u32, f32)>> {
        self.topk.set_masks(&self.ctx, &[mask])?;
        self.step(
            &[(self.main_slot(), std::slice::from_ref(&token))],
            Out::TopK,
        )?;
        let best = self.topk.read_async(&self.ctx).await?;
        self.collect_profile().await?;
        Ok(best)
    }

    /// [`GpuModel::forward_seqs_topk_async`] where the row of `steps[i]` selects among the
    /// tokens `masks[i]` allows, as [`GpuModel::topk_step_masked_async`] (every token where
    /// it is `None` or past the end of `masks`, which holds at most one mask per step).
    pub async fn forward_seqs_topk_masked_async(
        &mut self,
        steps: &[GpuSeqStep<'_>],
        masks: &[Option<&Mask>],
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let parts = self.parts(steps)?;
        if masks.len() > parts.len() {
            return Err(crate::Error::Request(format!(
                "{} token masks for a step of {} sequences",
                masks.len(),
                parts.len()
            )));
        }
        let out = if parts.len() == 1 {
            Out::TopK
        } else {
            Out::PickedTopK
        };
        self.topk.set_masks(&self.ctx, masks)?;
        self.step(&parts, out)?;
        let best = self
            .topk
            .read_rows_async(&self.ctx, parts.len() as u32)
            .await?;
        self.collect_profile().await?;
        Ok(best)
    }

    /// Blocking [`GpuModel::forward_seqs_topk_masked_async`].
    pub fn forward_seqs_topk_masked(
        &mut self,
        steps: &[GpuSeqStep<'_>],
        masks: &[Option<&Mask>],
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        pollster::block_on(self.forward_seqs_topk_masked_async(steps, masks))
    }

    /// Blocking [`GpuModel::topk_step_masked_async`].
    pub fn topk_step_masked(&mut self, token: u32, mask: Option<&Mask>) -> Result<Vec<(u32, f32)>> {
        pollster::block_on(self.topk_step_masked_async(token, mask))
    }
}
