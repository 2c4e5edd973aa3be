//! Embeddings: the per-token hidden states are what the LM head of the ordinary forward
//! pass reads, pooled vectors are the mean / first / last of those states, the file's
//! `pooling_type`, `attention.causal` and `add_eos_token` keys are honoured, BitNet-embedding
//! per-projection input norms are read and applied, and an F32 KV cache stays close to the
//! F16 one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use ternion::embed::{l2_normalize, Embedder, Pooling};
use ternion::gguf::{GgufFile, Value};
use ternion::kv::KvType;
use ternion::model::{LoadOptions, Logits, Model};
use ternion::quant::GgmlType;
use ternion::tokenizer::{Tokenizer, TokenizerOptions};
use ternion_testkit::synth::{self, Shape, Spec, Vocab};

const TOKENS: [u32; 6] = [1, 72, 101, 108, 108, 111];

/// A synthetic `arch` model with ternary weights of type `ty` (written once per test).
fn synth_model(name: &str, arch: &str, ty: GgmlType) -> PathBuf {
    let dir = ternion_testkit::scratch::dir("ternion-embed-test");
    let path = dir.join(format!("{name}.gguf"));
    let spec = Spec {
        arch,
        shape: Shape::named("micro").unwrap(),
        weight_type: ty,
        vocab: Vocab::Bytes { n_vocab: 300 },
        seed: 7,
    };
    synth::write(&spec, &path).unwrap();
    path
}

/// The model at `path` with the metadata `keys` added (written to a new file beside it).
fn load_with(path: &Path, keys: &[(&str, Value)]) -> Model {
    if keys.is_empty() {
        return Model::from_file(
            Arc::new(GgufFile::open(path).unwrap()),
            &LoadOptions::default(),
        )
        .unwrap();
    }
    ternion::model::load(variant(path, keys, &[])).unwrap().1
}

/// A copy of the file at `path` with the metadata `keys` and the F32 vectors `extra` added.
fn variant(path: &Path, keys: &[(&str, Value)], extra: &[(String, Vec<f32>)]) -> PathBuf {
    let mut tag: String = keys.iter().map(|(k, v)| format!("{k}={v:?};")).collect();
    tag.extend(extra.iter().map(|(n, v)| format!("{n}={};", v[0])));
    let out = path.with_extension(format!("{:x}.gguf", fnv1a(&tag)));
    ternion_testkit::variant::copy_with(path, &out, keys, extra).unwrap();
    out
}

/// FNV-1a of `s` (file names of the variants).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn hidden(m: &Model, tokens: &[u32]) -> Vec<f32> {
    Embedder::new(m, Some(Pooling::None), false)
        .unwrap()
        .hidden_states(tokens)
        .unwrap()
}

#[test]
fn hidden_states_are_what_the_lm_head_reads() {
    for (arch, ty) in [("llama", GgmlType::I2_S), ("qwen3", GgmlType::Q2_0)] {
        let m = load_with(&synth_model(arch, arch, ty), &[]);
        let d = m.config().n_embd;
        let h = hidden(&m, &TOKENS);
        assert_eq!(h.len(), TOKENS.len() * d);
        let mut st = m.cpu_state(16);
        let logits = m
            .forward_cpu(&TOKENS, Logits::All, &mut st)
            .unwrap()
            .to_vec();
        let nv = m.config().n_vocab;
        // The LM head is the tied F16 token table.
        let info = m.file().tensor("token_embd.weight").unwrap();
        let table: Vec<f32> = m
            .file()
            .tensor_data(info)
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        for (t, row) in h.chunks_exact(d).enumerate() {
            for v in [0, 7, 99, nv - 1] {
                let want: f32 = table[v * d..(v + 1) * d]
                    .iter()
                    .zip(row)
                    .map(|(a, b)| a * b)
                    .sum();
                let got = logits[t * nv + v];
                assert!(
                    (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                    "{arch} token {t} vocab {v}: logit {got}, head · hidden {want}"
                );
            }
        }
    }
}

#[test]
fn pooled_vectors_are_the_pooling_of_the_token_states() {
    let m = load_with(&synth_model("pool", "llama", GgmlType::I2_S), &[]);
    let d = m.config().n_embd;
    let h = hidden(&m, &TOKENS);
    let n = TOKENS.len();
    let mut mean = vec![0f32; d];
    for row in h.chunks_exact(d) {
        mean.iter_mut()
            .zip(row)
            .for_each(|(s, &x)| *s += x / n as f32);
    }
    let cases = [
        (Pooling::Mean, mean.clone()),
        (Pooling::Cls, h[..d].to_vec()),
        (Pooling::Last, h[(n - 1) * d..].to_vec()),
    ];
    for (p, want) in cases {
        let got = Embedder::new(&m, Some(p), false)
            .unwrap()
            .embed(&TOKENS)
            .unwrap();
        assert_eq!(got.len(), 1, "{p:?}: one vector");
        for (i, (&g, &w)) in got[0].iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{p:?}[{i}]: {g} vs {w}"
            );
        }
        let unit = Embedder::new(&m, Some(p), true)
            .unwrap()
            .embed(&TOKENS)
            .unwrap();
        let norm: f32 = unit[0].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{p:?}: |v| = {norm}");
        let mut scaled = got[0].clone();
        l2_normalize(&mut scaled);
        assert_eq!(unit[0], scaled, "{p:?}: normalised = pooled / |pooled|");
    }
    let each = Embedder::new(&m, Some(Pooling::None), false)
        .unwrap()
        .embed(&TOKENS)
        .unwrap();
    assert_eq!(each.concat(), h, "pooling none gives every token's state");
}

#[test]
fn pooling_comes_from_the_file() {
    let path = synth_model("keys", "llama", GgmlType::I2_S);
    let pooling = |code: Option<u32>| {
        let keys: Vec<(&str, Value)> = code
            .map(|c| ("llama.pooling_type", Value::U32(c)))
            .into_iter()
            .collect();
        let m = load_with(&path, &keys);
        Embedder::new(&m, None, true).map(|e| e.pooling())
    };
    assert_eq!(pooling(None).unwrap(), Pooling::Mean, "no key: mean");
    assert_eq!(pooling(Some(0)).unwrap(), Pooling::None);
    assert_eq!(pooling(Some(2)).unwrap(), Pooling::Cls);
    assert_eq!(pooling(Some(3)).unwrap(), Pooling::Last);
    let rank = pooling(Some(4)).unwrap_err().to_string();
    assert!(
        rank.contains("llama.pooling_type") && rank.contains("rank") && rank.contains("3 last"),
        "{rank}"
    );
    let unknown = pooling(Some(9)).unwrap_err();
    assert!(
        matches!(&unknown, ternion::Error::Unsupported { what, found, supported, .. }
            if what == "llama.pooling_type" && found == "9" && supported.len() == 4),
        "{unknown}"
    );
    assert!(
        unknown
            .to_string()
            .contains("llama.pooling_type '9' is not supported (supported: 0 none"),
        "{unknown}"
    );
}

#[test]
fn non_causal_attention_lets_early_tokens_see_later_ones() {
    let path = synth_model("causal", "qwen3", GgmlType::Q2_0);
    let causal = load_with(&path, &[]);
    let open = load_with(&path, &[("qwen3.attention.causal", Value::Bool(false))]);
    assert!(causal.graph().attn.causal && !open.graph().attn.causal);
    let d = causal.config().n_embd;
    let mut other = TOKENS;
    other[5] = 200;
    // Causal: the first token's state ignores the last token.
    assert_eq!(hidden(&causal, &TOKENS)[..d], hidden(&causal, &other)[..d]);
    // Non-causal: it sees it.
    assert_ne!(hidden(&open, &TOKENS)[..d], hidden(&open, &other)[..d]);
    // A single token sees only itself either way.
    assert_eq!(hidden(&causal, &TOKENS[..1]), hidden(&open, &TOKENS[..1]));
}

#[test]
fn eos_ends_the_input_when_the_vocabulary_adds_it() {
    let path = synth_model("eos", "llama", GgmlType::I2_S);
    for add in [false, true] {
        let m = load_with(&path, &[("tokenizer.ggml.add_eos_token", Value::Bool(add))]);
        let tok = Tokenizer::from_gguf(m.file(), &TokenizerOptions::default()).unwrap();
        let mut e = Embedder::new(&m, None, true).unwrap();
        let ids = e.tokenize(&tok, "hello").unwrap();
        let eos = tok.eos_id().unwrap();
        assert_eq!(
            ids.last() == Some(&eos),
            add,
            "add_eos_token {add}: {ids:?}"
        );
        assert!(e.embed(&ids).is_ok());
    }
}

#[test]
fn an_f32_kv_cache_is_close_to_the_f16_one_and_twice_the_bytes() {
    let path = synth_model("kv", "llama", GgmlType::I2_S);
    let f16 = load_with(&path, &[]);
    let f32 = load_with(&path, &[]).with_kv_type(KvType::F32);
    assert_eq!(
        f32.kv_geometry().page_bytes(),
        2 * f16.kv_geometry().page_bytes()
    );
    let run = |m: &Model| {
        let mut st = m.cpu_state(16);
        let mut rows = m
            .forward_cpu(&TOKENS[..4], Logits::All, &mut st)
            .unwrap()
            .to_vec();
        for &t in &TOKENS[4..] {
            rows.extend_from_slice(m.forward_cpu(&[t], Logits::Last, &mut st).unwrap());
        }
        rows
    };
    let (a, b) = (run(&f16), run(&f32));
    let max = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = a.iter().map(|x| x.abs()).fold(0f32, f32::max);
    assert!(
        max > 0.0 && max < 0.05 * scale,
        "F16 vs F32 KV: max |diff| {max}, logits up to {scale}"
    );
}

/// BitNet-embedding's per-projection input norms of a model with `c`'s shape (every weight
/// 1.5), but `skip`.
fn proj_norms(c: &ternion::model::Config, skip: Option<&str>) -> Vec<(String, Vec<f32>)> {
    let width = |p: &str| match p {
        "attn_output" => c.n_head * c.head_dim,
        "ffn_down" => c.n_ff,
        _ => c.n_embd,
    };
    let projs = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    (0..c.n_layer)
        .flat_map(|l| projs.iter().map(move |p| (l, *p)))
        .filter(|(l, p)| skip != Some(&format!("blk.{l}.{p}_norm_in.weight")))
        .map(|(l, p)| (format!("blk.{l}.{p}_norm_in.weight"), vec![1.5; width(p)]))
        .collect()
}

#[test]
fn bitnet_embedding_projection_norms_are_read_and_applied() {
    let path = synth_model("proj", "qwen3", GgmlType::Q2_0);
    let plain = load_with(&path, &[]);
    let c = plain.config().clone();
    let norms = |skip: Option<&str>| proj_norms(&c, skip);
    let with = ternion::model::load(variant(&path, &[], &norms(None)))
        .unwrap()
        .1;
    let extra = with.graph().weights.len() - plain.graph().weights.len();
    assert_eq!(extra, 7 * c.n_layer, "seven input norms per block");
    assert_ne!(hidden(&with, &TOKENS), hidden(&plain, &TOKENS));
    let missing = "blk.1.ffn_down_norm_in.weight";
    let e = ternion::model::load(variant(&path, &[], &norms(Some(missing))))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains(missing), "{e}");
}

/// The default GPU adapter (lavapipe in CI); `None` where TERNION_SKIP_GPU_TESTS=1 and
/// there is none.
#[cfg(feature = "gpu")]
fn gpu_context() -> Option<Arc<ternion::backend::gpu::GpuContext>> {
    use ternion::backend::gpu::{GpuContext, GpuOptions};
    match GpuContext::new(&GpuOptions::default()) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping GPU test (TERNION_SKIP_GPU_TESTS=1): {e}");
            None
        }
        Err(e) => panic!(
            "no usable GPU adapter: {e}. Install Mesa's lavapipe (mesa-vulkan-drivers) or \
             set TERNION_SKIP_GPU_TESTS=1 to skip"
        ),
    }
}

/// Embeds `inputs` with every pooling on the CPU (`m`) and on `gpu`, asserts the vectors
/// within `tol` of each other (`what` names the case) and returns the largest difference;
/// `check` sees each pooling, input and CPU vectors first.
#[cfg(feature = "gpu")]
fn gpu_vs_cpu(
    m: &Model,
    gpu: &mut ternion::backend::gpu::GpuModel,
    inputs: &[&[u32]],
    tol: f32,
    what: &str,
    mut check: impl FnMut(Pooling, &[u32], &[Vec<f32>]),
) -> f32 {
    let mut worst = 0f32;
    for p in [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last] {
        let mut cpu = Embedder::new(m, Some(p), true).unwrap();
        let mut on_gpu = Embedder::with_backend(m, Box::new(&mut *gpu), Some(p), true).unwrap();
        assert_eq!(on_gpu.dim(), cpu.dim(), "{what}");
        for &ids in inputs {
            let want = cpu.embed(ids).unwrap();
            check(p, ids, &want);
            let d = max_diff(&on_gpu.embed(ids).unwrap(), &want);
            assert!(
                d <= tol,
                "{what} {p:?} {} tokens: max |gpu − cpu| {d}",
                ids.len()
            );
            worst = worst.max(d);
        }
    }
    worst
}

/// Largest |a − b| over the values of two lists of vectors.
#[cfg(feature = "gpu")]
fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0f32, f32::max)
}

/// GPU embeddings equal the CPU's: every family the embedding files use (qwen3 and llama
/// synthetic I2_S models, the golden Gemma 3 F16 file), with and without BitNet-embedding's
/// per-projection input norms, under both GPU numerics and every pooling, for inputs cut
/// into several GPU steps (8 tokens at most: 21 → 8 + 8 + 5, 9 → 7 + 2) and one token.
///
/// The vectors have unit length; the bound is per value. The GPU differs from the CPU by
/// f32 summation order (qwen3: ≤ 5.3e-7 measured on lavapipe), by int8 activations that
/// round the other way at a .5 boundary (docs/ARCHITECTURE.md, "Rounding flips"; llama:
/// one flip, 2.6e-3) and by Gemma's GELU, which the CPU reads from ggml's F16 table and the
/// GPU computes in f32 (≤ 1.8e-4). The I2_S models (int8 activations: a flip may happen on
/// any adapter) get [`FLIPS`], about 4 × one flip; the F16 Gemma file, with no activation
/// quantization, [`F16_TOL`], about 5 × its GELU difference.
#[cfg(feature = "gpu")]
#[test]
fn gpu_embeddings_equal_the_cpus() {
    use ternion::backend::gpu::{GpuModel, GpuModelOptions, Numerics};
    const FLIPS: f32 = 1e-2;
    const F16_TOL: f32 = 1e-3;
    let Some(ctx) = gpu_context() else { return };
    let gemma = ternion_testkit::shared::shared_path("golden2-extra/models/gemma3-d64-f16.gguf");
    let qwen3 = synth_model("gpu-qwen3", "qwen3", GgmlType::I2_S);
    let with_norms = |path: &Path| {
        let c = load_with(path, &[]).config().clone();
        variant(path, &[], &proj_norms(&c, None))
    };
    let families = [
        (
            "llama i2_s",
            synth_model("gpu-llama", "llama", GgmlType::I2_S),
            FLIPS,
        ),
        ("qwen3 i2_s", qwen3.clone(), FLIPS),
        ("qwen3 i2_s + input norms", with_norms(&qwen3), FLIPS),
        ("gemma3 f16", gemma.clone(), F16_TOL),
        ("gemma3 f16 + input norms", with_norms(&gemma), F16_TOL),
    ];
    for (name, path, tol) in families {
        let m = load_with(&path, &[]);
        let vocab = m.config().n_vocab as u32;
        let long: Vec<u32> = (0..21).map(|i| (i * 37 + 5) % vocab).collect();
        let inputs = [&long[..], &long[..9], &long[..1]];
        for numerics in [Numerics::Exact, Numerics::Fast] {
            let opts = GpuModelOptions {
                n_ctx: 32,
                max_batch: 8,
                numerics,
                ..GpuModelOptions::default()
            };
            let mut gpu = GpuModel::from_model(ctx.clone(), &m, opts)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let what = format!("{name} {numerics:?}");
            let worst = gpu_vs_cpu(&m, &mut gpu, &inputs, tol, &what, |_, _, _| {});
            eprintln!("{what}: max |gpu − cpu| {worst}");
        }
    }
}

/// Non-causal files (`attention.causal = false`) on the GPU: every token of an input sees
/// the whole input, as on the CPU — llama and qwen3 I2_S, and the Gemma 3 F16 file (its
/// sliding-window layers too), under both numerics and every pooling, the input in one GPU
/// step (21, 9 and 1 tokens; the CPU's vectors differ from the causal ones, so the flag is
/// what is compared), with the bounds of [`gpu_embeddings_equal_the_cpus`]. An input longer
/// than a step is refused, naming the limit, rather than cut.
#[cfg(feature = "gpu")]
#[test]
fn gpu_non_causal_embeddings_equal_the_cpus() {
    use ternion::backend::gpu::{GpuModel, GpuModelOptions, Numerics};
    let Some(ctx) = gpu_context() else { return };
    let gemma = ternion_testkit::shared::shared_path("golden2-extra/models/gemma3-d64-f16.gguf");
    let families = [
        (
            "llama",
            synth_model("nc-llama", "llama", GgmlType::I2_S),
            1e-2,
        ),
        (
            "qwen3",
            synth_model("nc-qwen3", "qwen3", GgmlType::I2_S),
            1e-2,
        ),
        ("gemma3", gemma, 1e-3),
    ];
    for (arch, path, tol) in families {
        let key = format!("{arch}.attention.causal");
        let m = load_with(&path, &[(key.as_str(), Value::Bool(false))]);
        let causal = load_with(&path, &[]);
        let vocab = m.config().n_vocab as u32;
        let long: Vec<u32> = (0..21).map(|i| (i * 37 + 5) % vocab).collect();
        for numerics in [Numerics::Exact, Numerics::Fast] {
            let opts = |max_batch| GpuModelOptions {
                n_ctx: 32,
                max_batch,
                numerics,
                ..GpuModelOptions::default()
            };
            let mut gpu = GpuModel::from_model(ctx.clone(), &m, opts(32))
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            let what = format!("non-causal {arch} {numerics:?}");
            let inputs = [&long[..], &long[..9], &long[..1]];
            // The last token sees every other in a causal pass too.
            let differs = |p: Pooling, ids: &[u32], want: &[Vec<f32>]| {
                if ids.len() > 1 && p != Pooling::Last {
                    let other = Embedder::new(&causal, Some(p), true).unwrap().embed(ids);
                    assert!(max_diff(want, &other.unwrap()) > 10.0 * tol, "{what} {p:?}");
                }
            };
            let worst = gpu_vs_cpu(&m, &mut gpu, &inputs, tol, &what, differs);
            eprintln!("{what}: max |gpu − cpu| {worst}");
            let mut small = GpuModel::from_model(ctx.clone(), &m, opts(8)).unwrap();
            let mut on_gpu = Embedder::with_backend(&m, Box::new(&mut small), None, true).unwrap();
            let e = on_gpu.embed(&long).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{arch}.attention.causal = false"))
                    && e.contains("21 tokens, a step at most 8"),
                "{e}"
            );
        }
    }
}

/// The GPU refuses what the CPU refuses, with the same errors: an empty input, and one
/// longer than the context (the GPU plan's here).
#[cfg(feature = "gpu")]
#[test]
fn gpu_embedding_errors_are_the_cpus() {
    use ternion::backend::gpu::{GpuModel, GpuModelOptions};
    let Some(ctx) = gpu_context() else { return };
    let m = load_with(&synth_model("gpu-errors", "qwen3", GgmlType::I2_S), &[]);
    let opts = GpuModelOptions {
        n_ctx: 16,
        max_batch: 8,
        ..GpuModelOptions::default()
    };
    let mut gpu = GpuModel::from_model(ctx, &m, opts).unwrap();
    let mut cpu = Embedder::new(&m, None, true).unwrap();
    let mut on_gpu = Embedder::with_backend(&m, Box::new(&mut gpu), None, true).unwrap();
    let empty = (cpu.embed(&[]).unwrap_err(), on_gpu.embed(&[]).unwrap_err());
    assert_eq!(empty.0.to_string(), empty.1.to_string());
    assert!(empty.1.to_string().contains("empty input"), "{}", empty.1);
    let n_ctx = m.config().n_ctx_train;
    let too_long = vec![5u32; n_ctx + 1];
    assert!(matches!(cpu.embed(&too_long).unwrap_err(),
            ternion::Error::ContextFull { used: 0, new, n_ctx: c } if new == n_ctx + 1 && c == n_ctx));
    let e = on_gpu.embed(&[5; 17]).unwrap_err();
    assert!(
        matches!(
            e,
            ternion::Error::ContextFull {
                used: 0,
                new: 17,
                n_ctx: 16
            }
        ),
        "{e}"
    );
    // The GPU sequence is free again: an input that fits runs after the refusals.
    assert_eq!(on_gpu.embed(&TOKENS).unwrap()[0].len(), on_gpu.dim());
}
