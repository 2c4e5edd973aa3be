//! RoPE + KV-cache store, and causal attention over the cache.

use super::attention_fast::FastSplit;
use super::paged::{prompt_kernel_coop, prompt_kernel_fits, GpuKv, KvIndex, ATTN_PROMPT_QUERIES};
use super::rope_table::RopeTable;
use super::{uniform, Dispatch, StepUniform, WG};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::model::graph::RopeMode;
use crate::pipelines::{AttnStage, Kernel, PipelineKey};
use crate::{Error, Result};

/// Attention geometry shared by [`RopeKv`] and [`Attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnDims {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_head_kv: usize,
    /// Width of a head (even, ≤ 512).
    pub head_dim: usize,
    /// Rotated dims per head (a multiple of 4, ≤ head_dim).
    pub n_rot: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
}

impl AttnDims {
    fn check(&self) -> Result<()> {
        let ok = self.n_head_kv > 0
            && self.n_head.is_multiple_of(self.n_head_kv)
            && self.head_dim > 0
            && self.head_dim.is_multiple_of(2)
            && self.head_dim <= 512
            && self.n_rot.is_multiple_of(4)
            && self.n_rot <= self.head_dim;
        if ok {
            Ok(())
        } else {
            Err(Error::KernelArgs(format!(
                "attention: unsupported geometry {self:?} (need n_head_kv | n_head, even \
                 head_dim in 2..=512, n_rot a multiple of 4 and ≤ head_dim)"
            )))
        }
    }

    /// Width of the key/value rows.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// How [`RopeKv`] rotates: the pairing and optional per-pair frequency divisors.
#[derive(Clone, Copy)]
pub struct RopeOpts<'a> {
    /// NEOX (i with i + n_rot/2) or NORM (2i with 2i + 1).
    pub mode: RopeMode,
    /// `n_rot/2` f32 divisors of the pair angles (Llama-3 `rope_freqs`).
    pub freqs: Option<&'a GpuBuffer>,
}

/// RoPE of `q` (in place) and `k` at the step's positions, then `k` and `v` stored into
/// the cache in its element type (`rope_kv.wgsl`). With `n_rot = 0` it is the plain KV store (GPT-2).
pub struct RopeKv {
    dispatch: Dispatch,
    inputs: FusedRope,
    /// Single-token steps leave the work to the attention's fused split.
    fused: bool,
}

impl RopeKv {
    /// NEOX RoPE without frequency factors (its angle table filled for the cache's
    /// positions). `q`: f32, `n_head·head_dim` per token; `k`, `v`: f32, `kv_dim` per token.
    pub fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        step: &StepUniform,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        kv: (&GpuKv, &KvIndex),
    ) -> Result<RopeKv> {
        let rope = RopeOpts {
            mode: RopeMode::Neox,
            freqs: None,
        };
        let table = RopeTable::new(ctx, dims, rope, kv.1.n_ctx)?;
        Self::with_rope(ctx, dims, (rope, &table), step, q, k, v, kv)
    }

    /// Like [`RopeKv::new`], with the pairing of `rope` and the angles of `table` (filled
    /// for the same dims and frequency factors, for every position of the cache).
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn with_rope(
        ctx: &GpuContext,
        dims: AttnDims,
        (rope, table): (RopeOpts<'_>, &RopeTable),
        step: &StepUniform,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        (kv, index): (&GpuKv, &KvIndex),
    ) -> Result<RopeKv> {
        dims.check()?;
        if !table.serves(dims, rope, index.n_ctx) {
            return Err(Error::KernelArgs(format!(
                "rope_kv: an angle table of {} positions for other dims or factors than {dims:?}                  over {} positions",
                table.positions(),
                index.n_ctx
            )));
        }
        if kv.kv_dim != dims.kv_dim() {
            return Err(Error::KernelArgs(format!(
                "rope_kv: cache rows of {} for kv_dim {}",
                kv.kv_dim,
                dims.kv_dim()
            )));
        }
        let params = uniform(
            ctx,
            "rope_kv.params",
            &[
                dims.n_head as u32,
                dims.n_head_kv as u32,
                dims.head_dim as u32,
                dims.n_rot as u32,
                u32::from(rope.mode == RopeMode::Norm),
                index.pps as u32,
                0,
                0,
            ],
        )?;
        let items = ((dims.n_head + 2 * dims.n_head_kv) * dims.head_dim / 2) as u32;
        let key = PipelineKey {
            kernel: Kernel::RopeKv,
            variant: kv.variant(),
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "rope_kv",
            &[
                (0, params.binding()),
                (1, step.buf.binding()),
                (2, q.binding()),
                (3, k.binding()),
                (4, v.binding()),
                (5, kv.k.binding()),
                (6, kv.v.binding()),
                (7, table.buf.binding()),
                (8, index.toks.binding()),
                (9, index.pages.binding()),
            ],
            items.div_ceil(WG),
        )?;
        Ok(RopeKv {
            dispatch,
            inputs: FusedRope {
                params,
                k: k.clone(),
                v: v.clone(),
                table: table.buf.clone(),
            },
            fused: false,
        })
    }

    /// What [`Attention`] needs to do this launch's work itself in single-token steps.
    pub fn fused_inputs(&self) -> &FusedRope {
        &self.inputs
    }

    /// Leaves single-token steps of at most [`ATTN_FAST_KEYS`] keys to the attention built
    /// with [`RopeKv::fused_inputs`] (which must then use them: [`Attention::fuses_rope`]).
    pub fn set_fused(&mut self) {
        self.fused = true;
    }

    /// Records the rotation and cache store of `n_tokens` tokens (the step uniform must hold
    /// the same count, the index their positions and slots).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }

    /// [`RopeKv::record`] in a step whose longest context is `n_kv` keys (`all_decode`:
    /// every token is the one its sequence brings): nothing when the attention split does
    /// the work (a single token, or decode rows only).
    pub fn record_step(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        n_kv: u32,
        all_decode: bool,
    ) {
        if !self.skips(n_tokens, n_kv, all_decode) {
            self.record(pass, n_tokens);
        }
    }

    /// True when [`RopeKv::record`] records nothing for this step.
    pub fn skips(&self, n_tokens: u32, n_kv: u32, all_decode: bool) -> bool {
        self.fused && (n_tokens == 1 || all_decode) && n_kv <= ATTN_FAST_KEYS
    }
}

/// The inputs of a [`RopeKv`] that the fused decode split reads: its parameter uniform,
/// the new keys and values (f32, unrotated) and the angle table.
#[derive(Clone, Debug)]
pub struct FusedRope {
    /// `rope_kv.wgsl`'s Params.
    pub params: GpuBuffer,
    /// T × kv_dim new keys.
    pub k: GpuBuffer,
    /// T × kv_dim new values.
    pub v: GpuBuffer,
    /// (cos θ, sin θ) of every pair at every cache position ([`RopeTable`]).
    pub table: GpuBuffer,
}

/// Keys per chunk of the decode split (`attention.wgsl` CHUNK).
pub const ATTN_CHUNK: u32 = 256;

/// How [`Attention`] computes: the reference's decode rounding, and the "fast" numerics
/// (with the step uniform its tiled prompt kernel reads).
#[derive(Clone, Copy)]
pub struct AttnOpts<'a> {
    /// Round a single token's probabilities to F16 (the exact numerics).
    pub round_p: bool,
    /// The fast kernels, when given the step uniform.
    pub fast: Option<&'a StepUniform>,
    /// With `fast`: single-token steps rotate q and k and store the new key and value in
    /// the split (`attention_fast.wgsl` ROPE) instead of a [`RopeKv`] launch.
    pub rope: Option<&'a FusedRope>,
}

/// Most keys of the split decode (`attention_fast.wgsl` FAST_KEYS).
pub const ATTN_FAST_KEYS: u32 = 2048;

/// GQA attention over a [`GpuKv`] (`attention.wgsl`), causal or, for a non-causal model,
/// over the whole step (the index's [`KvIndex::attn_toks`]): flash-decoding in three
/// dispatches for one token, one workgroup per (head, token) for several (one sequence's
/// prompt, or tokens of different sequences).
pub struct Attention {
    scores: Dispatch,
    probs_pv: Dispatch,
    merge: Dispatch,
    prefill: Dispatch,
    /// The decode rows' split-K kernels of the "fast" numerics.
    split: Option<Box<FastSplit>>,
    /// The tiled prompt kernel of the "fast" numerics (`attention_prompt.wgsl`).
    tiled: Option<Dispatch>,
    /// Sequence slots (bound on the blocks a step adds for partial ones).
    slots: u32,
    n_head: u32,
    n_ctx: u32,
    _keep: Vec<GpuBuffer>,
}

impl Attention {
    /// `q`: rotated f32 queries, `n_head·head_dim` per token; `out`: f32, same shape. A
    /// single token rounds its probabilities to F16 when `round_p` (the reference's decode
    /// numerics); a batch keeps them in f32. With `fast` (the "fast" numerics policy, head
    /// widths that are a multiple of 8 up to 256, at most 32 query heads of at most 1,024
    /// values per kv head), every decode row whose context fits [`ATTN_FAST_KEYS`] keys — a single
    /// token, or the one token of a sequence in a multi-sequence step — runs split over the
    /// KV pages and merged (`attention_fast.wgsl`); and a prompt step of one sequence
    /// (head width 64 or 128) runs as tiled flash attention (`attention_prompt.wgsl`,
    /// where the device allows its workgroup memory).
    pub fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        q: &GpuBuffer,
        (kv, index): (&GpuKv, &KvIndex),
        out: &GpuBuffer,
        opts: AttnOpts<'_>,
    ) -> Result<Attention> {
        dims.check()?;
        let round_p = opts.round_p;
        let group = dims.n_head / dims.n_head_kv;
        let fast = opts.fast.is_some()
            && dims.head_dim.is_multiple_of(8)
            && dims.head_dim <= 256
            && group <= 32
            && group * dims.head_dim <= 1024;
        // The tiled kernel assumes causal blocks of consecutive positions.
        let tiled_ok = fast
            && index.causal()
            && matches!(dims.head_dim, 64 | 128)
            && prompt_kernel_fits(ctx, kv.ty);
        let n_ctx = index.n_ctx;
        let max_chunks = (n_ctx as u32).div_ceil(ATTN_CHUNK);
        let hq = dims.n_head * dims.head_dim;
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        let params = uniform(
            ctx,
            "attention.params",
            &[
                dims.n_head as u32,
                dims.n_head_kv as u32,
                dims.head_dim as u32,
                n_ctx as u32,
                scale.to_bits(),
                max_chunks,
                index.pps as u32,
                0,
            ],
        )?;
        let scores = GpuBuffer::zeroed(ctx, "attention.scores", (dims.n_head * n_ctx * 4) as u64)?;
        // One row of chunk stats per token of the largest step (decode rows of a batch).
        let stats = GpuBuffer::zeroed(
            ctx,
            "attention.stats",
            (index.max_batch * dims.n_head * 8) as u64 * u64::from(max_chunks),
        )?;
        let partial = GpuBuffer::zeroed(
            ctx,
            "attention.partial",
            u64::from(max_chunks) * hq as u64 * 4,
        )?;
        let key = |stage| PipelineKey {
            kernel: Kernel::Attention {
                stage,
                round_p: round_p && stage == AttnStage::ProbsPv,
                fast,
                tiled: tiled_ok,
            },
            variant: kv.variant(),
        };
        let (u, toks, pages) = (
            params.binding(),
            index.attn_toks().binding(),
            index.pages.binding(),
        );
        let scores_d = Dispatch::new(
            ctx,
            key(AttnStage::Scores),
            "attention.scores",
            &[
                (0, u.clone()),
                (2, q.binding()),
                (3, kv.k.binding()),
                (6, scores.binding()),
                (7, stats.binding()),
                (9, toks.clone()),
                (10, pages.clone()),
            ],
            0,
        )?;
        let probs_pv = Dispatch::new(
            ctx,
            key(AttnStage::ProbsPv),
            "attention.probs_pv",
            &[
                (0, u.clone()),
                (4, kv.v.binding()),
                (6, scores.binding()),
                (7, stats.binding()),
                (8, partial.binding()),
                (9, toks.clone()),
                (10, pages.clone()),
            ],
            0,
        )?;
        let merge = Dispatch::new(
            ctx,
            key(AttnStage::Merge),
            "attention.merge",
            &[
                (0, u.clone()),
                (5, out.binding()),
                (8, partial.binding()),
                (9, toks.clone()),
            ],
            ((hq / 2) as u32).div_ceil(WG),
        )?;
        let prefill = Dispatch::new(
            ctx,
            key(AttnStage::Prefill),
            "attention.prefill",
            &[
                (0, u.clone()),
                (2, q.binding()),
                (3, kv.k.binding()),
                (4, kv.v.binding()),
                (5, out.binding()),
                (7, stats.binding()),
                (9, toks.clone()),
                (10, pages.clone()),
            ],
            dims.n_head as u32,
        )?;
        let split = if fast {
            Some(Box::new(FastSplit::new(
                ctx,
                dims,
                q,
                (kv, index),
                out,
                opts.rope,
            )?))
        } else {
            None
        };
        let tiled = match opts.fast {
            Some(_) if tiled_ok => Some(Dispatch::new(
                ctx,
                PipelineKey {
                    kernel: Kernel::AttentionPrompt {
                        coop: prompt_kernel_coop(ctx),
                        head_dim: dims.head_dim as u32,
                    },
                    variant: kv.variant(),
                },
                "attention_prompt",
                &[
                    (0, params.binding()),
                    (1, index.blocks.binding()),
                    (2, q.binding()),
                    (3, kv.k.binding()),
                    (4, kv.v.binding()),
                    (5, out.binding()),
                    (9, index.toks.binding()),
                    (10, index.pages.binding()),
                ],
                0,
            )?),
            _ => None,
        };
        Ok(Attention {
            scores: scores_d,
            probs_pv,
            merge,
            prefill,
            split,
            tiled,
            slots: index.slots as u32,
            n_head: dims.n_head as u32,
            n_ctx: n_ctx as u32,
            _keep: vec![params, scores, stats, partial],
        })
    }

    /// Records attention for `n_tokens` new tokens (positions and slots in the index),
    /// the longest context among them `n_kv` keys; `decode_rows` when the step holds the
    /// single tokens of several sequences (flagged DECODE_ROW), `all_decode` when it holds
    /// nothing else. One token: the fast split (one launch) when it fits, else the exact
    /// split (three); decode rows only, with the rotation fused: the rotating split alone
    /// (the `RopeKv` launch skips the step); several: `prefill`, then the fast split over
    /// the step's decode rows when there are any.
    pub fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        n_kv: u32,
        (decode_rows, all_decode): (bool, bool),
    ) {
        debug_assert!(n_tokens > 1 || n_kv <= self.n_ctx);
        let fast = self.split.as_ref().filter(|_| n_kv <= ATTN_FAST_KEYS);
        match (n_tokens, fast) {
            (1, Some(f)) => f.record(pass, 1, n_kv, true),
            // Decode rows only, with the rotation and store fused: the split alone.
            (_, Some(f)) if all_decode && f.fuses_rope() => f.record(pass, n_tokens, n_kv, true),
            (1, None) => {
                let chunks = n_kv.div_ceil(ATTN_CHUNK);
                for d in [&self.scores, &self.probs_pv] {
                    d.record_grid(pass, [chunks, self.n_head, 1]);
                }
                self.merge.record(pass, 1);
            }
            _ => {
                match &self.tiled {
                    Some(d) => {
                        // Blocks of each sequence's tokens; beside them, `prefill` only for
                        // decode rows too long for the split.
                        let blocks = n_tokens.div_ceil(ATTN_PROMPT_QUERIES)
                            + if decode_rows { self.slots } else { 0 };
                        d.record_grid(pass, [blocks, self.n_head, 1]);
                        if decode_rows && n_kv > ATTN_FAST_KEYS {
                            self.prefill.record(pass, n_tokens);
                        }
                    }
                    None => self.prefill.record(pass, n_tokens),
                }
                if let (true, Some(f)) = (decode_rows, &self.split) {
                    f.record(pass, n_tokens, n_kv.min(ATTN_FAST_KEYS), false);
                }
            }
        }
    }

    /// True when single-token steps rotate and store in the split ([`AttnOpts::rope`]).
    pub fn fuses_rope(&self) -> bool {
        self.split.as_ref().is_some_and(|s| s.fuses_rope())
    }

    /// Dispatches [`Attention::record`] issues (same arguments, bar the pass).
    pub fn dispatches(
        &self,
        n_tokens: u32,
        n_kv: u32,
        (decode_rows, all_decode): (bool, bool),
    ) -> usize {
        let fast = self.split.is_some();
        match n_tokens {
            1 if fast && n_kv <= ATTN_FAST_KEYS => 1,
            1 => 3,
            _ if all_decode && self.fuses_rope() && n_kv <= ATTN_FAST_KEYS => 1,
            _ if fast && decode_rows => 2,
            _ => 1,
        }
    }
}
