//! The RoPE angle table (`rope_table.wgsl`): (cos θ, sin θ) of every rotation pair at every
//! position a KV cache holds, filled once on the GPU; [`RopeKv`](super::RopeKv) and the
//! fused decode attention read it instead of computing angles in every launch.

use super::{uniform, AttnDims, Dispatch, RopeOpts};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Pairs a workgroup of the fill covers (`rope_table.wgsl` workgroup size).
const PAIRS_PER_GROUP: u32 = 64;
/// Most grid rows of the fill (WebGPU's limit per dimension); each walks every such row.
const MAX_ROWS: u32 = 65_535;

/// (cos θ, sin θ) for `n_pos` positions × `n_rot / 2` pairs, as vec2<f32> in
/// position-major order.
#[derive(Clone, Debug)]
pub struct RopeTable {
    /// The table (at least one element, so that a model without rotation binds it too).
    pub buf: GpuBuffer,
    /// The `theta_scale` bits and n_rot it was filled for.
    key: (u32, usize),
    /// The frequency-factor buffer it divided by, if any.
    freqs: Option<wgpu::Buffer>,
    /// Positions it covers.
    n_pos: usize,
}

impl RopeTable {
    /// Fills the table for positions `0..n_pos` with the angles of `dims` (`n_rot`,
    /// `rope_base`) and `rope.freqs`; the fill is submitted now and runs before any later
    /// submission reads it.
    pub fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        rope: RopeOpts<'_>,
        n_pos: usize,
    ) -> Result<RopeTable> {
        let half = dims.n_rot / 2;
        if let Some(f) = rope.freqs {
            if f.size < (half * 4) as u64 {
                return Err(Error::KernelArgs(format!(
                    "rope table: {} bytes of frequency factors for {half} pairs",
                    f.size
                )));
            }
        }
        let bytes = (n_pos * half).max(1) as u64 * 8;
        let limit = ctx.device.limits().max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::KernelArgs(format!(
                "rope table: {n_pos} positions × {half} pairs need {bytes} bytes, more than \
                 the adapter's {limit}-byte storage binding"
            )));
        }
        let key = (theta_scale(dims).to_bits(), dims.n_rot);
        let buf = GpuBuffer::zeroed(ctx, "rope_table", bytes)?;
        if half > 0 && n_pos > 0 {
            let params = uniform(
                ctx,
                "rope_table.params",
                &[
                    half as u32,
                    key.0,
                    u32::from(rope.freqs.is_some()),
                    n_pos as u32,
                ],
            )?;
            let pkey = PipelineKey {
                kernel: Kernel::RopeTable,
                variant: Variant::default(),
            };
            // Never read without factors: a word stands in (the table itself cannot: it is
            // written in the same launch).
            let none = GpuBuffer::zeroed(ctx, "rope_table.no_freqs", 16)?;
            let freqs = rope.freqs.unwrap_or(&none);
            let fill = Dispatch::new(
                ctx,
                pkey,
                "rope_table",
                &[
                    (0, params.binding()),
                    (1, freqs.binding()),
                    (2, buf.binding()),
                ],
                (half as u32).div_ceil(PAIRS_PER_GROUP),
            )?;
            let mut enc = ctx.encoder();
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                fill.record(&mut pass, (n_pos as u32).min(MAX_ROWS));
            }
            ctx.submit(enc);
        }
        Ok(RopeTable {
            buf,
            key,
            freqs: rope.freqs.map(|f| f.buf.clone()),
            n_pos,
        })
    }

    /// True when this table holds the angles of `dims` and `rope` (the same frequency-factor
    /// buffer, or none) for at least `n_pos` positions.
    pub fn serves(&self, dims: AttnDims, rope: RopeOpts<'_>, n_pos: usize) -> bool {
        self.key == (theta_scale(dims).to_bits(), dims.n_rot)
            && self.freqs.as_ref() == rope.freqs.map(|f| &f.buf)
            && self.n_pos >= n_pos
    }

    /// Positions it covers.
    pub fn positions(&self) -> usize {
        self.n_pos
    }
}

/// base^(−2/n_rot), the same f32 expression as backend/cpu/rope.rs.
fn theta_scale(dims: AttnDims) -> f32 {
    dims.rope_base.powf(-2.0 / dims.n_rot as f32)
}
