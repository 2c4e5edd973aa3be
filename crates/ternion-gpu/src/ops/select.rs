//! GPU top-k / argmax over the logits, each row optionally under a token mask.

use super::{uniform, Dispatch};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::generate::Mask;
use crate::pipelines::{Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Elements per workgroup in the first top-k pass.
pub const SELECT_CHUNK: u32 = 4096;
/// Largest k of [`TopK`].
pub const MAX_TOPK: u32 = 64;

/// Top-k (k ≤ 64) of each row of f32 logits, best first, ties to the lower index; k = 1 is
/// argmax. Only the k (value, id) pairs of each row need to come back to the host. A row
/// given a token mask ([`TopK::set_masks`]) selects as if the ids its mask does not allow
/// were −inf: exactly the top-k of the row masked on the host.
pub struct TopK {
    partial: Dispatch,
    merge: Dispatch,
    /// k best values.
    pub vals: GpuBuffer,
    /// Their ids.
    pub ids: GpuBuffer,
    staging: GpuBuffer,
    /// One flag word per row (non-zero: masked), then each row's mask bits.
    masks: GpuBuffer,
    /// Flag words as last written (all 0 until a row is masked).
    flags: Vec<u32>,
    /// Scratch for one row's mask bits, `n` bits rounded up to words.
    bits: Vec<u32>,
    k: u32,
    max_rows: u32,
    _keep: Vec<GpuBuffer>,
}

impl TopK {
    /// Selects from the first `n` values of `logits`.
    pub fn new(ctx: &GpuContext, logits: &GpuBuffer, n: u32, k: u32) -> Result<TopK> {
        Self::rows(ctx, logits, n, k, 1)
    }

    /// Selects from each of up to `max_rows` rows of `n` values of `logits`.
    pub fn rows(
        ctx: &GpuContext,
        logits: &GpuBuffer,
        n: u32,
        k: u32,
        max_rows: u32,
    ) -> Result<TopK> {
        if k == 0 || k > MAX_TOPK || n == 0 || max_rows == 0 {
            return Err(Error::KernelArgs(format!(
                "top-k: need 1 ≤ k ≤ {MAX_TOPK}, n ≥ 1 and rows ≥ 1, got k = {k}, n = {n}, \
                 rows = {max_rows}"
            )));
        }
        let chunks = n.div_ceil(SELECT_CHUNK);
        let cand = u64::from(chunks * k);
        let rows = u64::from(max_rows);
        let cand_v = GpuBuffer::zeroed(ctx, "topk.cand_vals", rows * cand * 4)?;
        let cand_i = GpuBuffer::zeroed(ctx, "topk.cand_ids", rows * cand * 4)?;
        let vals = GpuBuffer::zeroed(ctx, "topk.vals", rows * u64::from(k) * 4)?;
        let ids = GpuBuffer::zeroed(ctx, "topk.ids", rows * u64::from(k) * 4)?;
        let dummy = GpuBuffer::zeroed(ctx, "topk.unused", 4)?;
        let words = n.div_ceil(32);
        let masks = GpuBuffer::zeroed(ctx, "topk.masks", rows * (1 + u64::from(words)) * 4)?;
        let staging = GpuBuffer::with_usage(
            ctx,
            "topk.staging",
            rows * u64::from(k) * 8,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let p1 = uniform(ctx, "topk.params1", &[n, SELECT_CHUNK, chunks, max_rows])?;
        let p2 = uniform(ctx, "topk.params2", &[cand as u32, 0, 1, 0])?;
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
                (5, masks.binding()),
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
                (5, masks.binding()),
            ],
            1,
        )?;
        Ok(TopK {
            partial,
            merge,
            vals,
            ids,
            staging,
            masks,
            flags: vec![0; max_rows as usize],
            bits: vec![0; words as usize],
            k,
            max_rows,
            _keep: vec![cand_v, cand_i, dummy, p1, p2],
        })
    }

    /// Sets the token masks of the passes recorded next: row `i` selects only among the
    /// ids `masks[i]` allows (see [`allows`](crate::generate::allows): ids past the mask's
    /// end are not allowed), every id where it is `None` or past `masks`. Writes only
    /// what changed: nothing while no row is or was masked.
    pub fn set_masks(&mut self, ctx: &GpuContext, masks: &[Option<&Mask>]) -> Result<()> {
        if masks.len() > self.max_rows as usize {
            return Err(Error::KernelArgs(format!(
                "top-k masks: {} rows given, the top-k has {}",
                masks.len(),
                self.max_rows
            )));
        }
        let (rows, words) = (self.flags.len() as u64, self.bits.len() as u64);
        let mut changed = false;
        for (i, flag) in self.flags.iter_mut().enumerate() {
            let mask = masks.get(i).copied().flatten();
            let want = u32::from(mask.is_some());
            changed |= *flag != want;
            *flag = want;
            if let Some(mask) = mask {
                let n = mask.len().min(self.bits.len());
                self.bits[..n].copy_from_slice(&mask[..n]);
                self.bits[n..].fill(0);
                // Bits of ids past the row's length in its last word are never read.
                let at = (rows + i as u64 * words) * 4;
                self.masks.write(ctx, at, bytemuck::cast_slice(&self.bits));
            }
        }
        if changed {
            self.masks.write(ctx, 0, bytemuck::cast_slice(&self.flags));
        }
        Ok(())
    }

    /// Records both passes over the first row.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.record_rows(pass, 1);
    }

    /// Records both passes over the first `rows` rows (≤ the rows it was made for).
    pub fn record_rows(&self, pass: &mut wgpu::ComputePass<'_>, rows: u32) {
        let rows = rows.min(self.max_rows);
        self.partial.record(pass, rows);
        self.merge.record(pass, rows);
    }

    /// Records the copy of the first row's result into the host-visible staging buffer
    /// (after the pass).
    pub fn record_download(&self, enc: &mut wgpu::CommandEncoder) {
        self.record_download_rows(enc, 1);
    }

    /// Records the copy of the first `rows` rows' results (values, then ids).
    pub fn record_download_rows(&self, enc: &mut wgpu::CommandEncoder, rows: u32) {
        let bytes = u64::from(self.k * rows.min(self.max_rows)) * 4;
        enc.copy_buffer_to_buffer(&self.vals.buf, 0, &self.staging.buf, 0, bytes);
        enc.copy_buffer_to_buffer(&self.ids.buf, 0, &self.staging.buf, bytes, bytes);
    }

    /// Maps the staging buffer (after the submit of [`TopK::record_download`]) and returns
    /// the k (id, value) pairs, best first; missing candidates are `(u32::MAX, -inf)`.
    pub async fn read_async(&self, ctx: &GpuContext) -> Result<Vec<(u32, f32)>> {
        Ok(self.read_rows_async(ctx, 1).await?.concat())
    }

    /// [`TopK::read_async`] for the first `rows` rows (after
    /// [`TopK::record_download_rows`]): one list of k pairs per row.
    pub async fn read_rows_async(
        &self,
        ctx: &GpuContext,
        rows: u32,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let (k, rows) = (self.k as usize, rows.min(self.max_rows) as usize);
        let bytes = ctx
            .map_read(&self.staging.buf, (rows * k * 8) as u64)
            .await?;
        let words: &[u32] = bytemuck::cast_slice(&bytes);
        let (vals, ids) = words.split_at(rows * k);
        Ok((0..rows)
            .map(|r| {
                (r * k..(r + 1) * k)
                    .map(|i| (ids[i], f32::from_bits(vals[i])))
                    .collect()
            })
            .collect())
    }

    /// Blocking [`TopK::read_async`].
    pub fn read(&self, ctx: &GpuContext) -> Result<Vec<(u32, f32)>> {
        pollster::block_on(self.read_async(ctx))
    }
}
