//! Embeddings on the GPU: steps of the model's own sequence that stop before the LM head
//! and read back every row of the final hidden state (after the output norm), which
//! `ternion_core::embed::Embedder` pools and normalises as it does the CPU's.
//!
//! A hidden step records the plan's launches up to the LM head's (`Rows::Hidden`) and
//! copies the rows into the logits staging buffer, so a step holds at most as many tokens
//! as that buffer has rows of the hidden width (and [`GpuModel::max_batch`]). Tokens keep
//! their numerics: a step of several tokens runs the batch kernels, a step of one the
//! decode kernels, exactly as the same tokens would for logits.

use crate::embed::HiddenStates;
use crate::exec::Out;
use crate::{Error, GpuModel, Result};

impl GpuModel {
    /// A non-causal model's input of `n` tokens must run as one step of at most `most`:
    /// its tokens all see each other, and a later step would not be seen by earlier ones.
    pub(crate) fn whole_input(&self, n: usize, most: usize) -> Result<()> {
        if self.plan.index.causal() || n <= most {
            return Ok(());
        }
        Err(Error::Request(format!(
            "non-causal attention ({arch}.attention.causal = false) runs each input as one \
             GPU step: this input has {n} tokens, a step at most {most} (max_batch {mb}; a \
             hidden step also fits the logits staging buffer)",
            arch = self.config().arch_name,
            mb = self.max_batch()
        )))
    }

    /// Values per row of the final hidden state (the LM head's input).
    pub fn hidden_width(&self) -> Result<usize> {
        self.plan
            .hidden
            .as_ref()
            .map(|h| h.width)
            .ok_or_else(|| Error::Model("the forward pass has no LM head to strip".into()))
    }

    /// Most tokens one [`GpuModel::hidden_async`] step takes.
    pub fn max_hidden_rows(&self) -> Result<usize> {
        let row = self.hidden_width()? as u64 * 4;
        let rows = (self.staging.size / row).min(self.max_batch() as u64) as usize;
        if rows == 0 {
            return Err(Error::Model(format!(
                "a hidden row of {row} bytes does not fit the {}-byte staging buffer",
                self.staging.size
            )));
        }
        Ok(rows)
    }

    /// Runs `tokens` (at most [`GpuModel::max_hidden_rows`]) at the positions after those
    /// the model's own sequence caches, without the LM head, and appends their final
    /// hidden rows (`tokens.len() × hidden_width`) to `out`.
    pub async fn hidden_async(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let (width, most) = (self.hidden_width()?, self.max_hidden_rows()?);
        self.whole_input(tokens.len(), most)?;
        if tokens.len() > most {
            return Err(Error::Request(format!(
                "GPU hidden step of {} tokens ({most} at most)",
                tokens.len()
            )));
        }
        self.step(&[(self.main_slot(), tokens)], Out::Hidden)?;
        let size = (tokens.len() * width * 4) as u64;
        self.ctx
            .map_read_with(&self.staging.buf, size, |b| {
                out.extend_from_slice(bytemuck::cast_slice(b))
            })
            .await
    }

    /// Blocking [`GpuModel::hidden_async`].
    pub fn hidden(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        pollster::block_on(self.hidden_async(tokens, out))
    }
}

/// The model's own sequence computes the hidden states of one input at a time.
impl HiddenStates for GpuModel {
    fn n_ctx(&self) -> usize {
        GpuModel::n_ctx(self)
    }

    fn max_chunk(&self) -> usize {
        // A plan without a head has no hidden rows: its first step reports why.
        self.max_hidden_rows().unwrap_or(1)
    }

    fn begin(&mut self, _n: usize) -> Result<()> {
        self.truncate(0);
        Ok(())
    }

    fn extend(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        self.hidden(tokens, out)
    }

    fn end(&mut self) {
        self.truncate(0);
    }
}
