//! The launch groups a plan records, and how many dispatches each makes.

use super::Rows;
use crate::ops::{
    narrow_step, wide_step, Attention, CoopFused, Elementwise, Embed, F16Matvec, Glu, NarrowFused,
    NormMatvec, NormQuant, QEmbed, QMatvec, QuantizeAct, RmsNorm, RopeKv, RowOp, Ternary3,
    TernaryGlu, TernaryLinear, WindowAttention,
};

/// One compiled launch group.
pub(super) enum Launch {
    Embed(Embed),
    Norm(RmsNorm),
    Ternary(TernaryLinear),
    /// Gate and up I2_S matvecs and the GLU: fused for one token and for a step of the
    /// narrow tiles' size, three launches (the prefill kernels and `glu.wgsl`) for other
    /// batches.
    TernaryGlu(Box<FusedGlu>),
    /// Three I2_S matvecs sharing their input (q, k, v): one launch for one token and for a
    /// step of the narrow tiles' size, the three prefill kernels for other batches.
    Ternary3(Box<FusedQkv>),
    RopeKv(RopeKv),
    Attention(Attention),
    Glu(Glu),
    /// The F16 matvec over selected rows (the LM head), in its row modes.
    Head(Box<Head>),
    /// Activation quantization (Q8_0 / Q8_K) for the GGUF-format matvecs.
    Quantize(QuantizeAct),
    /// A GGUF-format matvec.
    QLinear(QMatvec),
    /// A GGUF-format embedding gather.
    QEmbed(QEmbed),
    /// LayerNorm, bias, GELU, position embedding, slice.
    Row(RowOp),
    /// Per-head RMSNorm, scale, residual add.
    Elem(Elementwise),
    /// Logit soft-capping over the rows the head computed.
    SoftCap(Elementwise),
    /// Attention of a sliding-window layer.
    WindowAttention(WindowAttention),
    /// A GGUF-format matvec over selected rows: the last-row mode copies the step's last
    /// row out first (`select`), then quantizes it when the format asks; a single token's
    /// row (the first) and all rows are quantized where they are.
    QHead(Box<QHead>),
    /// The fast norm + int8 quantization, written out (steps of several tokens).
    NormQuant(NormQuant),
    /// A launch that single-token steps skip (its consumers recompute it).
    BatchOnly(Box<Launch>),
    /// A single-token launch with its norm in the prologue, and the launch steps of several
    /// tokens run instead.
    Decode(Box<(NormMatvec, Launch)>),
}

/// The parts of [`Launch::TernaryGlu`].
pub(super) struct FusedGlu {
    pub(super) fused: TernaryGlu,
    pub(super) gate: TernaryLinear,
    pub(super) up: TernaryLinear,
    pub(super) glu: Glu,
    /// The narrow tiles of both with the GLU (adapters with tiled kernels).
    pub(super) narrow: Option<NarrowFused>,
    /// The 128-token coop tiles of both with the GLU (adapters whose prompt kernel is the
    /// coop one).
    pub(super) coop: Option<CoopFused>,
}

/// The parts of [`Launch::Ternary3`].
pub(super) struct FusedQkv {
    pub(super) fused: Ternary3,
    pub(super) each: [TernaryLinear; 3],
    /// The narrow tiles of the three (adapters with tiled kernels).
    pub(super) narrow: Option<NarrowFused>,
    /// The 128-token coop tiles of the three (adapters whose prompt kernel is the coop one).
    pub(super) coop: Option<CoopFused>,
}

/// The fused coop launch where a step of `n` tokens takes it.
fn coop_of(coop: &Option<CoopFused>, n: u32) -> Option<&CoopFused> {
    coop.as_ref().filter(|_| wide_step(n))
}

/// The fused narrow launch where a step of `n` tokens takes it.
fn narrow_of(narrow: &Option<NarrowFused>, n: u32) -> Option<&NarrowFused> {
    narrow.as_ref().filter(|_| narrow_step(n))
}

/// The parts of [`Launch::Head`]: one matvec per row mode; picked rows are gathered into
/// a compact buffer first, and where the adapter has cooperative matrices a step of decode
/// rows only multiplies them on the tensor cores (`picked_decode`).
pub(super) struct Head {
    pub(super) decode: F16Matvec,
    pub(super) last: F16Matvec,
    pub(super) all: F16Matvec,
    pub(super) gather: RowOp,
    pub(super) picked: F16Matvec,
    pub(super) picked_decode: Option<F16Matvec>,
}

/// The parts of [`Launch::QHead`].
pub(super) struct QHead {
    pub(super) select: RowOp,
    pub(super) quant_one: Option<QuantizeAct>,
    pub(super) decode: QMatvec,
    pub(super) last: QMatvec,
    pub(super) quant_all: Option<QuantizeAct>,
    pub(super) all: QMatvec,
    pub(super) gather: RowOp,
    pub(super) quant_picked: Option<QuantizeAct>,
    pub(super) picked: QMatvec,
}

impl Launch {
    /// `batch`, with `single` (when there is one) for single-token steps.
    pub(super) fn decode(single: Option<NormMatvec>, batch: Launch) -> Launch {
        match single {
            Some(s) => Launch::Decode(Box::new((s, batch))),
            None => batch,
        }
    }

    pub(super) fn label(&self) -> &'static str {
        match self {
            Launch::NormQuant(_) => "rmsnorm",
            Launch::BatchOnly(l) => l.label(),
            Launch::Decode(b) => match &b.1 {
                Launch::Ternary3(_) => "norm+ternary_qkv",
                Launch::TernaryGlu(_) => "norm+ternary_glu",
                _ => "norm+ternary",
            },
            Launch::Embed(_) => "embed",
            Launch::Norm(_) => "rmsnorm",
            Launch::Ternary(_) => "ternary",
            Launch::TernaryGlu(_) => "ternary_glu",
            Launch::Ternary3(_) => "ternary_qkv",
            Launch::RopeKv(_) => "rope_kv",
            Launch::Attention(_) => "attention",
            Launch::Glu(_) => "glu",
            Launch::Head(_) | Launch::QHead(_) => "lm_head",
            Launch::Quantize(_) => "quantize",
            Launch::QLinear(_) => "qmatvec",
            Launch::QEmbed(_) => "embed",
            Launch::Row(_) => "rowop",
            Launch::Elem(_) => "elementwise",
            Launch::SoftCap(_) => "softcap",
            Launch::WindowAttention(_) => "window_attention",
        }
    }

    pub(super) fn record(&self, pass: &mut wgpu::ComputePass<'_>, n: u32, n_kv: u32, rows: Rows) {
        match self {
            Launch::NormQuant(o) => o.record(pass, n),
            Launch::BatchOnly(l) => {
                if n > 1 {
                    l.record(pass, n, n_kv, rows);
                }
            }
            Launch::Decode(b) => {
                if n == 1 {
                    b.0.record(pass);
                } else {
                    b.1.record(pass, n, n_kv, rows);
                }
            }
            Launch::Embed(e) => e.record(pass, n),
            Launch::Norm(o) => o.record(pass, n),
            Launch::Ternary(o) => o.record(pass, n),
            Launch::Ternary3(b) => {
                if n == 1 {
                    b.fused.record(pass, 1);
                } else if let Some(t) = narrow_of(&b.narrow, n) {
                    t.record(pass, n);
                } else if let Some(c) = coop_of(&b.coop, n) {
                    c.record(pass, n);
                } else {
                    for mv in &b.each {
                        mv.record(pass, n);
                    }
                }
            }
            Launch::TernaryGlu(f) => {
                let FusedGlu {
                    fused,
                    gate,
                    up,
                    glu,
                    narrow,
                    coop,
                } = &**f;
                if n == 1 {
                    fused.record(pass, 1);
                } else if let Some(t) = narrow_of(narrow, n) {
                    t.record(pass, n);
                } else if let Some(c) = coop_of(coop, n) {
                    c.record(pass, n);
                } else {
                    gate.record(pass, n);
                    up.record(pass, n);
                    glu.record(pass, n);
                }
            }
            Launch::RopeKv(o) => o.record_step(pass, n, n_kv, rows.all_decode()),
            Launch::Attention(o) => {
                let picked = matches!(rows, Rows::Picked { .. });
                o.record(pass, n, n_kv, (picked, rows.all_decode()))
            }
            Launch::Glu(o) => o.record(pass, n),
            Launch::Head(h) => match rows {
                Rows::Decode => h.decode.record(pass, n),
                Rows::Last => h.last.record(pass, n),
                Rows::All => h.all.record(pass, n),
                Rows::Picked { rows: m, decode } => {
                    h.gather.record(pass, m);
                    match (&h.picked_decode, decode) {
                        (Some(coop), true) => coop.record(pass, m),
                        _ => h.picked.record(pass, m),
                    }
                }
                Rows::Skip | Rows::Hidden => {}
            },
            Launch::Quantize(o) => o.record(pass, n),
            Launch::QLinear(o) => o.record(pass, n, n > 1),
            Launch::QEmbed(o) => o.record(pass, n),
            Launch::Row(o) => o.record(pass, n),
            Launch::Elem(o) => o.record(pass, n),
            Launch::SoftCap(o) => match rows {
                Rows::Decode | Rows::Last => o.record(pass, 1),
                Rows::All => o.record(pass, n),
                Rows::Picked { rows: m, .. } => o.record(pass, m),
                Rows::Skip | Rows::Hidden => {}
            },
            Launch::WindowAttention(o) => o.record(pass, n),
            Launch::QHead(h) => {
                let QHead {
                    select,
                    quant_one,
                    decode,
                    last,
                    quant_all,
                    all,
                    gather,
                    quant_picked,
                    picked,
                } = &**h;
                if matches!(rows, Rows::Skip | Rows::Hidden) {
                    return;
                }
                if let Rows::Picked { rows: m, .. } = rows {
                    gather.record(pass, m);
                    if let Some(q) = quant_picked {
                        q.record(pass, m);
                    }
                    picked.record(pass, m, m > 1);
                } else if rows == Rows::Last {
                    select.record(pass, n);
                    if let Some(q) = quant_one {
                        q.record(pass, 1);
                    }
                    last.record(pass, 1, false);
                } else {
                    // All rows, or a single token's (its row is the first).
                    if let Some(q) = quant_all {
                        q.record(pass, n);
                    }
                    let mv = if rows == Rows::Decode { decode } else { all };
                    mv.record(pass, n, n > 1);
                }
            }
        }
    }

    pub(super) fn dispatches(&self, n: u32) -> usize {
        match self {
            Launch::BatchOnly(l) if n > 1 => l.dispatches(n),
            Launch::BatchOnly(_) => 0,
            Launch::Decode(_) if n == 1 => 1,
            Launch::Decode(b) => b.1.dispatches(n),
            Launch::Embed(e) => e.dispatch_count(),
            Launch::Attention(a) => a.dispatches(n, 1, (false, false)),
            Launch::RopeKv(r) if r.skips(n, 1, false) => 0,
            Launch::TernaryGlu(f) if n > 1 && narrow_of(&f.narrow, n).is_none() => 3,
            Launch::Ternary3(b)
                if n > 1 && narrow_of(&b.narrow, n).is_none() && coop_of(&b.coop, n).is_none() =>
            {
                3
            }
            Launch::Head(h) => h.decode.dispatch_count(),
            Launch::QLinear(o) => o.dispatch_count(),
            Launch::QHead(h) => usize::from(h.quant_all.is_some()) + h.decode.dispatch_count(),
            _ => 1,
        }
    }
}
