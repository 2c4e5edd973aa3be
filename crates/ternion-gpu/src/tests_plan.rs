//! The compiled plan of every family: the dispatches of one decoded token pinned, and the
//! GPU's fused launches against the CPU's composition of the same graph ops (on lavapipe in
//! CI).
//!
//! The models: synthetic ones (`crate::synth`, micro shape) for the families it writes,
//! with I2_S weights where the ternary fusions apply, and the tiny golden files for the
//! others. The CPU ↔ GPU comparison covers every row of a prompt and three decode steps,
//! within the family's tolerance ([`CLOSE`] or [`LOOSE`]); measured on lavapipe: ≤ 2.2e-5
//! for the close families, ≤ 0.25 (bitnet tq2_0, max |logit| 14) for the loose ones. With
//! an F32 KV cache on both sides the float families give ≤ 2e-6 (Gemma's decode steps 6e-2:
//! its GELU table), the GPU's F16 cache against them 1e-2–0.35.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::tests::ctx_with;
use super::*;
use crate::gguf::GgufFile;
use crate::kv::KvType;
use crate::model::{self, LmHead, LoadOptions, Logits, Model};
use crate::quant::GgmlType;
use crate::synth::{self, Shape, Spec, Vocab};
use crate::test_shared::shared_path;

/// A model file of one family; a synthetic one is deleted on drop.
struct FamilyFile {
    path: PathBuf,
    temporary: bool,
}

impl Drop for FamilyFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A synthetic micro model of `arch` with `ty` weights, in a file of its own (the tests of
/// this module run in parallel, each with its own copy).
fn synthetic(arch: &str, ty: GgmlType) -> FamilyFile {
    synthetic_shaped(arch, ty, "micro")
}

/// [`synthetic`] of the named shape.
fn synthetic_shaped(arch: &str, ty: GgmlType, shape: &str) -> FamilyFile {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "ternion-plan-{}-{}-{arch}-{}.gguf",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        ty.name()
    ));
    let spec = Spec {
        arch,
        shape: Shape::named(shape).unwrap(),
        weight_type: ty,
        vocab: Vocab::Bytes { n_vocab: 320 },
        seed: 7,
    };
    synth::write(&spec, &path).unwrap_or_else(|e| panic!("synth {arch}: {e}"));
    FamilyFile {
        path,
        temporary: true,
    }
}

/// A tiny golden model (`set/models/name`).
fn golden(set: &str, name: &str) -> FamilyFile {
    FamilyFile {
        path: shared_path(&format!("{set}/models/{name}")),
        temporary: false,
    }
}

/// The tolerance of a family whose kernels reproduce the CPU's arithmetic up to summation
/// order: |Δ| ≤ 1e-4 · (max |logit| + 1).
const CLOSE: f32 = 1e-4;
/// The tolerance of a family with an int8 activation that may round the other way
/// (docs/ARCHITECTURE.md#rounding-flips) or GELU in f32 where the CPU reads ggml's F16
/// table (`UnaryAct::GeluTanh`): |Δ| ≤ 2e-2 · (max |logit| + 1).
const LOOSE: f32 = 2e-2;

/// Every family (2 layers each): its file, the dispatches of one decoded token under the
/// fast and the exact numerics (embedding, blocks, final norm, LM head and the argmax's two
/// launches, as lavapipe runs them), and the CPU ↔ GPU tolerance.
fn families() -> Vec<(&'static str, FamilyFile, [usize; 2], f32)> {
    vec![
        // 1 + 5 per layer + 1 + 1 + 2 (as exec_tests.rs counts them), exact 12 per layer.
        (
            "bitnet-b1.58 i2_s",
            synthetic("bitnet-b1.58", GgmlType::I2_S),
            [15, 29],
            LOOSE,
        ),
        (
            "llama i2_s",
            synthetic("llama", GgmlType::I2_S),
            [19, 29],
            CLOSE,
        ),
        (
            "qwen3 i2_s",
            synthetic("qwen3", GgmlType::I2_S),
            [23, 33],
            LOOSE,
        ),
        (
            "gpt2 q8_0",
            synthetic("gpt2", GgmlType::Q8_0),
            [45, 51],
            LOOSE,
        ),
        (
            "bitnet tq2_0",
            golden("golden", "bitnet-spm-d256-tq2_0.gguf"),
            [40, 46],
            LOOSE,
        ),
        (
            "llama q8_0",
            golden("golden", "llama-spm-d32-q8_0.gguf"),
            [36, 42],
            CLOSE,
        ),
        (
            "qwen2 f16",
            golden("golden2", "qwen2-d64-f16.gguf"),
            [34, 40],
            CLOSE,
        ),
        (
            "qwen3 f16",
            golden("golden2-extra", "qwen3-d64-f16.gguf"),
            [32, 38],
            CLOSE,
        ),
        (
            "gemma3 f16",
            golden("golden2-extra", "gemma3-d64-f16.gguf"),
            [42, 45],
            LOOSE,
        ),
        (
            "phi3 f16",
            golden("golden", "phi3-d32-f16.gguf"),
            [32, 38],
            CLOSE,
        ),
    ]
}

fn options(numerics: Numerics) -> GpuModelOptions {
    GpuModelOptions {
        n_ctx: 64,
        max_batch: 16,
        top_k: 8,
        numerics,
        ..GpuModelOptions::default()
    }
}

#[test]
fn dispatches_per_token_of_every_family() {
    let Some(ctx) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let ctx = Arc::new(ctx);
    for (name, file, want, _) in families() {
        let f = GgufFile::open(&file.path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(model::Config::from_gguf(&f).unwrap().n_layer, 2, "{name}");
        for (numerics, want) in [Numerics::Fast, Numerics::Exact].into_iter().zip(want) {
            let gpu = GpuUpload::from_file(ctx.clone(), &f, options(numerics))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(gpu.dispatches_per_token(), want, "{name} {numerics:?}");
        }
    }
}

/// The CPU's logits of every row of `prompt`, then of each decode step of `steps`.
fn cpu_steps(cpu: &Model, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    let mut st = cpu.cpu_state(64);
    let mut out = vec![cpu
        .forward_cpu(prompt, Logits::All, &mut st)
        .unwrap()
        .to_vec()];
    for &t in steps {
        out.push(
            cpu.forward_cpu(&[t], Logits::Last, &mut st)
                .unwrap()
                .to_vec(),
        );
    }
    out
}

/// Largest |a − b| over two logits slices, and the largest |b|.
fn diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold((0f32, 0f32), |(d, m), (&x, &y)| {
        (d.max((x - y).abs()), m.max(y.abs()))
    })
}

#[test]
fn fused_ops_of_every_family_match_cpu() {
    let Some(ctx) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let ctx = Arc::new(ctx);
    for (name, file, _, tol) in families() {
        let (_, cpu) = model::load(&file.path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut gpu = GpuModel::from_model(ctx.clone(), &cpu, options(Numerics::Exact))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let vocab = cpu.config().n_vocab as u32;
        let prompt: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % vocab).collect();
        let mut st = cpu.cpu_state(64);
        let want = cpu
            .forward_cpu(&prompt, Logits::All, &mut st)
            .unwrap()
            .to_vec();
        let got = gpu.forward(&prompt, Logits::All).unwrap().to_vec();
        let mut worst = vec![diff(&got, &want)];
        for t in [11u32, 3, 29] {
            let want = cpu
                .forward_cpu(&[t], Logits::Last, &mut st)
                .unwrap()
                .to_vec();
            let got = gpu.forward(&[t], Logits::Last).unwrap();
            worst.push(diff(&got, &want));
        }
        eprintln!("{name}: max |gpu − cpu|, max |cpu| per step {worst:?}");
        for (step, (d, m)) in worst.into_iter().enumerate() {
            assert!(
                d <= tol * (m + 1.0),
                "{name} step {step}: {d} (max |logit| {m})"
            );
        }
    }
}

/// An F32 KV cache end to end: the float families, CPU and GPU both with `KvType::F32`
/// (prompt rows, then decode steps: the fused split stores the new keys as F32), under both
/// numerics, within the family's tolerance; and closer to the CPU than the GPU with its
/// default F16 cache is (so the F32 kernels ran: queries, keys and probabilities unrounded).
#[test]
fn f32_kv_cache_matches_cpu() {
    let Some(ctx) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let ctx = Arc::new(ctx);
    let float = [
        "llama q8_0",
        "qwen2 f16",
        "qwen3 f16",
        "gemma3 f16",
        "phi3 f16",
    ];
    for (name, file, _, tol) in families().into_iter().filter(|f| float.contains(&f.0)) {
        let load = || {
            model::load(&file.path)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .1
        };
        let cpu = load().with_kv_type(KvType::F32);
        // The same weights with the default F16 cache.
        let cpu_f16 = load();
        let vocab = cpu.config().n_vocab as u32;
        let prompt: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % vocab).collect();
        let steps = [11u32, 3, 29];
        let want = cpu_steps(&cpu, &prompt, &steps);
        for numerics in [Numerics::Fast, Numerics::Exact] {
            let run = |cpu: &Model| {
                let mut gpu = GpuModel::from_model(ctx.clone(), cpu, options(numerics))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let mut got = vec![gpu.forward(&prompt, Logits::All).unwrap().to_vec()];
                for &t in &steps {
                    got.push(gpu.forward(&[t], Logits::Last).unwrap().to_vec());
                }
                got.iter()
                    .zip(&want)
                    .map(|(g, w)| diff(g, w))
                    .collect::<Vec<_>>()
            };
            let f32_cache = run(&cpu);
            let f16_cache = run(&cpu_f16);
            eprintln!(
                "{name} {numerics:?}: max |gpu − cpu F32|, max |cpu| per step: GPU F32 cache \
                 {f32_cache:?}, GPU F16 cache {f16_cache:?}"
            );
            for (step, &(d, m)) in f32_cache.iter().enumerate() {
                assert!(
                    d <= tol * (m + 1.0),
                    "{name} {numerics:?} step {step}: {d} (max |logit| {m})"
                );
            }
            let worst = |v: &[(f32, f32)]| v.iter().map(|p| p.0).fold(0f32, f32::max);
            assert!(
                worst(&f32_cache) < worst(&f16_cache),
                "{name} {numerics:?}: the F32 cache is no closer to the CPU's than F16"
            );
        }
    }
}

/// The opt-in quantized LM heads (`--lm-head q8_0 | q6_k`) on the GPU: the stored head is
/// requantized at upload to the bytes the CPU's option makes, and the logits' linear reads
/// them (here the tied head of the synthetic BitNet: the token table stays F16 for the
/// embedding). Against the CPU with the same head (exact numerics, prompt rows and three
/// decode steps) within CLOSE (the same int8 products; 1e-6 on lavapipe), and away from the stored head's logits
/// (the option took effect). A head whose rows are not whole Q6_K blocks is refused.
#[test]
fn quantized_lm_heads_match_the_cpus() {
    let Some(ctx) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let ctx = Arc::new(ctx);
    let file = synthetic_shaped("bitnet-b1.58", GgmlType::I2_S, "tiny");
    let load = |lm_head| {
        model::load_with(&file.path, &LoadOptions { lm_head })
            .unwrap_or_else(|e| panic!("{lm_head:?}: {e}"))
            .1
    };
    let stored = load(LmHead::AsStored);
    let vocab = stored.config().n_vocab as u32;
    let prompt: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % vocab).collect();
    let steps = [11u32, 3, 29];
    let run_gpu = |cpu: &Model| {
        let mut gpu = GpuModel::from_model(ctx.clone(), cpu, options(Numerics::Exact))
            .unwrap_or_else(|e| panic!("{:?}: {e}", cpu.lm_head()));
        let mut got = vec![gpu.forward(&prompt, Logits::All).unwrap().to_vec()];
        for &t in &steps {
            got.push(gpu.forward(&[t], Logits::Last).unwrap().to_vec());
        }
        got
    };
    let exact = run_gpu(&stored);
    for head in [LmHead::Q8_0, LmHead::Q6K] {
        let cpu = load(head);
        let want = cpu_steps(&cpu, &prompt, &steps);
        let got = run_gpu(&cpu);
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let (d, m) = diff(g, w);
            let (moved, _) = diff(g, &exact[step]);
            eprintln!("{head:?} step {step}: |gpu − cpu| {d}, |Δ stored head| {moved}");
            assert!(
                d <= CLOSE * (m + 1.0),
                "{head:?} step {step}: {d} (max {m})"
            );
            assert!(
                moved > 1e-4,
                "{head:?} step {step}: the stored head's logits"
            );
        }
    }
    let micro = synthetic("bitnet-b1.58", GgmlType::I2_S);
    let f = GgufFile::open(&micro.path).unwrap();
    let opts = GpuModelOptions {
        lm_head: LmHead::Q6K,
        ..options(Numerics::Fast)
    };
    let err = GpuUpload::from_file(ctx.clone(), &f, opts)
        .err()
        .expect("128-wide rows");
    assert!(err.to_string().contains("cannot requantize"), "{err}");
}
