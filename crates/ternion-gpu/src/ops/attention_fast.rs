//! The split-K decode attention of the "fast" numerics (`attention_fast.wgsl`): every
//! decode row's keys split over the KV pages and merged by the last page to finish, in
//! one launch.

use super::attention::{FusedRope, ATTN_FAST_KEYS};
use super::{uniform, AttnDims, Dispatch, GpuKv, KvIndex};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::kv::PAGE_POSITIONS;
use crate::pipelines::{Kernel, PipelineKey};
use crate::Result;

/// The `split` launch and its scratch (partial sums per sequence, head and page, sized for
/// contexts of up to [`ATTN_FAST_KEYS`]; a finished-page counter per sequence and kv head).
pub(super) struct FastSplit {
    split: Dispatch,
    /// The split that also rotates and stores (single-token steps), when fused.
    split_rope: Option<Dispatch>,
    n_head_kv: u32,
    _keep: [GpuBuffer; 3],
}

impl FastSplit {
    /// Binds the queries `q`, the layer's cache and the index, and `out` (f32, a head row
    /// per query head per token); with `rope`, single-token steps take the rotating split.
    pub(super) fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        q: &GpuBuffer,
        (kv, index): (&GpuKv, &KvIndex),
        out: &GpuBuffer,
        rope: Option<&FusedRope>,
    ) -> Result<FastSplit> {
        let pkey = |rope| PipelineKey {
            kernel: Kernel::AttentionFast {
                rope,
                head_dim: dims.head_dim as u32,
                group: (dims.n_head / dims.n_head_kv) as u32,
            },
            variant: kv.variant(),
        };
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        let pages = ATTN_FAST_KEYS / PAGE_POSITIONS as u32;
        let params = uniform(
            ctx,
            "attention_fast.params",
            &[
                dims.n_head as u32,
                dims.n_head_kv as u32,
                dims.head_dim as u32,
                index.n_ctx as u32,
                scale.to_bits(),
                pages,
                index.pps as u32,
                0,
            ],
        )?;
        let part = GpuBuffer::zeroed(
            ctx,
            "attention_fast.part",
            (index.slots * dims.n_head * (dims.head_dim + 2) * 4) as u64 * u64::from(pages),
        )?;
        // Zero between launches: the merging workgroup sets its counter back.
        let done = GpuBuffer::zeroed(
            ctx,
            "attention_fast.done",
            (index.slots * dims.n_head_kv * 4) as u64,
        )?;
        let bindings = [
            (0, params.binding()),
            (2, q.binding()),
            (3, kv.k.binding()),
            (4, kv.v.binding()),
            (5, out.binding()),
            (8, part.binding()),
            (9, index.attn_toks().binding()),
            (10, index.pages.binding()),
            (13, done.binding()),
        ];
        let n_head_kv = dims.n_head_kv as u32;
        let split = Dispatch::new(
            ctx,
            pkey(false),
            "attention_fast.split",
            &bindings,
            n_head_kv,
        )?;
        // The rotating split binds 11 storage buffers (WebGPU's default limit is 8).
        let fits = ctx.device.limits().max_storage_buffers_per_shader_stage >= 11;
        let split_rope = match rope.filter(|_| fits) {
            Some(r) => {
                let mut b = bindings.to_vec();
                b.extend([
                    (6, r.k.binding()),
                    (7, r.table.binding()),
                    (11, r.v.binding()),
                    (12, r.params.binding()),
                ]);
                Some(Dispatch::new(
                    ctx,
                    pkey(true),
                    "attention_fast.split_rope",
                    &b,
                    n_head_kv,
                )?)
            }
            None => None,
        };
        Ok(FastSplit {
            split,
            split_rope,
            n_head_kv: dims.n_head_kv as u32,
            _keep: [params, part, done],
        })
    }

    /// True when single-token steps take the rotating split.
    pub(super) fn fuses_rope(&self) -> bool {
        self.split_rope.is_some()
    }

    /// The split over the pages of up to `n_kv` keys, merged in the same launch, for
    /// `n_tokens` rows (`rotate`: the rotating split when there is one — every row a decode
    /// row whose key and value no `RopeKv` launch stored).
    pub(super) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        n_kv: u32,
        rotate: bool,
    ) {
        let pages = n_kv.div_ceil(PAGE_POSITIONS as u32);
        let split = match (&self.split_rope, rotate) {
            (Some(s), true) => s,
            _ => &self.split,
        };
        split.record_grid(pass, [self.n_head_kv, pages, n_tokens]);
    }
}
