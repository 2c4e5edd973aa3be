//! LLaMA family (`llama`, incl. Llama-3 style GQA and `rope_freqs`).
//!
//! One block, as llama.cpp's `llm_build_llama` computes it:
//! ```text
//! h = rmsnorm(x)·attn_norm
//! q, k, v = Wq h, Wk h, Wv h; q, k = rope_norm(q, k)        (pairs (2i, 2i+1))
//! x = x + Wo · softmax(q·kᵀ/√d + mask)·v                     (GQA: q head h uses kv head h/group)
//! h = rmsnorm(x)·ffn_norm
//! x = x + Wdown · (silu(Wgate h) ⊙ Wup h)
//! ```
//! and `logits = output · (rmsnorm(x)·output_norm)`, with `output` = `token_embd` when the
//! file has no `output.weight` (tied embeddings). BitNet-embedding files (qwen3) add an
//! RMSNorm of every projection's input, `W · (rmsnorm(in)·{proj}_norm_in)`, with the
//! weights `blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}_norm_in`
//! (microsoft/BitNet `docs/bitnet-embeddings-i2s-guide.md`).

use super::blocks::{gated_ffn, geometry, lm_head_weight, projection, qkv, rms_head, ProjNorms};
use super::config::Config;
use super::graph::{Builder, GluAct, Graph, Op, RopeMode};

/// What a LLaMA-style family changes in the block.
pub(crate) struct Variant {
    /// RoPE pairing.
    pub rope_mode: RopeMode,
    /// `attn_q/k/v.bias` added after the projections (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k (`attn_q_norm`/`attn_k_norm`) before RoPE (Qwen3).
    pub qk_norm: bool,
}

/// The LLaMA forward pass for `cfg`.
pub fn graph(cfg: &Config) -> Graph {
    graph_variant(
        cfg,
        &Variant {
            rope_mode: RopeMode::Norm,
            qkv_bias: false,
            qk_norm: false,
        },
    )
}

/// The LLaMA-style forward pass for `cfg` with the changes of `var`.
pub(crate) fn graph_variant(cfg: &Config, var: &Variant) -> Graph {
    let (d, kv, ff, hq) = (
        cfg.n_embd,
        cfg.kv_dim(),
        cfg.n_ff,
        cfg.n_head * cfg.head_dim,
    );
    let mut b = Builder::default();
    let embd = b.matrix("token_embd.weight", d, cfg.n_vocab);
    let rope_freqs = cfg
        .has_rope_freqs
        .then(|| b.vector("rope_freqs.weight", cfg.n_rot / 2));
    let x = b.act("x", d);
    let h = b.act("h", d);
    let q = b.act("q", hq);
    let k = b.act("k", kv);
    let v = b.act("v", kv);
    let att = b.act("attn", hq);
    let (qn, kn) = if var.qk_norm {
        (b.act("q_norm", hq), b.act("k_norm", kv))
    } else {
        (q, k)
    };
    let gate = b.act("gate", ff);
    let up = b.act("up", ff);
    let pn = ProjNorms::new(&mut b, cfg);
    b.op(Op::Embed {
        table: embd,
        out: x,
    });
    for l in 0..cfg.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let attn_norm = b.vector(n("attn_norm"), d);
        let wq = b.matrix(n("attn_q"), d, hq);
        let wk = b.matrix(n("attn_k"), d, kv);
        let wv = b.matrix(n("attn_v"), d, kv);
        let wo = b.matrix(n("attn_output"), hq, d);
        let ffn_norm = b.vector(n("ffn_norm"), d);
        let w_gate = b.matrix(n("ffn_gate"), d, ff);
        let w_up = b.matrix(n("ffn_up"), d, ff);
        let w_down = b.matrix(n("ffn_down"), ff, d);

        qkv(&mut b, pn, l, (x, attn_norm, h), (wq, wk, wv), (q, k, v));
        if var.qkv_bias {
            for (a, s, n) in [(q, "attn_q", hq), (k, "attn_k", kv), (v, "attn_v", kv)] {
                let bias = b.vector(format!("blk.{l}.{s}.bias"), n);
                b.op(Op::AddBias { x: a, b: bias });
            }
        }
        if var.qk_norm {
            let q_norm = b.vector(n("attn_q_norm"), cfg.head_dim);
            let k_norm = b.vector(n("attn_k_norm"), cfg.head_dim);
            b.head_rms_norm(q, q_norm, qn);
            b.head_rms_norm(k, k_norm, kn);
        }
        b.attention((l, true), [qn, kn, v], att);
        projection(&mut b, pn, (l, "attn_output"), wo, att, x, true);

        let ffn = (w_gate, w_up, w_down);
        let normed = (x, ffn_norm, h);
        gated_ffn(
            &mut b,
            pn,
            (l, GluAct::Silu),
            ffn,
            normed,
            (gate, up, x),
            true,
        );
    }
    let head = lm_head_weight(&mut b, cfg, embd);
    let logits = rms_head(&mut b, cfg, x, head);
    b.finish(
        geometry(cfg, var.rope_mode, rope_freqs),
        cfg.rms_eps,
        cfg.n_layer,
        logits,
    )
}
