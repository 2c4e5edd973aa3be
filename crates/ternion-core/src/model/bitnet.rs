//! BitNet b1.58 (2B-4T: `bitnet-b1.58` / `bitnet-25`) and 1bitLLM BitNet (`bitnet`).
//!
//! One block, as the math reads (docs/FORMATS.md#the-bitnet-block):
//! ```text
//! h = rmsnorm(x)·attn_norm
//! q, k, v = BitLinear(h); q, k = rope_neox(q, k)
//! a = rmsnorm(softmax(q·kᵀ/√d + mask)·v)·attn_sub_norm       (GQA: q head h uses kv head h/group)
//! x = x + BitLinear_o(a)
//! h = rmsnorm(x)·ffn_norm
//! f = rmsnorm(act(BitLinear_gate(h)) · BitLinear_up(h))·ffn_sub_norm   (act: ReLU² or SiLU)
//! x = x + BitLinear_down(f)
//! ```
//! and `logits = token_embd · (rmsnorm(x)·output_norm)`: the LM head is tied to the token
//! embedding, even when the file also has `output.weight` (as in the reference graph).

use super::blocks::{geometry, rms_head};
use super::config::{Arch, Config};
use super::graph::{Builder, GluAct, Graph, Op, RopeMode, WeightId, WeightKind};
use crate::gguf::GgufFile;

/// The BitNet forward pass for `cfg`. `file` tells which optional tensors exist (1bitLLM's
/// per-projection `.scale`).
pub fn graph(cfg: &Config, file: &GgufFile) -> Graph {
    let (d, kv, ff, hq) = (
        cfg.n_embd,
        cfg.kv_dim(),
        cfg.n_ff,
        cfg.n_head * cfg.head_dim,
    );
    let mut b = Builder::default();
    let matrix = |b: &mut Builder, name: String, k: usize, m: usize| -> WeightId {
        let scale_name = name.replace(".weight", ".scale");
        let scale =
            (cfg.arch == Arch::BitNet && file.tensor(&scale_name).is_some()).then_some(scale_name);
        b.weight(name, WeightKind::Matrix { k, m, scale })
    };
    let embd = matrix(&mut b, "token_embd.weight".into(), d, cfg.n_vocab);
    let x = b.act("x", d);
    let h = b.act("h", d);
    let q = b.act("q", hq);
    let k = b.act("k", kv);
    let v = b.act("v", kv);
    let att = b.act("attn", hq);
    let gate = b.act("gate", ff);
    let up = b.act("up", ff);
    let hf = b.act("h_ffn", ff);
    let glu = match cfg.arch {
        Arch::BitNetB158 => GluAct::Relu2,
        _ => GluAct::Silu,
    };
    b.op(Op::Embed {
        table: embd,
        out: x,
    });
    for l in 0..cfg.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        let attn_norm = b.vector(n("attn_norm"), d);
        let wq = matrix(&mut b, n("attn_q"), d, hq);
        let wk = matrix(&mut b, n("attn_k"), d, kv);
        let wv = matrix(&mut b, n("attn_v"), d, kv);
        let attn_sub_norm = b.vector(n("attn_sub_norm"), hq);
        let wo = matrix(&mut b, n("attn_output"), hq, d);
        let ffn_norm = b.vector(n("ffn_norm"), d);
        let w_gate = matrix(&mut b, n("ffn_gate"), d, ff);
        let w_up = matrix(&mut b, n("ffn_up"), d, ff);
        let ffn_sub_norm = b.vector(n("ffn_sub_norm"), ff);
        let w_down = matrix(&mut b, n("ffn_down"), ff, d);

        b.norm_qkv((x, attn_norm, h), [wq, wk, wv], [q, k, v]);
        b.attention((l, true), [q, k, v], att);
        b.norm_linear((att, attn_sub_norm, h), wo, x, true);

        b.norm_glu((x, ffn_norm, h), glu, [w_gate, w_up], (gate, up));
        b.norm_linear((gate, ffn_sub_norm, hf), w_down, x, true);
    }
    // The LM head is the token table even when the file also has `output.weight`.
    let logits = rms_head(&mut b, cfg, x, embd);
    b.finish(
        geometry(cfg, RopeMode::Neox, None),
        cfg.rms_eps,
        cfg.n_layer,
        logits,
    )
}
