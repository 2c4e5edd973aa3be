//! Rust wrappers of the kernels. Each op is built once (pipelines fetched from the cache,
//! parameter uniforms and bind groups created) and then recorded into any number of
//! compute passes with `record`, which creates nothing. One file per kernel family.

mod attention;
mod attention_fast;
mod coop_fused;
mod decode;
mod elementwise;
mod embed;
mod glu;
mod matmul;
mod matvec;
mod narrow;
mod norm;
mod paged;
mod qmatvec;
mod rope_table;
mod rowops;
mod select;
mod split_k;
mod window_attention;

pub use attention::{Attention, AttnDims, AttnOpts, RopeKv, RopeOpts, ATTN_CHUNK};
#[cfg(test)]
pub(crate) use coop_fused::tail_plan;
pub use coop_fused::{CoopFused, GluTail};
pub use decode::{NormIn, NormMatvec, NormMatvecKind, NormQuant};
pub(crate) use elementwise::kernel_glu;
pub use elementwise::{ElemKind, Elementwise};
pub use embed::Embed;
pub use glu::Glu;
pub(crate) use matmul::prompt_kind;
#[cfg(test)]
pub(crate) use matmul::COOP_MAX_K;
pub use matmul::{
    narrow_step, wide_step, MatmulKind, OwnTiles, TernaryLinear, TernaryMatmul, MM_TILE_TOKENS,
};
pub use matvec::{F16Matvec, Ternary3, TernaryGlu, TernaryMatvec, TernaryWeights};
pub use narrow::NarrowFused;
pub use norm::{NormOut, QuantAct, RmsNorm};
#[cfg(test)]
pub(crate) use paged::prompt_kernel_coop;
pub use paged::{GpuKv, KvIndex};
#[cfg(test)]
pub(crate) use paged::{ATTN_PROMPT_BYTES, ATTN_PROMPT_COOP_BYTES};
pub(crate) use paged::{ATTN_PROMPT_F32_BYTES, DECODE_ROW};
pub use qmatvec::{
    ActQuant, MatIn, QAct, QEmbed, QFormat, QMatvec, QMatvecOpts, QWeights, QuantizeAct,
};
pub use rope_table::RopeTable;
pub use rowops::{PosTable, RowOp, RowOpKind};
pub use select::{TopK, MAX_TOPK, SELECT_CHUNK};
pub use split_k::SplitK;
pub use window_attention::WindowAttention;

use super::buffers::{GpuBuffer, UNIFORM};
use super::context::GpuContext;
use super::pipelines::{PipelineKey, Variant};
use crate::{Error, Result};

/// Threads per workgroup of every kernel.
pub const WG: u32 = 256;

/// One recorded kernel launch: pipeline, bind group and workgroup count along x.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    groups_x: u32,
}

impl Dispatch {
    pub(crate) fn new(
        ctx: &GpuContext,
        key: PipelineKey,
        label: &str,
        bindings: &[(u32, wgpu::BufferBinding<'_>)],
        groups_x: u32,
    ) -> Result<Dispatch> {
        let pipeline = ctx.pipeline(key)?;
        let layout = pipeline.get_bind_group_layout(0);
        let bind_group = ctx.create_bind_group(label, &layout, bindings);
        Ok(Dispatch {
            pipeline,
            bind_group,
            groups_x,
        })
    }

    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, groups_y: u32) {
        self.record_grid(pass, [self.groups_x, groups_y, 1]);
    }

    /// Records the launch over a grid of `groups` workgroups (x, y, z).
    pub(crate) fn record_grid(&self, pass: &mut wgpu::ComputePass<'_>, groups: [u32; 3]) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
}

pub(crate) fn uniform(ctx: &GpuContext, label: &str, words: &[u32]) -> Result<GpuBuffer> {
    GpuBuffer::from_bytes(ctx, label, bytemuck::cast_slice(words), UNIFORM)
}

/// A uniform buffer holding one `#[repr(C)]` parameter struct.
pub(crate) fn uniform_pod<T: bytemuck::Pod>(
    ctx: &GpuContext,
    label: &str,
    params: &T,
) -> Result<GpuBuffer> {
    GpuBuffer::from_bytes(ctx, label, bytemuck::bytes_of(params), UNIFORM)
}

pub(crate) fn check_tpr(tpr: u32) -> Result<()> {
    if tpr.is_power_of_two() && tpr <= WG {
        Ok(())
    } else {
        Err(Error::KernelArgs(format!(
            "threads per row must be a power of two ≤ {WG}, got {tpr}"
        )))
    }
}

impl GpuContext {
    /// The best variant for a kernel with `tpr` lanes per row: F16 when enabled, subgroup
    /// reductions when enabled and a row's lanes fit in the smallest subgroup.
    pub fn variant(&self, tpr: u32) -> Variant {
        let c = self.caps();
        Variant {
            f16: c.f16,
            subgroups: c.subgroups && tpr <= c.subgroup_min_size,
            kv_f32: false,
        }
    }
}

/// The per-step uniform `{ n_tokens, pos, 0, 0 }` read by batched kernels; written once
/// per step with [`StepUniform::write`].
#[derive(Clone, Debug)]
pub struct StepUniform {
    /// The 16-byte uniform buffer.
    pub buf: GpuBuffer,
}

impl StepUniform {
    /// A zeroed step uniform.
    pub fn new(ctx: &GpuContext) -> Result<StepUniform> {
        Ok(StepUniform {
            buf: uniform(ctx, "step", &[0; 4])?,
        })
    }

    /// Queues the new values (ordered before the next submit).
    pub fn write(&self, ctx: &GpuContext, n_tokens: u32, pos: u32) {
        self.buf
            .write(ctx, 0, bytemuck::cast_slice(&[n_tokens, pos, 0, 0]));
    }
}
