//! The paged KV cache (F16 or F32) on the GPU and the per-step index into it (token positions and
//! slots, page tables, prompt query blocks), shared by every layer's attention.

use crate::buffers::GpuBuffer;
use crate::context::{GpuContext, PrefillKernel};
use crate::kv::{KvType, PAGE_POSITIONS};
use crate::pipelines::Variant;
use crate::{Error, Result};

/// Top bit of a token's slot (attention) and of a picked row (LM head): this row is the
/// one token of its sequence in a multi-sequence step and keeps the decode numerics
/// (`paged_kv.wgsl` DECODE_ROW).
pub(crate) const DECODE_ROW: u32 = 1 << 31;

/// Queries per workgroup of the prompt kernel (`attention_prompt.wgsl` BQ).
pub const ATTN_PROMPT_QUERIES: u32 = 32;
/// Workgroup memory `attention_prompt.wgsl` declares, in bytes.
pub(crate) const ATTN_PROMPT_BYTES: u32 = 30_224;
/// The same with its key and value tiles held as f32 (variant `F32_TILES`), which the
/// pipeline cache picks on devices that allow it (NVIDIA's 48 KiB do; Apple's and
/// lavapipe's 32 KiB do not).
pub(crate) const ATTN_PROMPT_F32_BYTES: u32 = 46_992;
/// The same with P·V on cooperative matrices (variant `COOP_PV`: F16 value tile,
/// probability parts, accumulator scratch), which [`Attention`](super::Attention) picks on
/// adapters with cooperative matrices that allow it.
pub(crate) const ATTN_PROMPT_COOP_BYTES: u32 = 48_688;

/// True when `attention_prompt.wgsl` runs the prompts over a `ty` cache on `ctx`'s device:
/// an F16 cache, and a device that allows its workgroup memory (most do; WebGPU's default
/// limit, 16 KiB, does not). Other prompts run with `attention.wgsl`'s `prefill`.
pub fn prompt_kernel_fits(ctx: &GpuContext, ty: KvType) -> bool {
    ty == KvType::F16 && ctx.device.limits().max_compute_workgroup_storage_size >= ATTN_PROMPT_BYTES
}

/// True when `ctx` runs `attention_prompt.wgsl`'s P·V on cooperative matrices: its prompt
/// matmuls do ([`PrefillKernel::Coop`]: 16×16×16 f16 matrices, subgroups of 32) and its
/// device allows the variant's workgroup memory.
pub(crate) fn prompt_kernel_coop(ctx: &GpuContext) -> bool {
    ctx.caps().prefill == PrefillKernel::Coop
        && ctx.device.limits().max_compute_workgroup_storage_size >= ATTN_PROMPT_COOP_BYTES
}

/// One layer's paged KV cache on the GPU: `n_pages` pages of [`PAGE_POSITIONS`] rows of
/// `kv_dim` elements for keys and for values (F16, two per u32 word, or F32:
/// `kv_type.wgsl`), written by [`RopeKv`] and read by [`Attention`] through the page tables
/// of a [`KvIndex`].
#[derive(Clone, Debug)]
pub struct GpuKv {
    /// Keys.
    pub k: GpuBuffer,
    /// Values.
    pub v: GpuBuffer,
    /// Pages held.
    pub n_pages: usize,
    /// Elements per position (n_head_kv · head_dim).
    pub kv_dim: usize,
    /// Element type.
    pub ty: KvType,
}

impl GpuKv {
    /// A zeroed cache of `n_pages` pages of positions of `kv_dim` (even) elements of `ty`.
    pub fn new(ctx: &GpuContext, n_pages: usize, kv_dim: usize, ty: KvType) -> Result<GpuKv> {
        if !kv_dim.is_multiple_of(2) {
            return Err(Error::KernelArgs(format!("KV cache: odd kv_dim {kv_dim}")));
        }
        let bytes = n_pages
            .checked_mul(PAGE_POSITIONS * kv_dim * ty.bytes())
            .ok_or_else(|| Error::KernelArgs(format!("KV cache: {n_pages} pages overflow")))?;
        Ok(GpuKv {
            k: GpuBuffer::zeroed(ctx, "kv.k", bytes as u64)?,
            v: GpuBuffer::zeroed(ctx, "kv.v", bytes as u64)?,
            n_pages,
            kv_dim,
            ty,
        })
    }

    /// Bytes of one page of keys (or values).
    pub fn page_bytes(&self) -> u64 {
        (PAGE_POSITIONS * self.kv_dim * self.ty.bytes()) as u64
    }

    /// The kernel variant of the launches that store or read this cache.
    pub fn variant(&self) -> Variant {
        Variant {
            kv_f32: self.ty == KvType::F32,
            ..Variant::default()
        }
    }

    /// Records copies of whole pages `(from, to)` of the keys and the values, through
    /// `scratch` (at least one page: a buffer cannot be copied into itself).
    pub fn copy_pages(
        &self,
        enc: &mut wgpu::CommandEncoder,
        copies: &[(u32, u32)],
        scratch: &GpuBuffer,
    ) {
        let b = self.page_bytes();
        for cache in [&self.k, &self.v] {
            for &(from, to) in copies {
                enc.copy_buffer_to_buffer(&cache.buf, u64::from(from) * b, &scratch.buf, 0, b);
                enc.copy_buffer_to_buffer(&scratch.buf, 0, &cache.buf, u64::from(to) * b, b);
            }
        }
    }
}

/// Where each token of a step goes in the paged caches: its (position, sequence slot)
/// pair, and every slot's page table. Shared by all layers; written once per step.
#[derive(Clone, Debug)]
pub struct KvIndex {
    /// `max_batch` × (position, slot), u32 pairs.
    pub toks: GpuBuffer,
    /// Non-causal attention (`attention.causal = false`): the pairs the attention kernels
    /// read instead of `toks`, each position replaced by the last position of its
    /// sequence's tokens in the step, so every token sees the whole step (and the positions
    /// cached before it), as the CPU's attention rows do. `None`: causal.
    attn_toks: Option<GpuBuffer>,
    /// `slots × pps` page ids.
    pub pages: GpuBuffer,
    /// Page-table entries per slot (pages of the longest sequence).
    pub pps: usize,
    /// Most positions of one sequence.
    pub n_ctx: usize,
    /// Sequence slots.
    pub slots: usize,
    /// Most tokens of one step.
    pub max_batch: usize,
    /// The step's query blocks for `attention_prompt.wgsl`: word pair 0 = (count, 0), then
    /// (first token, tokens) of each block of at most [`ATTN_PROMPT_QUERIES`] tokens of one
    /// sequence (decode rows excluded). Written by the step.
    pub blocks: GpuBuffer,
}

impl KvIndex {
    /// The (position, slot) pairs the attention kernels read: [`KvIndex::toks`], or the
    /// whole-step positions of a non-causal model.
    pub fn attn_toks(&self) -> &GpuBuffer {
        self.attn_toks.as_ref().unwrap_or(&self.toks)
    }

    /// False for a non-causal model's index.
    pub fn causal(&self) -> bool {
        self.attn_toks.is_none()
    }

    /// Writes the step's (position, slot | flags) pairs, and for a non-causal model their
    /// whole-step positions (`scratch` holds them; a sequence's tokens are consecutive).
    pub fn write_toks(&self, ctx: &GpuContext, toks: &[[u32; 2]], scratch: &mut Vec<[u32; 2]>) {
        self.toks.write(ctx, 0, bytemuck::cast_slice(toks));
        if let Some(buf) = &self.attn_toks {
            scratch.clear();
            for run in toks.chunk_by(|a, b| (a[1] ^ b[1]) & !DECODE_ROW == 0) {
                let last = run[run.len() - 1][0];
                scratch.extend(run.iter().map(|t| [last, t[1]]));
            }
            buf.write(ctx, 0, bytemuck::cast_slice(scratch));
        }
    }

    /// Most query blocks of a step of `max_batch` tokens over `slots` sequences.
    pub fn max_blocks(max_batch: usize, slots: usize) -> usize {
        max_batch.div_ceil(ATTN_PROMPT_QUERIES as usize) + slots
    }

    /// The query blocks of a step whose sequences hold `lens` consecutive tokens each, in
    /// order (`out` is cleared; pair 0 is the count): blocks of [`ATTN_PROMPT_QUERIES`] from
    /// the start of each sequence's tokens; a sequence's single token beside others is a
    /// decode row and gets none.
    pub fn write_blocks(
        &self,
        ctx: &GpuContext,
        lens: impl ExactSizeIterator<Item = usize>,
        out: &mut Vec<[u32; 2]>,
    ) {
        out.clear();
        out.push([0, 0]);
        let several = lens.len() > 1;
        let mut t0 = 0;
        for len in lens {
            if !(several && len == 1) {
                let bq = ATTN_PROMPT_QUERIES as usize;
                out.extend(
                    (0..len)
                        .step_by(bq)
                        .map(|b| [(t0 + b) as u32, bq.min(len - b) as u32]),
                );
            }
            t0 += len;
        }
        out[0][0] = (out.len() - 1) as u32;
        self.blocks.write(ctx, 0, bytemuck::cast_slice(out));
    }

    /// Zeroed buffers for steps of up to `max_batch` tokens over `slots` sequences of up to
    /// `n_ctx` positions, with causal or whole-step attention.
    pub fn new(
        ctx: &GpuContext,
        max_batch: usize,
        slots: usize,
        n_ctx: usize,
        causal: bool,
    ) -> Result<KvIndex> {
        let pps = n_ctx.div_ceil(PAGE_POSITIONS).max(1);
        let toks = || GpuBuffer::zeroed(ctx, "kv.toks", (max_batch.max(1) * 8) as u64);
        Ok(KvIndex {
            toks: toks()?,
            attn_toks: if causal { None } else { Some(toks()?) },
            pages: GpuBuffer::zeroed(ctx, "kv.pages", (slots.max(1) * pps * 4) as u64)?,
            pps,
            n_ctx,
            slots,
            max_batch: max_batch.max(1),
            blocks: GpuBuffer::zeroed(
                ctx,
                "kv.blocks",
                (Self::max_blocks(max_batch, slots) + 1) as u64 * 8,
            )?,
        })
    }
}
