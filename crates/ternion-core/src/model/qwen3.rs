//! Qwen3 (`qwen3`; also Bonsai and Ternary-Bonsai files).
//!
//! The LLaMA block (see [`super::llama`]) as llama.cpp's `llm_build_qwen3` computes it, with
//! two changes: q and k are RMS-normalised per head (`attn_q_norm`, `attn_k_norm`, one
//! head's width, the model's eps) before RoPE, and RoPE pairs dimension i with
//! i + head_dim/2 (NEOX). The head width comes from `qwen3.attention.key_length`, so
//! n_head · head_dim may differ from n_embd; the attention scale is 1/√head_dim.

use super::config::Config;
use super::graph::{Graph, RopeMode};
use super::llama::{graph_variant, Variant};

/// The Qwen3 forward pass for `cfg`.
pub fn graph(cfg: &Config) -> Graph {
    graph_variant(
        cfg,
        &Variant {
            rope_mode: RopeMode::Neox,
            qkv_bias: false,
            qk_norm: true,
        },
    )
}
