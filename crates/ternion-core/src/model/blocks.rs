//! Pieces of the forward pass several architecture files share.

use super::config::Config;
use super::graph::{ActId, AttnGeometry, Builder, GluAct, Op, RopeMode, WeightId};

/// The attention geometry of `cfg` with the given RoPE pairing and frequency factors.
pub(crate) fn geometry(
    cfg: &Config,
    rope_mode: RopeMode,
    rope_freqs: Option<WeightId>,
) -> AttnGeometry {
    AttnGeometry {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        n_rot: cfg.n_rot,
        rope_base: cfg.rope_base,
        rope_mode,
        rope_freqs,
        sliding: None,
        causal: cfg.causal,
    }
}

/// Scratch rows for the per-projection input norms of BitNet-embedding models, one per
/// input width: the model width, the attention output and the FFN's inner width.
#[derive(Clone, Copy)]
pub(crate) struct ProjNorms {
    d: ActId,
    attn: ActId,
    ff: ActId,
}

impl ProjNorms {
    /// Scratch rows for `cfg` when its file has per-projection input norms.
    pub(crate) fn new(b: &mut Builder, cfg: &Config) -> Option<ProjNorms> {
        cfg.proj_norms.then(|| ProjNorms {
            d: b.act("proj_in", cfg.n_embd),
            attn: b.act("proj_in_attn", cfg.n_head * cfg.head_dim),
            ff: b.act("proj_in_ffn", cfg.n_ff),
        })
    }
}

/// `out (+)= W · x` for projection `name` of block `l` (`attn_q`, …, `ffn_down`), whose
/// input is first RMS-normalised with `blk.l.{name}_norm_in.weight` when the model has
/// per-projection input norms (BitNet-embedding: RMSNorm, then the ternary matmul, as one
/// [`Op::NormLinear`]).
pub(crate) fn projection(
    b: &mut Builder,
    norms: Option<ProjNorms>,
    (l, name): (usize, &str),
    w: WeightId,
    x: ActId,
    out: ActId,
    add: bool,
) {
    match norms {
        Some(n) => {
            let (tmp, width) = match name {
                "attn_output" => (n.attn, b.width(n.attn)),
                "ffn_down" => (n.ff, b.width(n.ff)),
                _ => (n.d, b.width(n.d)),
            };
            let nw = b.vector(format!("blk.{l}.{name}_norm_in.weight"), width);
            b.norm_linear((x, nw, tmp), w, out, add);
        }
        None => b.linear(w, x, out, add),
    }
}

/// `q, k, v = Wq·h, Wk·h, Wv·h` of block `l` with `h = rmsnorm(x) · attn_norm` (in
/// `h`): one [`Op::NormQkv`], or the norm and then a [`projection`] each when the model
/// has per-projection input norms.
pub(crate) fn qkv(
    b: &mut Builder,
    norms: Option<ProjNorms>,
    l: usize,
    (x, attn_norm, h): (ActId, WeightId, ActId),
    (wq, wk, wv): (WeightId, WeightId, WeightId),
    (q, k, v): (ActId, ActId, ActId),
) {
    if norms.is_none() {
        b.norm_qkv((x, attn_norm, h), [wq, wk, wv], [q, k, v]);
        return;
    }
    b.rms_norm(x, attn_norm, h);
    projection(b, norms, (l, "attn_q"), wq, h, q, false);
    projection(b, norms, (l, "attn_k"), wk, h, k, false);
    projection(b, norms, (l, "attn_v"), wv, h, v, false);
}

/// The gated FFN of block `l` over `h = rmsnorm(x) · ffn_norm` (in `h`): `gate =
/// act(W_gate·h) · (W_up·h)` (one [`Op::NormGlu`], or the norm, a [`projection`] each and
/// the GLU when the model has per-projection input norms), then `out = W_down · gate`
/// (`out +=` when `add`).
pub(crate) fn gated_ffn(
    b: &mut Builder,
    norms: Option<ProjNorms>,
    (l, act): (usize, GluAct),
    (w_gate, w_up, w_down): (WeightId, WeightId, WeightId),
    (x, ffn_norm, h): (ActId, WeightId, ActId),
    (gate, up, out): (ActId, ActId, ActId),
    add: bool,
) {
    if norms.is_none() {
        b.norm_glu((x, ffn_norm, h), act, [w_gate, w_up], (gate, up));
    } else {
        b.rms_norm(x, ffn_norm, h);
        projection(b, norms, (l, "ffn_gate"), w_gate, h, gate, false);
        projection(b, norms, (l, "ffn_up"), w_up, h, up, false);
        b.op(Op::Glu { act, gate, up });
    }
    projection(b, norms, (l, "ffn_down"), w_down, gate, out, add);
}

/// The LM head matrix: `output.weight` when the file has one, else the token table (tied).
pub(crate) fn lm_head_weight(b: &mut Builder, cfg: &Config, embd: WeightId) -> WeightId {
    if cfg.has_output {
        b.matrix("output.weight", cfg.n_embd, cfg.n_vocab)
    } else {
        embd
    }
}

/// The final RMSNorm and LM head `head` over the selected rows of `x`; returns the logits.
pub(crate) fn rms_head(b: &mut Builder, cfg: &Config, x: ActId, head: WeightId) -> ActId {
    let d = cfg.n_embd;
    let last = b.act("last", d);
    let last_norm = b.act("last_norm", d);
    let logits = b.act("logits", cfg.n_vocab);
    let output_norm = b.vector("output_norm.weight", d);
    b.op(Op::SelectRows { x, out: last });
    b.rms_norm(last, output_norm, last_norm);
    b.linear(head, last_norm, logits, false);
    logits
}
