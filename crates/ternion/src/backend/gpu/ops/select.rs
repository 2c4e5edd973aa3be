//! GPU top-k / argmax over the logits.

use super::{uniform, Dispatch};
use crate::backend::gpu::buffers::GpuBuffer;
use crate::backend::gpu::context::GpuContext;
use crate::backend::gpu::pipelines::{Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Elements per workgroup in the first top-k pass.
pub const SELECT_CHUNK: u32 = 4096;
/// Largest k of [`TopK`].
pub const MAX_TOPK: u32 = 64;

/// Top-k (k ≤ 64) of one f32 vector, best first, ties to the lower index; k = 1 is argmax.
/// Only the k (value, id) pairs need to come back to the host.
pub struct TopK {
    partial: Dispatch,
    merge: Dispatch,
    /// k best values.
    pub vals: GpuBuffer,
    /// Their ids.
    pub ids: GpuBuffer,
    staging: GpuBuffer,
    k: u32,
    _keep: Vec<GpuBuffer>,
}

impl TopK {
    /// Selects from the first `n` values of `logits`.
    pub fn new(ctx: &GpuContext, logits: &GpuBuffer, n: u32, k: u32) -> Result<TopK> {
        if k == 0 || k > MAX_TOPK || n == 0 {
            return Err(Error::Gpu(format!(
                "top-k: need 1 ≤ k ≤ {MAX_TOPK} and n ≥ 1, got k = {k}, n = {n}"
            )));
        }
        let chunks = n.div_ceil(SELECT_CHUNK);
        let cand = (chunks * k) as u64;
        let cand_v = GpuBuffer::zeroed(ctx, "topk.cand_vals", cand * 4)?;
        let cand_i = GpuBuffer::zeroed(ctx, "topk.cand_ids", cand * 4)?;
        let vals = GpuBuffer::zeroed(ctx, "topk.vals", u64::from(k) * 4)?;
        let ids = GpuBuffer::zeroed(ctx, "topk.ids", u64::from(k) * 4)?;
        let dummy = GpuBuffer::zeroed(ctx, "topk.unused", 4)?;
        let staging = GpuBuffer::with_usage(
            ctx,
            "topk.staging",
            u64::from(k) * 8,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let p1 = uniform(ctx, "topk.params1", &[n, SELECT_CHUNK])?;
        let p2 = uniform(ctx, "topk.params2", &[cand as u32, 0])?;
        let key = |partial| PipelineKey {
            kernel: Kernel::Select { k, partial },
            variant: Variant::default(),
        };
        let partial = Dispatch::new(
            ctx,
            key(true),
            "topk.partial",
            &[
                (0, p1.binding()),
                (1, logits.binding()),
                (2, cand_v.binding()),
                (3, cand_i.binding()),
                (4, dummy.binding()),
            ],
            chunks,
        )?;
        let merge = Dispatch::new(
            ctx,
            key(false),
            "topk.merge",
            &[
                (0, p2.binding()),
                (1, cand_v.binding()),
                (2, vals.binding()),
                (3, ids.binding()),
                (4, cand_i.binding()),
            ],
            1,
        )?;
        Ok(TopK {
            partial,
            merge,
            vals,
            ids,
            staging,
            k,
            _keep: vec![cand_v, cand_i, dummy, p1, p2],
        })
    }

    /// Records both passes.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.partial.record(pass, 1);
        self.merge.record(pass, 1);
    }

    /// Records the copy of the result into the host-visible staging buffer (after the pass).
    pub fn record_download(&self, enc: &mut wgpu::CommandEncoder) {
        let bytes = u64::from(self.k) * 4;
        enc.copy_buffer_to_buffer(&self.vals.buf, 0, &self.staging.buf, 0, bytes);
        enc.copy_buffer_to_buffer(&self.ids.buf, 0, &self.staging.buf, bytes, bytes);
    }

    /// Maps the staging buffer (after the submit of [`TopK::record_download`]) and returns
    /// the k (id, value) pairs, best first; missing candidates are `(u32::MAX, -inf)`.
    pub async fn read_async(&self, ctx: &GpuContext) -> Result<Vec<(u32, f32)>> {
        let k = self.k as usize;
        let bytes = ctx.map_read(&self.staging.buf, (k * 8) as u64).await?;
        let words: &[u32] = bytemuck::cast_slice(&bytes);
        Ok((0..k)
            .map(|i| (words[k + i], f32::from_bits(words[i])))
            .collect())
    }

    /// Blocking [`TopK::read_async`].
    pub fn read(&self, ctx: &GpuContext) -> Result<Vec<(u32, f32)>> {
        pollster::block_on(self.read_async(ctx))
    }
}
