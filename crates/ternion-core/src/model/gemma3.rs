//! Gemma 3 (`gemma3`).
//!
//! As llama.cpp's `llm_build_gemma3` computes it:
//! ```text
//! x = token_embd[t] · √n_embd
//! h = rmsnorm(x)·attn_norm
//! q, k, v = Wq h, Wk h, Wv h
//! q = rmsnorm_head(q)·attn_q_norm; k = rmsnorm_head(k)·attn_k_norm; q, k = rope_neox(q, k)
//! x = x + rmsnorm(Wo · softmax(q·kᵀ/√head_dim + mask)·v)·post_attention_norm
//! h = rmsnorm(x)·ffn_norm
//! x = x + rmsnorm(Wdown · (gelu_tanh(Wgate h) ⊙ Wup h))·post_ffw_norm
//! ```
//! and `logits = token_embd · (rmsnorm(x)·output_norm)` (tied, unscaled), then
//! `cap · tanh(logits / cap)` when the file has `final_logit_softcapping`.
//! BitNet-embedding files add an RMSNorm of each projection's input
//! (`blk.N.{attn_q,…,ffn_down}_norm_in.weight`; see [`super::llama`]).
//! Layer i is local when `i % pattern < pattern − 1`: its mask also hides keys `window` or
//! more positions behind the query, and its RoPE base is `rope.freq_base_swa`. Norm weights
//! are used as stored (the converter already added Gemma's +1).

use super::blocks::{gated_ffn, geometry, lm_head_weight, projection, qkv, rms_head, ProjNorms};
use super::config::Config;
use super::graph::{Builder, GluAct, Graph, Op, RopeMode, SlidingWindow};

/// The Gemma 3 forward pass for `cfg`.
pub fn graph(cfg: &Config) -> Graph {
    let (d, kv, ff, hq, hd) = (
        cfg.n_embd,
        cfg.kv_dim(),
        cfg.n_ff,
        cfg.n_head * cfg.head_dim,
        cfg.head_dim,
    );
    let mut b = Builder::default();
    let embd = b.matrix("token_embd.weight", d, cfg.n_vocab);
    let x = b.act("x", d);
    let h = b.act("h", d);
    let o = b.act("branch", d);
    let q = b.act("q", hq);
    let k = b.act("k", kv);
    let v = b.act("v", kv);
    let qn = b.act("q_norm", hq);
    let kn = b.act("k_norm", kv);
    let att = b.act("attn", hq);
    let gate = b.act("gate", ff);
    let up = b.act("up", ff);
    let pn = ProjNorms::new(&mut b, cfg);
    b.op(Op::Embed {
        table: embd,
        out: x,
    });
    b.op(Op::Scale {
        x,
        s: (d as f32).sqrt(),
    });
    for l in 0..cfg.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let attn_norm = b.vector(n("attn_norm"), d);
        let wq = b.matrix(n("attn_q"), d, hq);
        let wk = b.matrix(n("attn_k"), d, kv);
        let wv = b.matrix(n("attn_v"), d, kv);
        let q_norm = b.vector(n("attn_q_norm"), hd);
        let k_norm = b.vector(n("attn_k_norm"), hd);
        let wo = b.matrix(n("attn_output"), hq, d);
        let post_attn = b.vector(n("post_attention_norm"), d);
        let ffn_norm = b.vector(n("ffn_norm"), d);
        let w_gate = b.matrix(n("ffn_gate"), d, ff);
        let w_up = b.matrix(n("ffn_up"), d, ff);
        let w_down = b.matrix(n("ffn_down"), ff, d);
        let post_ffw = b.vector(n("post_ffw_norm"), d);

        qkv(&mut b, pn, l, (x, attn_norm, h), (wq, wk, wv), (q, k, v));
        b.head_rms_norm(q, q_norm, qn);
        b.head_rms_norm(k, k_norm, kn);
        b.attention((l, true), [qn, kn, v], att);
        projection(&mut b, pn, (l, "attn_output"), wo, att, o, false);
        b.rms_norm(o, post_attn, h);
        b.op(Op::Add { x, y: h });

        let ffn = (w_gate, w_up, w_down);
        let normed = (x, ffn_norm, h);
        gated_ffn(
            &mut b,
            pn,
            (l, GluAct::GeluTanh),
            ffn,
            normed,
            (gate, up, o),
            false,
        );
        b.rms_norm(o, post_ffw, h);
        b.op(Op::Add { x, y: h });
    }
    let head = lm_head_weight(&mut b, cfg, embd);
    let logits = rms_head(&mut b, cfg, x, head);
    if let Some(cap) = cfg.logit_softcap {
        b.op(Op::SoftCap { x: logits, cap });
    }
    let mut geo = geometry(cfg, RopeMode::Neox, None);
    let pattern = cfg.swa_pattern;
    geo.sliding = cfg.sliding_window.map(|window| SlidingWindow {
        window,
        rope_base: cfg.rope_base_swa,
        local: (0..cfg.n_layer)
            .map(|il| il % pattern < pattern - 1)
            .collect(),
    });
    b.finish(geo, cfg.rms_eps, cfg.n_layer, logits)
}
