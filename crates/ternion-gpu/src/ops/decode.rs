//! The "fast" numerics of the ternary path (`ternary_decode.wgsl`): RMSNorm + int8
//! quantization in one pass, as the prologue of the single-token I2_S matvecs that consume
//! it ([`NormMatvec`]) or written out for steps of several tokens ([`NormQuant`]).

use super::{uniform, Dispatch, QuantAct, Ternary3, TernaryWeights, WG};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{DecodeEntry, Epilogue, GluAct, Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Widest row the prologue holds in workgroup memory (`ternary_decode.wgsl` MAX_WORDS × 4).
pub const FAST_NORM_MAX_K: usize = 8192;
/// Lanes per weight row of the prologue matvecs: 8, and 4 for gate/up, whose two matrices
/// per row want twice the workgroups (H100, BENCHMARKS.md 2026-11-25).
fn tpr(entry: DecodeEntry) -> u32 {
    match entry {
        DecodeEntry::Glu => 4,
        _ => 8,
    }
}

/// The norm a fast ternary launch computes first: the f32 rows it reads, the norm weight,
/// the row width and epsilon.
#[derive(Clone, Debug)]
pub struct NormIn {
    /// Rows to normalise (f32, `k` per token).
    pub x: GpuBuffer,
    /// Norm weight (`k` f32).
    pub w: GpuBuffer,
    /// Row width.
    pub k: usize,
    /// Epsilon.
    pub eps: f32,
}

impl NormIn {
    /// Whether the fast kernels take rows of width `k`: a multiple of 64, at most
    /// [`FAST_NORM_MAX_K`].
    pub fn fits(k: usize) -> bool {
        k > 0 && k.is_multiple_of(64) && k <= FAST_NORM_MAX_K
    }

    fn uniform(&self, ctx: &GpuContext) -> Result<GpuBuffer> {
        if !Self::fits(self.k) {
            return Err(Error::KernelArgs(format!(
                "fast norm: row width {} (needs a multiple of 64, at most {FAST_NORM_MAX_K})",
                self.k
            )));
        }
        uniform(
            ctx,
            "norm.params",
            &[self.k as u32, self.eps.to_bits(), 0, 0],
        )
    }
}

/// [`tpr`], or `TERNION_EXP_TPR` for experiments.
fn exp_tpr(entry: DecodeEntry) -> u32 {
    std::env::var("TERNION_EXP_TPR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(tpr(entry))
}

/// The pipeline of `entry`. The norm-quant and the matvec entries take the same variant,
/// so a token's activations are the same bits whichever of them quantized it.
fn key(
    ctx: &GpuContext,
    entry: DecodeEntry,
    (epilogue, act): (Epilogue, GluAct),
    k: usize,
) -> PipelineKey {
    let tpr = exp_tpr(entry);
    PipelineKey {
        kernel: Kernel::TernaryDecode {
            entry,
            tpr,
            epilogue,
            act,
            k: k as u32,
        },
        variant: Variant {
            f16: false,
            subgroups: ctx.variant(tpr).subgroups,
            kv_f32: false,
        },
    }
}

/// RMSNorm + int8 quantization of each token row into a [`QuantAct`], one workgroup per
/// token, with the arithmetic of [`NormMatvec`]'s prologue.
pub struct NormQuant {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl NormQuant {
    /// Normalises the rows of `norm` into `out` (same width).
    pub fn new(ctx: &GpuContext, norm: &NormIn, out: &QuantAct) -> Result<NormQuant> {
        if out.k != norm.k {
            return Err(Error::KernelArgs(format!(
                "fast norm: activations of width {} for rows of {}",
                out.k, norm.k
            )));
        }
        let params = norm.uniform(ctx)?;
        let k = key(
            ctx,
            DecodeEntry::NormQuant,
            (Epilogue::Store, GluAct::ReluSqr),
            norm.k,
        );
        let dispatch = Dispatch::new(
            ctx,
            k,
            "norm_quant",
            &[
                (2, norm.x.binding()),
                (3, norm.w.binding()),
                (5, params.binding()),
                (11, out.q.binding()),
                (12, out.meta.binding()),
            ],
            0,
        )?;
        Ok(NormQuant {
            dispatch,
            _params: params,
        })
    }

    /// Records the norm of the first `n_tokens` rows.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record_grid(pass, [n_tokens, 1, 1]);
    }
}

/// What a [`NormMatvec`] multiplies after its norm prologue.
pub enum NormMatvecKind<'a> {
    /// One matrix: `out (= or +=) W·a`.
    One {
        /// Weights.
        w: &'a TernaryWeights,
        /// Destination (f32, `w.rows`).
        out: &'a GpuBuffer,
        /// Store or add.
        epilogue: Epilogue,
    },
    /// Gated FFN: `out = act(W_gate·a) · (W_up·a)`.
    Glu {
        /// Gate weights.
        gate: &'a TernaryWeights,
        /// Up weights (same shape).
        up: &'a TernaryWeights,
        /// Destination (f32, `gate.rows`).
        out: &'a GpuBuffer,
        /// The gate activation.
        act: GluAct,
    },
    /// Three matrices (q, k, v), each result stored.
    Three {
        /// Weights.
        w: [&'a TernaryWeights; 3],
        /// Destinations.
        out: [&'a GpuBuffer; 3],
    },
}

/// One single-token launch: the norm of the step's row in the prologue, then I2_S matvecs.
pub struct NormMatvec {
    dispatch: Dispatch,
    _params: Vec<GpuBuffer>,
}

impl NormMatvec {
    /// Builds the launch of `kind` over the norm of `norm`'s first row.
    pub fn new(ctx: &GpuContext, norm: &NormIn, kind: NormMatvecKind<'_>) -> Result<NormMatvec> {
        let nparams = norm.uniform(ctx)?;
        let width_err = |k: usize| {
            Error::KernelArgs(format!(
                "fast ternary matvec: weights of width {k} for rows of {}",
                norm.k
            ))
        };
        let words = (norm.k / 16) as u32;
        let mut keep = Vec::new();
        let mut bindings: Vec<(u32, wgpu::BufferBinding<'_>)> =
            vec![(2, norm.x.binding()), (3, norm.w.binding())];
        let (entry, epilogue, act, rows, params) = match kind {
            NormMatvecKind::One { w, out, epilogue } => {
                if w.k != norm.k {
                    return Err(width_err(w.k));
                }
                // wload names w2 and w3 in every entry point: w stands in (never read).
                bindings.extend([
                    (1, w.codes.binding()),
                    (4, out.binding()),
                    (6, w.codes.binding()),
                    (7, w.codes.binding()),
                ]);
                let p = uniform(
                    ctx,
                    "ternary.params",
                    &[w.rows as u32, words, w.scale.to_bits(), 0],
                )?;
                (DecodeEntry::Matvec, epilogue, GluAct::ReluSqr, w.rows, p)
            }
            NormMatvecKind::Glu { gate, up, out, act } => {
                if gate.k != norm.k || (up.k, up.rows) != (gate.k, gate.rows) {
                    return Err(width_err(gate.k.max(up.k)));
                }
                bindings.extend([
                    (1, gate.codes.binding()),
                    (4, out.binding()),
                    (6, up.codes.binding()),
                    (7, gate.codes.binding()),
                ]);
                let p = uniform(
                    ctx,
                    "ternary_glu.params",
                    &[
                        gate.rows as u32,
                        words,
                        gate.scale.to_bits(),
                        up.scale.to_bits(),
                    ],
                )?;
                (DecodeEntry::Glu, Epilogue::Store, act, gate.rows, p)
            }
            NormMatvecKind::Three { w, out } => {
                if let Some(m) = w.iter().find(|m| m.k != norm.k) {
                    return Err(width_err(m.k));
                }
                let (rows, p, parts) = Ternary3::uniforms(ctx, w)?;
                bindings.extend([
                    (1, w[0].codes.binding()),
                    (4, out[0].binding()),
                    (6, w[1].codes.binding()),
                    (7, w[2].codes.binding()),
                    (8, out[1].binding()),
                    (9, out[2].binding()),
                ]);
                keep.push(parts);
                (
                    DecodeEntry::Matvec3,
                    Epilogue::Store,
                    GluAct::ReluSqr,
                    rows,
                    p,
                )
            }
        };
        bindings.push((0, params.binding()));
        bindings.push((5, nparams.binding()));
        if let Some(parts) = keep.first() {
            bindings.push((10, parts.binding()));
        }
        let dispatch = Dispatch::new(
            ctx,
            key(ctx, entry, (epilogue, act), norm.k),
            "ternary_decode",
            &bindings,
            (rows as u32).div_ceil(WG / exp_tpr(entry)),
        )?;
        keep.extend([params, nparams]);
        Ok(NormMatvec {
            dispatch,
            _params: keep,
        })
    }

    /// Records the launch (one token).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.dispatch.record(pass, 1);
    }
}
