//! Phi-3 (`phi3`).
//!
//! As llama.cpp's `llm_build_phi3` computes it:
//! ```text
//! h = rmsnorm(x)·attn_norm
//! [q | k | v] = Wqkv h (rows Q | K | V); q, k = rope_neox(q, k)   (pairs (i, i + n_rot/2))
//! x = x + Wo · softmax(q·kᵀ/√d + mask)·v
//! h = rmsnorm(x)·ffn_norm
//! [g | u] = Wup h (rows gate | up); x = x + Wdown · (silu(g) ⊙ u)
//! ```
//! and `logits = output · (rmsnorm(x)·output_norm)`. The fused projections stay one
//! [`Op::NormLinear`] each; [`Op::Slice`] splits their outputs. Files with separate
//! `attn_q/k/v` are accepted too. The sliding window (`attention.sliding_window`) is not
//! applied: it only matters past that many positions.

use super::blocks::{geometry, lm_head_weight, rms_head};
use super::config::Config;
use super::graph::{Builder, GluAct, Graph, Op, RopeMode};
use crate::gguf::GgufFile;

/// The Phi-3 forward pass for `cfg`; `file` tells whether Q/K/V are fused.
pub fn graph(cfg: &Config, file: &GgufFile) -> Graph {
    let (d, kv, ff, hq) = (
        cfg.n_embd,
        cfg.kv_dim(),
        cfg.n_ff,
        cfg.n_head * cfg.head_dim,
    );
    let fused_qkv = file.tensor("blk.0.attn_qkv.weight").is_some();
    let mut b = Builder::default();
    let embd = b.matrix("token_embd.weight", d, cfg.n_vocab);
    let x = b.act("x", d);
    let h = b.act("h", d);
    let qkv = b.act("qkv", hq + 2 * kv);
    let q = b.act("q", hq);
    let k = b.act("k", kv);
    let v = b.act("v", kv);
    let att = b.act("attn", hq);
    let gate_up = b.act("gate_up", 2 * ff);
    let gate = b.act("gate", ff);
    let up = b.act("up", ff);
    b.op(Op::Embed {
        table: embd,
        out: x,
    });
    for l in 0..cfg.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let attn_norm = b.vector(n("attn_norm"), d);
        if fused_qkv {
            let wqkv = b.matrix(n("attn_qkv"), d, hq + 2 * kv);
            b.norm_linear((x, attn_norm, h), wqkv, qkv, false);
            b.op(Op::Slice {
                x: qkv,
                start: 0,
                out: q,
            });
            b.op(Op::Slice {
                x: qkv,
                start: hq,
                out: k,
            });
            b.op(Op::Slice {
                x: qkv,
                start: hq + kv,
                out: v,
            });
        } else {
            let wq = b.matrix(n("attn_q"), d, hq);
            let wk = b.matrix(n("attn_k"), d, kv);
            let wv = b.matrix(n("attn_v"), d, kv);
            b.norm_qkv((x, attn_norm, h), [wq, wk, wv], [q, k, v]);
        }
        let wo = b.matrix(n("attn_output"), hq, d);
        let ffn_norm = b.vector(n("ffn_norm"), d);
        let w_up = b.matrix(n("ffn_up"), d, 2 * ff);
        let w_down = b.matrix(n("ffn_down"), ff, d);

        b.attention((l, true), [q, k, v], att);
        b.linear(wo, att, x, true);

        b.norm_linear((x, ffn_norm, h), w_up, gate_up, false);
        b.op(Op::Slice {
            x: gate_up,
            start: 0,
            out: gate,
        });
        b.op(Op::Slice {
            x: gate_up,
            start: ff,
            out: up,
        });
        b.op(Op::Glu {
            act: GluAct::Silu,
            gate,
            up,
        });
        b.linear(w_down, gate, x, true);
    }
    let head = lm_head_weight(&mut b, cfg, embd);
    let logits = rms_head(&mut b, cfg, x, head);
    b.finish(
        geometry(cfg, RopeMode::Neox, None),
        cfg.rms_eps,
        cfg.n_layer,
        logits,
    )
}
