//! Embedding gather.

use super::{uniform, Dispatch, WG};
use crate::buffers::{GpuBuffer, Sharded};
use crate::context::GpuContext;
use crate::pipelines::{Kernel, PipelineKey, Variant};
use crate::Result;

/// Gathers embedding rows: `out[t] = f32(table[ids[t]])`, one dispatch per table shard.
pub struct Embed {
    dispatches: Vec<Dispatch>,
    _params: Vec<GpuBuffer>,
}

impl Embed {
    /// `table`: F16 rows of `dim` elements (row_bytes = 2·dim); `ids`: u32 per token;
    /// `out`: f32, `dim` per token.
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        table: &Sharded,
        ids: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<Embed> {
        let dim = (table.row_bytes / 2) as u32;
        let key = PipelineKey {
            kernel: Kernel::Embed,
            variant,
        };
        let mut dispatches = Vec::new();
        let mut params = Vec::new();
        for (i, shard) in table.shards.iter().enumerate() {
            let (r0, rows) = table.shard_rows(i);
            let u = uniform(ctx, "embed.params", &[dim, r0 as u32, rows as u32, 0])?;
            dispatches.push(Dispatch::new(
                ctx,
                key,
                "embed",
                &[
                    (0, u.binding()),
                    (1, ids.binding()),
                    (2, shard.binding()),
                    (3, out.binding()),
                ],
                (dim / 2).div_ceil(WG),
            )?);
            params.push(u);
        }
        Ok(Embed {
            dispatches,
            _params: params,
        })
    }

    /// Records the gather of the first `n_tokens` ids.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        for d in &self.dispatches {
            d.record(pass, n_tokens);
        }
    }

    /// Dispatches per record (one per table shard).
    pub fn dispatch_count(&self) -> usize {
        self.dispatches.len()
    }
}
