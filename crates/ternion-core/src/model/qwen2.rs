//! Qwen2 (`qwen2`).
//!
//! The LLaMA block (see [`super::llama`]) as llama.cpp's `llm_build_qwen2` computes it, with
//! two changes: q, k and v get their biases (`attn_q/k/v.bias`) after the projections, and
//! RoPE pairs dimension i with i + head_dim/2 (NEOX). `logits = output · (rmsnorm(x) ·
//! output_norm)`, with `output` = `token_embd` when the file has no `output.weight`.

use super::config::Config;
use super::graph::{Graph, RopeMode};
use super::llama::{graph_variant, Variant};

/// The Qwen2 forward pass for `cfg`.
pub fn graph(cfg: &Config) -> Graph {
    graph_variant(
        cfg,
        &Variant {
            rope_mode: RopeMode::Neox,
            qkv_bias: true,
            qk_norm: false,
        },
    )
}
