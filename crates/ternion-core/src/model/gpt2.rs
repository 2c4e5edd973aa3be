//! GPT-2 (`gpt2`).
//!
//! As llama.cpp's `llm_build_gpt2` computes it:
//! ```text
//! x = token_embd[t] + position_embd[pos]
//! h = layernorm(x)·attn_norm + attn_norm.bias
//! [q | k | v] = Wqkv h + bqkv                                  (no RoPE)
//! x = x + (Wo · softmax(q·kᵀ/√d + mask)·v + bo)
//! h = layernorm(x)·ffn_norm + ffn_norm.bias
//! x = x + (Wdown · gelu_tanh(Wup h + bup) + bdown)
//! ```
//! and `logits = output · (layernorm(x)·output_norm + output_norm.bias)` (`token_embd` when
//! the file has no `output.weight`). Output biases are added after the residual add (the
//! same sum, in another order: a last-bit difference).

use super::blocks::{geometry, lm_head_weight};
use super::config::Config;
use super::graph::{Builder, Graph, Op, RopeMode, UnaryAct};

/// The GPT-2 forward pass for `cfg`.
pub fn graph(cfg: &Config) -> Graph {
    let (d, kv, ff, hq) = (
        cfg.n_embd,
        cfg.kv_dim(),
        cfg.n_ff,
        cfg.n_head * cfg.head_dim,
    );
    let eps = cfg.ln_eps;
    let mut b = Builder::default();
    let embd = b.matrix("token_embd.weight", d, cfg.n_vocab);
    let pos = b.matrix("position_embd.weight", d, cfg.n_ctx_train);
    let x = b.act("x", d);
    let h = b.act("h", d);
    let qkv = b.act("qkv", hq + 2 * kv);
    let q = b.act("q", hq);
    let k = b.act("k", kv);
    let v = b.act("v", kv);
    let att = b.act("attn", hq);
    let up = b.act("up", ff);
    b.op(Op::Embed {
        table: embd,
        out: x,
    });
    b.op(Op::AddPosEmbed { table: pos, x });
    for l in 0..cfg.n_layer {
        let w = |s: &str| format!("blk.{l}.{s}.weight");
        let bias = |s: &str| format!("blk.{l}.{s}.bias");
        let attn_norm = b.vector(w("attn_norm"), d);
        let attn_norm_b = b.vector(bias("attn_norm"), d);
        let wqkv = b.matrix(w("attn_qkv"), d, hq + 2 * kv);
        let bqkv = b.vector(bias("attn_qkv"), hq + 2 * kv);
        let wo = b.matrix(w("attn_output"), hq, d);
        let bo = b.vector(bias("attn_output"), d);
        let ffn_norm = b.vector(w("ffn_norm"), d);
        let ffn_norm_b = b.vector(bias("ffn_norm"), d);
        let w_up = b.matrix(w("ffn_up"), d, ff);
        let b_up = b.vector(bias("ffn_up"), ff);
        let w_down = b.matrix(w("ffn_down"), ff, d);
        let b_down = b.vector(bias("ffn_down"), d);

        b.op(Op::LayerNorm {
            x,
            w: attn_norm,
            b: attn_norm_b,
            eps,
            out: h,
        });
        b.linear(wqkv, h, qkv, false);
        b.op(Op::AddBias { x: qkv, b: bqkv });
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
        b.attention((l, false), [q, k, v], att);
        b.linear(wo, att, x, true);
        b.op(Op::AddBias { x, b: bo });

        b.op(Op::LayerNorm {
            x,
            w: ffn_norm,
            b: ffn_norm_b,
            eps,
            out: h,
        });
        b.linear(w_up, h, up, false);
        b.op(Op::AddBias { x: up, b: b_up });
        b.op(Op::Act {
            act: UnaryAct::GeluTanh,
            x: up,
        });
        b.linear(w_down, up, x, true);
        b.op(Op::AddBias { x, b: b_down });
    }
    let last = b.act("last", d);
    let last_norm = b.act("last_norm", d);
    let logits = b.act("logits", cfg.n_vocab);
    let output_norm = b.vector("output_norm.weight", d);
    let output_norm_b = b.vector("output_norm.bias", d);
    let head = lm_head_weight(&mut b, cfg, embd);
    b.op(Op::SelectRows { x, out: last });
    b.op(Op::LayerNorm {
        x: last,
        w: output_norm,
        b: output_norm_b,
        eps,
        out: last_norm,
    });
    b.op(Op::Linear {
        w: head,
        x: last_norm,
        out: logits,
        add: false,
    });
    b.finish(
        geometry(cfg, RopeMode::Neox, None),
        cfg.rms_eps,
        cfg.n_layer,
        logits,
    )
}
