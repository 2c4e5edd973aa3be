//! Hyper-parameters and graphs of the qwen2 / qwen3 / gemma3 golden2 models, and the errors
//! for architectures this build does not run.

use super::graph::{GluAct, Op};
use super::*;
use crate::gguf::{GgufFile, GgufWriter, Value};
use crate::test_shared::shared_path;

fn open(set: &str, model: &str) -> GgufFile {
    let path = shared_path(&format!("{set}/models/{model}"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn qwen3_head_width_from_key_length() {
    let f = open("golden2-extra", "qwen3-d64-f16.gguf");
    let cfg = Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.arch, Arch::Qwen3);
    // n_head · head_dim = 4 · 32 = 128 ≠ n_embd = 64.
    assert_eq!((cfg.n_embd, cfg.n_head, cfg.head_dim), (64, 4, 32));
    let g = graph_for(&cfg, &f);
    let norms = g
        .ops
        .iter()
        .filter(|o| matches!(o, Op::HeadRmsNorm { .. }))
        .count();
    assert_eq!(norms, 2 * cfg.n_layer);
    assert!(g.attn.sliding.is_none());
}

#[test]
fn qwen2_adds_qkv_biases() {
    let f = open("golden2", "qwen2-d64-f16.gguf");
    let cfg = Config::from_gguf(&f).unwrap();
    let g = graph_for(&cfg, &f);
    let biases: Vec<&str> = g
        .weights
        .iter()
        .map(|w| w.name.as_str())
        .filter(|n| n.ends_with(".bias"))
        .collect();
    assert_eq!(biases.len(), 3 * cfg.n_layer, "{biases:?}");
    assert!(biases.contains(&"blk.1.attn_v.bias"));
}

#[test]
fn gemma3_local_layers_window_and_bases() {
    let f = open("golden2-extra", "gemma3-d64-f16.gguf");
    let cfg = Config::from_gguf(&f).unwrap();
    assert_eq!((cfg.sliding_window, cfg.swa_pattern), (Some(16), 2));
    assert_eq!(cfg.rope_base_swa, 10_000.0);
    assert_eq!(cfg.logit_softcap, None);
    let g = graph_for(&cfg, &f);
    // Pattern 2: layer 0 local (window 16, base 10000), layer 1 global (the file's base).
    assert_eq!(g.attn.window_of(0), Some(16));
    assert_eq!(g.attn.window_of(1), None);
    assert_eq!(g.attn.rope_base_of(0), 10_000.0);
    assert_eq!(g.attn.rope_base_of(1), cfg.rope_base);
    assert!(g.ops.iter().any(|o| matches!(
        o,
        Op::NormGlu {
            act: GluAct::GeluTanh,
            ..
        }
    )));
    assert!(matches!(g.ops[1], Op::Scale { s, .. } if s == 8.0));
}

/// The KV cache a decode step reads: each layer's keys and values over the positions it
/// sees, a local layer's window at most, at the cache's element size.
#[test]
fn kv_bytes_read_follow_each_layers_window() {
    let path = shared_path("golden2-extra/models/gemma3-d64-f16.gguf");
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let model = Model::from_file(file, &LoadOptions::default()).unwrap();
    let g = model.graph();
    let per_position = (2 * g.attn.n_head_kv * g.attn.head_dim * 2) as u64;
    // Layer 0 is local (window 16), layer 1 global.
    assert_eq!(model.layer_kv_bytes_read(0, 10), 10 * per_position);
    assert_eq!(model.layer_kv_bytes_read(0, 40), 16 * per_position);
    assert_eq!(model.layer_kv_bytes_read(1, 40), 40 * per_position);
    let layers: u64 = (0..g.n_layer)
        .map(|l| model.layer_kv_bytes_read(l, 40))
        .sum();
    assert_eq!(model.kv_bytes_read(40), layers);
    // An F32 cache reads twice the bytes.
    let f32_cache = model.with_kv_type(crate::kv::KvType::F32);
    assert_eq!(f32_cache.layer_kv_bytes_read(1, 40), 80 * per_position);
}

#[test]
fn unknown_architecture_lists_the_supported_ones() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::Str("mamba".into()));
    let dir = ternion_testkit::scratch::dir("ternion-model");
    let path = dir.join("mamba.gguf");
    w.write_with(&path, Vec::new()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let err = Config::from_gguf(&f).unwrap_err().to_string();
    assert!(err.contains("unknown architecture 'mamba'"), "{err}");
    for name in config::ARCH_NAMES {
        assert!(err.contains(name), "{name} missing from: {err}");
    }
}

/// Per layer: (NormLinear, NormQkv, NormGlu, SelfAttention with RoPE, without) ops.
fn fused_ops_per_layer(g: &graph::Graph, n_layer: usize) -> [usize; 5] {
    let mut n = [0; 5];
    for op in &g.ops {
        match op {
            Op::NormLinear { .. } => n[0] += 1,
            Op::NormQkv { .. } => n[1] += 1,
            Op::NormGlu { .. } => n[2] += 1,
            Op::SelfAttention { rope: true, .. } => n[3] += 1,
            Op::SelfAttention { rope: false, .. } => n[4] += 1,
            _ => {}
        }
    }
    n.map(|c| {
        assert_eq!(c % n_layer, 0, "{c} fused ops over {n_layer} layers");
        c / n_layer
    })
}

/// Every family's file calls the fused ops its block has the shape of.
#[test]
fn family_graphs_call_the_fused_ops() {
    for (set, model, want) in [
        ("golden", "llama-spm-d32-f16.gguf", [0, 1, 1, 1, 0]),
        ("golden2", "qwen2-d64-f16.gguf", [0, 1, 1, 1, 0]),
        ("golden2-extra", "qwen3-d64-f16.gguf", [0, 1, 1, 1, 0]),
        ("golden2-extra", "gemma3-d64-f16.gguf", [0, 1, 1, 1, 0]),
        // Sub-norms before the output and down projections.
        ("golden", "bitnet-spm-d256-tq2_0.gguf", [2, 1, 1, 1, 0]),
        // Fused q/k/v and gate/up matrices: one NormLinear each.
        ("golden", "phi3-d32-f16.gguf", [2, 0, 0, 1, 0]),
        ("golden", "gpt2-d32-f32.gguf", [0, 0, 0, 0, 1]),
    ] {
        let f = open(set, model);
        let cfg = Config::from_gguf(&f).unwrap();
        let g = graph_for(&cfg, &f);
        assert_eq!(fused_ops_per_layer(&g, cfg.n_layer), want, "{model}");
    }
}
