//! Pieces of the forward pass several architecture files share.

use super::config::Config;
use super::graph::{ActId, AttnGeometry, Builder, Op, RopeMode, WeightId};

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
