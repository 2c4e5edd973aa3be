//! Tiled I2_S × int8 matrix products for prompt batches (`ternary_mm.wgsl`, and
//! `ternary_coop.wgsl` on adapters with cooperative matrices): bit-identical to the
//! 4-token batch kernel of [`super::TernaryMatvec`], with the weights read once per 64
//! tokens instead of once per 4.

use super::narrow::tile_bindings;
use super::{uniform, Dispatch, QuantAct, SplitK, StepUniform, TernaryMatvec, TernaryWeights};
use crate::buffers::GpuBuffer;
use crate::context::{GpuContext, PrefillKernel};
use crate::pipelines::{Epilogue, Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Tokens per workgroup tile (both kernels; the coop kernel's wide entry point takes twice
/// as many).
pub const MM_TILE_TOKENS: u32 = 64;

/// Tokens per workgroup tile of `ternary_sgmat.wgsl` (its `TN`).
pub(crate) const SGMAT_TILE_TOKENS: u32 = 128;

/// The widest rows (K) the coop tiles take: their f32 sums stay exact integers (times
/// 2^-24) while 2·127·K < 2^24 (`ternary_coop.wgsl`'s header); wider rows take the portable
/// tiles, which sum in i32.
pub(crate) const COOP_MAX_K: usize = 65_536;
const _: () = assert!(2 * 127 * COOP_MAX_K < 1 << 24);

/// The tiled kernel of prompt steps over rows of `k` on an adapter whose prompt kernel is
/// `prefill` (None: the 4-token batch kernel).
pub(crate) fn prompt_kind(prefill: PrefillKernel, k: usize) -> Option<MatmulKind> {
    match prefill {
        PrefillKernel::Batch4 => None,
        PrefillKernel::Coop if k <= COOP_MAX_K => Some(MatmulKind::Coop),
        PrefillKernel::Tiled | PrefillKernel::Coop => Some(MatmulKind::Portable),
        PrefillKernel::SubgroupMatrix => Some(MatmulKind::SubgroupMatrix),
    }
}

/// Fewest rows for which the coop kernel uses its 128-token tiles: below, 128-token tiles
/// leave too few workgroups (on the H200, the 640-row k and v projections of a 512-token
/// step ran slower with them, the 2,560-row ones faster).
const WIDE_MIN_ROWS: usize = 1024;

/// Which tiled kernel a [`TernaryMatmul`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulKind {
    /// `ternary_mm.wgsl` `matmul_tiled`: `dot4I8Packed` on staged tiles (any adapter).
    Portable,
    /// `ternary_coop.wgsl`: 16×16×16 f16 cooperative matrices, f32 accumulators (needs
    /// EXPERIMENTAL_COOPERATIVE_MATRIX and SHADER_F16).
    Coop,
    /// `ternary_mm.wgsl` `matmul_narrow`: 32 × 32 tiles for steps of a few tokens
    /// (sequences decoded together; any adapter).
    Narrow,
    /// `ternary_sgmat.wgsl`: 16×16×32 int8 subgroup matrices, i32 sums (a browser with
    /// `chromium-experimental-subgroup-matrix`).
    SubgroupMatrix,
}

impl MatmulKind {
    /// Weight rows per workgroup tile.
    pub fn tile_rows(self) -> u32 {
        match self {
            MatmulKind::Narrow => 32,
            MatmulKind::Portable => 64,
            MatmulKind::Coop | MatmulKind::SubgroupMatrix => 128,
        }
    }

    /// Tokens per workgroup tile (the coop kernel's wide entry point takes twice as many).
    pub fn tile_tokens(self) -> u32 {
        match self {
            MatmulKind::Narrow => 32,
            MatmulKind::Portable | MatmulKind::Coop => MM_TILE_TOKENS,
            MatmulKind::SubgroupMatrix => SGMAT_TILE_TOKENS,
        }
    }
}

/// `out (= or +=) W · dequant(act)` for every token of a step, `n_tokens` read from the
/// step uniform; one workgroup per [`MatmulKind::tile_rows`] rows ×
/// [`MatmulKind::tile_tokens`] tokens (the coop kernel: × 128 tokens when the step has more
/// than 64 and `W` at least 1,024 rows).
pub struct TernaryMatmul {
    dispatch: Dispatch,
    kind: MatmulKind,
    /// `ternary_coop.wgsl` `matmul_wide`, for steps of more than 64 tokens.
    wide: Option<Dispatch>,
    /// The wide tiles with K in parts, for the steps [`SplitK::takes`].
    split: Option<Box<SplitK>>,
    _params: GpuBuffer,
}

/// Whether a step of `n_tokens` tokens takes the coop kernel's 128-token tiles
/// (`matmul_wide`, and the fused q/k/v's `matmul_wide3`).
pub fn wide_step(n_tokens: u32) -> bool {
    n_tokens > MM_TILE_TOKENS
}

impl TernaryMatmul {
    /// Binds `w`, `act`, `out` (f32, `w.rows` per token) and the step uniform.
    pub fn new(
        ctx: &GpuContext,
        kind: MatmulKind,
        w: &TernaryWeights,
        act: &QuantAct,
        out: &GpuBuffer,
        epilogue: Epilogue,
        step: &StepUniform,
    ) -> Result<TernaryMatmul> {
        let own = OwnTiles {
            narrow: true,
            wide: true,
            split: None,
        };
        Self::build(ctx, kind, (w, act, out), epilogue, step, own)
    }

    /// [`TernaryMatmul::new`], building the 128-token entry only when `own.wide` (false
    /// where a fused launch runs those steps and this one would never be recorded), and
    /// its split where `own.split` gives a scratch.
    fn build(
        ctx: &GpuContext,
        kind: MatmulKind,
        (w, act, out): (&TernaryWeights, &QuantAct, &GpuBuffer),
        epilogue: Epilogue,
        step: &StepUniform,
        own: OwnTiles<'_>,
    ) -> Result<TernaryMatmul> {
        if act.k != w.k {
            return Err(Error::KernelArgs(format!(
                "ternary matmul: activations of width {} for weights of width {}",
                act.k, w.k
            )));
        }
        let params = uniform(
            ctx,
            "ternary_mm.params",
            &[w.rows as u32, (w.k / 16) as u32, w.scale.to_bits(), 0],
        )?;
        let key = |wide| PipelineKey {
            kernel: Kernel::TernaryMatmul {
                kind,
                epilogue,
                wide,
            },
            variant: Variant {
                f16: kind == MatmulKind::Coop,
                subgroups: matches!(kind, MatmulKind::Coop | MatmulKind::SubgroupMatrix),
                kv_f32: false,
            },
        };
        let mut bindings = tile_bindings(&params, w, act, out, step);
        if kind == MatmulKind::Narrow {
            // The narrow walk's code loader names the fused entries' 2nd and 3rd matrices
            // too (ternary_mm.wgsl `wq`); this entry reads only w.
            bindings.extend([(6, w.codes.binding()), (7, w.codes.binding())]);
        }
        let groups = (w.rows as u32).div_ceil(kind.tile_rows());
        let dispatch = Dispatch::new(ctx, key(false), "ternary_mm", &bindings, groups)?;
        let wide_tiles = kind == MatmulKind::Coop && own.wide && w.rows >= WIDE_MIN_ROWS;
        let split = match own.split {
            Some(scratch) if wide_tiles => Some(Box::new(SplitK::new(
                ctx,
                (w, act, out),
                (scratch, &params),
                (epilogue, ctx.caps().sms),
                step,
            )?)),
            _ => None,
        };
        let wide = wide_tiles
            .then(|| Dispatch::new(ctx, key(true), "ternary_mm_wide", &bindings, groups))
            .transpose()?;
        Ok(TernaryMatmul {
            dispatch,
            kind,
            wide,
            split,
            _params: params,
        })
    }

    /// Records the product for `n_tokens` tokens (the value in the step uniform).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        if let Some(s) = self
            .split
            .as_ref()
            .filter(|s| wide_step(n_tokens) && s.takes(n_tokens))
        {
            return s.record(pass, n_tokens);
        }
        match &self.wide {
            Some(w) if wide_step(n_tokens) => w.record(pass, n_tokens.div_ceil(2 * MM_TILE_TOKENS)),
            _ => self
                .dispatch
                .record(pass, n_tokens.div_ceil(self.kind.tile_tokens())),
        }
    }
}

/// Largest step that runs the 4-token batch matvec rather than the narrow tiles: on an
/// H200 (BENCHMARKS.md, session 12, after the narrow tiles were coalesced and q/k/v and
/// gate/up fused), 12 sequences decoded together ran 2,008 / 2,062 tok/s on the narrow
/// tiles against 1,672 / 1,695 with it; 8 sequences and 5 tied (1,297–1,359 either way,
/// 810–860).
pub const BATCH4_MAX_TOKENS: u32 = 8;

/// Largest step that runs the narrow 32 × 32 tiles rather than the prompt tiles: 64-token
/// tiles over 32 tokens are half empty (on an H100, 32 sequences ran 1,559 tok/s on the
/// 128 × 64 cooperative-matrix tiles, 20 workgroups for a 2,560-row matrix, and 1,238 on
/// the 64 × 64 portable ones).
pub const NARROW_MAX_TOKENS: u32 = 32;

/// Whether a step of `n_tokens` tokens runs the narrow tiles (where the adapter has them).
pub fn narrow_step(n_tokens: u32) -> bool {
    n_tokens > BATCH4_MAX_TOKENS && n_tokens <= NARROW_MAX_TOKENS
}

/// Fewest rows for which a linear takes the narrow tiles: below, too few workgroups (the
/// 640-row k and v projections of 2B-4T ran slower on 20 than in the 4-token kernel).
const NARROW_MIN_ROWS: usize = 1024;

/// Which of a linear's tiled launches it builds and records itself: false where a fused
/// launch of several matrices runs those steps ([`super::NarrowFused`] for the narrow
/// tiles, [`super::CoopFused`] for the 128-token coop tiles).
#[derive(Clone, Copy, Debug)]
pub struct OwnTiles<'a> {
    /// The narrow tiles (steps of 9–32 tokens).
    pub narrow: bool,
    /// The coop kernel's 128-token tiles (steps of more than 64 tokens).
    pub wide: bool,
    /// A scratch for the 128-token tiles with K in parts ([`SplitK`]; sized by
    /// [`SplitK::scratch_bytes`]), where the linear may run them.
    pub split: Option<&'a GpuBuffer>,
}

/// An I2_S linear for steps of any size: the matvec for one token, the 4-token batch
/// kernel up to [`BATCH4_MAX_TOKENS`], the narrow tiles up to [`NARROW_MAX_TOKENS`] (for
/// matrices of [`NARROW_MIN_ROWS`] rows or more), and beyond that the kernel
/// [`Caps::prefill`](crate::Caps::prefill) names (the tiles only where it names a tiled
/// kernel; the subgroup-matrix tiles only for steps of more than 64 tokens, the portable
/// ones below; all of them compute the same integers and scale them alike).
pub struct TernaryLinear {
    single: TernaryMatvec,
    narrow: Option<TernaryMatmul>,
    tiled: Option<TernaryMatmul>,
    /// The portable tiles for steps of up to 64 tokens where `tiled` is the subgroup-matrix
    /// kernel, whose 128-token tiles would run half empty there (on an H200 under Dawn, a
    /// 64-token prompt of 2B-4T: 3,139 tok/s on them, 4,422 on the portable tiles).
    short: Option<Box<TernaryMatmul>>,
}

impl TernaryLinear {
    /// Binds `w`, `act`, `out` (f32, `w.rows` per token) for decode (`tpr` lanes per row,
    /// `variant`) and for batches of up to the activations' tokens (`step`); `own` says
    /// which tiled launches it builds (see [`OwnTiles`]).
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &TernaryWeights,
        act: &QuantAct,
        out: &GpuBuffer,
        (epilogue, own): (Epilogue, OwnTiles<'_>),
        step: &StepUniform,
    ) -> Result<TernaryLinear> {
        let kind = prompt_kind(ctx.caps().prefill, w.k);
        let single = TernaryMatvec::new(ctx, variant, tpr, w, act, out, epilogue, Some(step))?;
        let tiled_of = |k| TernaryMatmul::build(ctx, k, (w, act, out), epilogue, step, own);
        let narrow = kind
            .filter(|_| own.narrow && w.rows >= NARROW_MIN_ROWS)
            .map(|_| tiled_of(MatmulKind::Narrow))
            .transpose()?;
        let tiled = kind.map(tiled_of).transpose()?;
        let short = kind
            .filter(|&k| k == MatmulKind::SubgroupMatrix)
            .map(|_| tiled_of(MatmulKind::Portable).map(Box::new))
            .transpose()?;
        Ok(TernaryLinear {
            single,
            narrow,
            tiled,
            short,
        })
    }

    /// Records the product for `n_tokens` tokens (the step uniform holds `n_tokens`).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let tiles = if n_tokens <= BATCH4_MAX_TOKENS {
            None
        } else if narrow_step(n_tokens) {
            self.narrow.as_ref()
        } else if !wide_step(n_tokens) && self.short.is_some() {
            self.short.as_deref()
        } else {
            self.tiled.as_ref()
        };
        match tiles {
            Some(t) => t.record(pass, n_tokens),
            None => self.single.record(pass, n_tokens, n_tokens > 1),
        }
    }
}
