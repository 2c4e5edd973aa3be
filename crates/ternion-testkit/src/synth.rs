//! Random-weight GGUF models of real shapes, for tests and benchmarks where real weights
//! cannot be downloaded. Ternary weights are drawn with p(−1) = p(+1) = ¼, p(0) = ½ and
//! stored in the requested ternary format (I2_S, TQ1_0, TQ2_0, or Q2_0 codes with one scale
//! per block, as Ternary-Bonsai files hold them); the embedding is F16; norms are
//! U(0.5, 1.5).

use std::path::Path;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gguf::{GgufFile, GgufWriter, Value, ValueType};
use crate::quant::{self, GgmlType};
use crate::{Error, Result};

/// Transformer dimensions of a synthetic model.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Model width.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// FFN width.
    pub n_ff: usize,
}

impl Shape {
    /// A named shape: `2b-4t` (BitNet b1.58 2B-4T), `small`, `tiny`, `micro` (about 0.3 M
    /// parameters with a byte vocabulary: for software WebGPU in CI).
    pub fn named(name: &str) -> Option<Shape> {
        let s = |n_embd, n_layer, n_head, n_head_kv, n_ff| Shape {
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
        };
        Some(match name {
            "2b-4t" => s(2560, 30, 20, 5, 6912),
            "small" => s(512, 4, 8, 2, 1536),
            "tiny" => s(256, 2, 4, 1, 768),
            "micro" => s(128, 2, 4, 2, 256),
            "gpt2-124m" => s(768, 12, 12, 12, 3072),
            // Falcon3-1B-1.58bit (with --arch llama --type i2_s): head_dim 256, GQA 8/4.
            "falcon3-1b" => s(2048, 18, 8, 4, 8192),
            // Ternary-Bonsai-1.7B = Qwen3-1.7B (with --arch qwen3 --type q2_0): head_dim
            // 128, GQA 16/8, tied embeddings.
            "bonsai-1.7b" => s(2048, 28, 16, 8, 6144),
            _ => return None,
        })
    }

    /// Names accepted by [`Shape::named`].
    pub const NAMES: &'static [&'static str] = &[
        "2b-4t",
        "small",
        "tiny",
        "micro",
        "gpt2-124m",
        "falcon3-1b",
        "bonsai-1.7b",
    ];
}

/// Where the tokenizer metadata comes from.
pub enum Vocab<'a> {
    /// Copy `tokenizer.*` from a GGUF file, keeping at most `limit` tokens (the specials
    /// are kept, ids remapped).
    File {
        path: &'a Path,
        limit: Option<usize>,
    },
    /// A byte-level vocabulary of `n_vocab` tokens: 256 byte tokens, three specials, and
    /// reserved control tokens up to the size (so the LM head has a real size).
    Bytes {
        /// Total tokens (at least 259).
        n_vocab: usize,
    },
}

/// Everything `write` needs.
pub struct Spec<'a> {
    /// `general.architecture`: `bitnet-b1.58`, `bitnet-25` or `bitnet`.
    pub arch: &'a str,
    /// Dimensions.
    pub shape: Shape,
    /// Storage type of the ternary projections (I2_S, TQ1_0, TQ2_0).
    pub weight_type: GgmlType,
    /// Tokenizer source.
    pub vocab: Vocab<'a>,
    /// RNG seed.
    pub seed: u64,
}

/// Writes a random-weight model to `out`.
pub fn write(spec: &Spec, out: &Path) -> Result<()> {
    if spec.arch == "gpt2" {
        return write_gpt2(spec, out);
    }
    if !quant::is_ternary(spec.weight_type) && spec.weight_type != GgmlType::Q2_0 {
        return Err(Error::unsupported(
            "synth: ternary weight type",
            spec.weight_type,
            [
                GgmlType::I2_S,
                GgmlType::TQ1_0,
                GgmlType::TQ2_0,
                GgmlType::Q2_0,
            ],
            "",
        ));
    }
    use crate::model::Arch;
    let arch = Arch::from_name(spec.arch);
    if !matches!(
        arch,
        Some(Arch::BitNet | Arch::BitNetB158 | Arch::Llama | Arch::Qwen3)
    ) {
        return Err(Error::unsupported(
            "synth: architecture",
            spec.arch,
            [
                "bitnet-b1.58",
                "bitnet-25",
                "bitnet",
                "llama",
                "qwen3",
                "gpt2",
            ],
            "",
        ));
    }
    // Falcon3-1.58 / TriLM style: the llama block (no sub-norms) with ternary weights;
    // Ternary-Bonsai: the qwen3 block (per-head q/k norms).
    let sub_norms = !matches!(arch, Some(Arch::Llama | Arch::Qwen3));
    let qk_norms = arch == Some(Arch::Qwen3);
    let sh = &spec.shape;
    let block = spec.weight_type.block_elems();
    if !sh.n_embd.is_multiple_of(block) || !sh.n_ff.is_multiple_of(block) {
        return Err(Error::Request(format!(
            "synth: widths {} and {} must be multiples of {block} for {}",
            sh.n_embd, sh.n_ff, spec.weight_type
        )));
    }
    let mut w = GgufWriter::new();
    let a = spec.arch;
    let head_dim = sh.n_embd / sh.n_head;
    w.add("general.architecture", Value::Str(a.into()))
        .add("general.name", Value::Str(format!("ternion-synth-{a}")))
        .add(&format!("{a}.context_length"), Value::U32(4096))
        .add(
            &format!("{a}.embedding_length"),
            Value::U32(sh.n_embd as u32),
        )
        .add(&format!("{a}.block_count"), Value::U32(sh.n_layer as u32))
        .add(
            &format!("{a}.feed_forward_length"),
            Value::U32(sh.n_ff as u32),
        )
        .add(
            &format!("{a}.rope.dimension_count"),
            Value::U32(head_dim as u32),
        )
        .add(
            &format!("{a}.attention.head_count"),
            Value::U32(sh.n_head as u32),
        )
        .add(
            &format!("{a}.attention.head_count_kv"),
            Value::U32(sh.n_head_kv as u32),
        )
        .add(
            &format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        )
        .add(&format!("{a}.rope.freq_base"), Value::F32(500_000.0));
    if qk_norms {
        w.add(
            &format!("{a}.attention.key_length"),
            Value::U32(head_dim as u32),
        );
    }
    let n_vocab = add_vocab(&mut w, &spec.vocab)?;

    let (d, ff, kv) = (
        sh.n_embd as u64,
        sh.n_ff as u64,
        (sh.n_head_kv * head_dim) as u64,
    );
    let wt = spec.weight_type;
    w.declare("token_embd.weight", GgmlType::F16, &[d, n_vocab as u64])?;
    w.declare("output_norm.weight", GgmlType::F32, &[d])?;
    for i in 0..sh.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        w.declare(&n("attn_norm"), GgmlType::F32, &[d])?;
        w.declare(&n("attn_q"), wt, &[d, d])?;
        w.declare(&n("attn_k"), wt, &[d, kv])?;
        w.declare(&n("attn_v"), wt, &[d, kv])?;
        w.declare(&n("attn_output"), wt, &[d, d])?;
        if qk_norms {
            w.declare(&n("attn_q_norm"), GgmlType::F32, &[head_dim as u64])?;
            w.declare(&n("attn_k_norm"), GgmlType::F32, &[head_dim as u64])?;
        }
        if sub_norms {
            w.declare(&n("attn_sub_norm"), GgmlType::F32, &[d])?;
        }
        w.declare(&n("ffn_norm"), GgmlType::F32, &[d])?;
        w.declare(&n("ffn_gate"), wt, &[d, ff])?;
        w.declare(&n("ffn_up"), wt, &[d, ff])?;
        w.declare(&n("ffn_down"), wt, &[ff, d])?;
        if sub_norms {
            w.declare(&n("ffn_sub_norm"), GgmlType::F32, &[ff])?;
        }
    }

    let mut rng = StdRng::seed_from_u64(spec.seed);
    let file_err = |name: &str| Error::Model(format!("synth: no shape for '{name}'"));
    w.write(out, |_, name| {
        if name == "token_embd.weight" {
            // Uniform with standard deviation 0.05.
            let a = 0.05 * 3f32.sqrt();
            let n = sh.n_embd * n_vocab;
            let mut bytes = Vec::with_capacity(n * 2);
            for _ in 0..n {
                let v = f16::from_f32(rng.random_range(-a..a));
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            return Ok(bytes);
        }
        if name.ends_with("norm.weight") {
            let n = if name.contains("ffn_sub_norm") {
                sh.n_ff
            } else if name.contains("attn_q_norm") || name.contains("attn_k_norm") {
                head_dim
            } else {
                sh.n_embd
            };
            return Ok((0..n)
                .flat_map(|_| rng.random_range(0.5f32..1.5).to_le_bytes())
                .collect());
        }
        let (k, m) = if name.contains("ffn_down") {
            (sh.n_ff, sh.n_embd)
        } else if name.contains("ffn_") {
            (sh.n_embd, sh.n_ff)
        } else if name.contains("attn_k") || name.contains("attn_v") {
            (sh.n_embd, kv as usize)
        } else if name.contains("attn_") {
            (sh.n_embd, sh.n_embd)
        } else {
            return Err(file_err(name));
        };
        Ok(ternary_tensor(&mut rng, wt, k, m))
    })
}

/// Learned positions of a synthetic GPT-2.
const GPT2_N_CTX: usize = 1024;

/// A GPT-2 of `spec.shape` (n_head_kv is ignored: GPT-2 has none) with dense random
/// weights (uniform, standard deviation 1/√fan_in; norms U(0.5, 1.5); biases and position
/// embeddings of std 0.02) stored as `spec.weight_type` (F32, F16, Q8_0 or Q4_0), with a
/// separate LM head of the same type.
fn write_gpt2(spec: &Spec, out: &Path) -> Result<()> {
    let wt = spec.weight_type;
    let quantize: fn(&[f32], &mut [u8]) = match wt {
        GgmlType::F32 => quant::float::quantize_row_f32,
        GgmlType::F16 => quant::float::quantize_row_f16,
        GgmlType::Q8_0 => quant::q8_0::quantize_row,
        GgmlType::Q4_0 => quant::q4_0::quantize_row,
        other => {
            return Err(Error::unsupported(
                "synth: gpt2 weight type",
                other,
                [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0],
                "",
            ))
        }
    };
    let sh = &spec.shape;
    if !sh.n_embd.is_multiple_of(sh.n_head)
        || !sh.n_embd.is_multiple_of(32)
        || !sh.n_ff.is_multiple_of(32)
    {
        return Err(Error::Request(format!(
            "synth: gpt2 widths {} and {} must be multiples of 32 (and of the head count)",
            sh.n_embd, sh.n_ff
        )));
    }
    let mut w = GgufWriter::new();
    let a = "gpt2";
    w.add("general.architecture", Value::Str(a.into()))
        .add("general.name", Value::Str("ternion-synth-gpt2".into()))
        .add(
            &format!("{a}.context_length"),
            Value::U32(GPT2_N_CTX as u32),
        )
        .add(
            &format!("{a}.embedding_length"),
            Value::U32(sh.n_embd as u32),
        )
        .add(&format!("{a}.block_count"), Value::U32(sh.n_layer as u32))
        .add(
            &format!("{a}.feed_forward_length"),
            Value::U32(sh.n_ff as u32),
        )
        .add(
            &format!("{a}.attention.head_count"),
            Value::U32(sh.n_head as u32),
        )
        .add(
            &format!("{a}.attention.layer_norm_epsilon"),
            Value::F32(1e-5),
        );
    let n_vocab = add_vocab(&mut w, &spec.vocab)?;
    let (d, ff) = (sh.n_embd, sh.n_ff);
    // name → (k, m, stored type); vectors have m = 1 and are F32.
    let mut shapes = std::collections::HashMap::new();
    let mut declare = |w: &mut GgufWriter, name: String, k: usize, m: usize, ty| -> Result<()> {
        if m == 1 {
            w.declare(&name, ty, &[k as u64])?;
        } else {
            w.declare(&name, ty, &[k as u64, m as u64])?;
        }
        shapes.insert(name, (k, m, ty));
        Ok(())
    };
    declare(&mut w, "token_embd.weight".into(), d, n_vocab, wt)?;
    declare(
        &mut w,
        "position_embd.weight".into(),
        d,
        GPT2_N_CTX,
        GgmlType::F32,
    )?;
    for i in 0..sh.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        for (base, k, m) in [
            ("attn_qkv", d, 3 * d),
            ("attn_output", d, d),
            ("ffn_up", d, ff),
            ("ffn_down", ff, d),
        ] {
            declare(&mut w, n(&format!("{base}.weight")), k, m, wt)?;
            declare(&mut w, n(&format!("{base}.bias")), m, 1, GgmlType::F32)?;
        }
        for base in ["attn_norm", "ffn_norm"] {
            declare(&mut w, n(&format!("{base}.weight")), d, 1, GgmlType::F32)?;
            declare(&mut w, n(&format!("{base}.bias")), d, 1, GgmlType::F32)?;
        }
    }
    declare(&mut w, "output_norm.weight".into(), d, 1, GgmlType::F32)?;
    declare(&mut w, "output_norm.bias".into(), d, 1, GgmlType::F32)?;
    declare(&mut w, "output.weight".into(), d, n_vocab, wt)?;

    let mut rng = StdRng::seed_from_u64(spec.seed);
    w.write(out, |_, name| {
        let &(k, m, ty) = shapes
            .get(name)
            .ok_or_else(|| Error::Model(format!("synth: no shape for '{name}'")))?;
        let std = if name.ends_with(".bias") || name == "position_embd.weight" {
            0.02
        } else {
            1.0 / (k as f32).sqrt()
        };
        let half_width = std * 3f32.sqrt();
        let mut row = vec![0f32; k];
        let row_bytes = ty.row_bytes(k as u64).expect("whole blocks") as usize;
        let mut bytes = vec![0u8; row_bytes * m];
        for dst in bytes.chunks_exact_mut(row_bytes) {
            for v in row.iter_mut() {
                *v = if name.ends_with("norm.weight") {
                    rng.random_range(0.5f32..1.5)
                } else {
                    rng.random_range(-half_width..half_width)
                };
            }
            if ty == GgmlType::F32 {
                quant::float::quantize_row_f32(&row, dst);
            } else {
                quantize(&row, dst);
            }
        }
        Ok(bytes)
    })
}

/// A random ternary `m × k` matrix with scale `1/√(k/2)`, stored as `ty`.
fn ternary_tensor(rng: &mut StdRng, ty: GgmlType, k: usize, m: usize) -> Vec<u8> {
    let scale = f16::from_f32(1.0 / (k as f32 / 2.0).sqrt()).to_f32();
    let mut vals = vec![0f32; k * m];
    for chunk in vals.chunks_mut(32) {
        let bits: u64 = rng.random();
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = match (bits >> (2 * i)) & 3 {
                0 => -scale,
                2 => scale,
                _ => 0.0,
            };
        }
    }
    let size = ty
        .tensor_bytes(&[k as u64, m as u64])
        .expect("shape checked") as usize;
    let mut out = vec![0u8; size];
    match ty {
        GgmlType::I2_S => quant::i2s::quantize_tensor(&vals, &mut out),
        GgmlType::TQ1_0 => quant::tq1_0::quantize_row(&vals, &mut out),
        GgmlType::Q2_0 => q2_0_ternary(&vals, scale, &mut out),
        _ => quant::tq2_0::quantize_row(&vals, &mut out),
    }
    out
}

/// Packs values in {−scale, 0, +scale} as Q2_0 blocks: `d` = scale, code = value/d + 1 at
/// bits 2(j % 4) of byte j / 4 (the layout of `quant::q2_0`).
fn q2_0_ternary(vals: &[f32], scale: f32, out: &mut [u8]) {
    use quant::q2_0::{BLOCK_BYTES, BLOCK_ELEMS};
    let d = f16::from_f32(scale);
    for (v, b) in vals
        .chunks_exact(BLOCK_ELEMS)
        .zip(out.chunks_exact_mut(BLOCK_BYTES))
    {
        b[..2].copy_from_slice(&d.to_le_bytes());
        b[2..].fill(0);
        for (j, &x) in v.iter().enumerate() {
            let code = (x / scale).round() as i32 + 1;
            b[2 + j / 4] |= (code as u8) << (2 * (j % 4));
        }
    }
}

/// Copies (and optionally truncates) tokenizer metadata; returns the vocabulary size.
fn add_vocab(w: &mut GgufWriter, vocab: &Vocab) -> Result<usize> {
    let (path, limit) = match vocab {
        Vocab::Bytes { n_vocab } => return Ok(add_byte_vocab(w, *n_vocab)),
        Vocab::File { path, limit } => (*path, *limit),
    };
    let f = GgufFile::open(path)?;
    let tokens = f.require_str_array("tokenizer.ggml.tokens")?;
    let types = f.get_i32_array("tokenizer.ggml.token_type")?;
    let n = tokens.len();
    // Keep the first normal tokens and every special one, in their original order.
    let is_normal = |i: usize| types.as_ref().is_none_or(|t| t[i] == 1);
    let n_special = (0..n).filter(|&i| !is_normal(i)).count();
    let keep_normal = limit.map_or(n, |l| l.saturating_sub(n_special));
    let mut new_id = vec![None; n];
    let mut kept = Vec::new();
    let mut seen_normal = 0;
    for (i, slot) in new_id.iter_mut().enumerate() {
        let keep = if is_normal(i) {
            seen_normal += 1;
            seen_normal <= keep_normal
        } else {
            true
        };
        if keep {
            *slot = Some(kept.len() as u32);
            kept.push(i);
        }
    }
    for (key, value) in &f.metadata {
        if !key.starts_with("tokenizer.") {
            continue;
        }
        let remapped = match (key.as_str(), value) {
            ("tokenizer.ggml.tokens", _) => Value::Array(
                ValueType::Str,
                kept.iter().map(|&i| Value::Str(tokens[i].into())).collect(),
            ),
            ("tokenizer.ggml.token_type" | "tokenizer.ggml.scores", Value::Array(t, items)) => {
                Value::Array(
                    *t,
                    kept.iter().filter_map(|&i| items.get(i).cloned()).collect(),
                )
            }
            ("tokenizer.ggml.merges", Value::Array(t, items)) => {
                let kept_text: std::collections::HashSet<&str> =
                    kept.iter().map(|&i| tokens[i]).collect();
                let ok = |m: &&Value| {
                    m.as_str().is_some_and(|s| {
                        s.split_once(' ').is_some_and(|(a, b)| {
                            kept_text.contains(a)
                                && kept_text.contains(b)
                                && kept_text.contains(format!("{a}{b}").as_str())
                        })
                    })
                };
                Value::Array(*t, items.iter().filter(ok).cloned().collect())
            }
            (k, v) if k.ends_with("_token_id") => {
                match v
                    .as_int()
                    .and_then(|i| new_id.get(usize::try_from(i).ok()?).copied().flatten())
                {
                    Some(id) => Value::U32(id),
                    None => continue,
                }
            }
            _ => value.clone(),
        };
        w.add(key, remapped);
    }
    Ok(kept.len())
}

/// 256 byte tokens (GPT-2 byte-to-unicode text), `<|begin_of_text|>`,
/// `<|end_of_text|>`, `<|eot_id|>`, then `<|reserved_N|>` control tokens up to `n_vocab`;
/// returns the vocabulary size.
fn add_byte_vocab(w: &mut GgufWriter, n_vocab: usize) -> usize {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| crate::tokenizer::byte_to_unicode(b).to_string())
        .collect();
    let mut types = vec![Value::I32(1); 256];
    for s in ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] {
        tokens.push(s.into());
        types.push(Value::I32(3));
    }
    while tokens.len() < n_vocab {
        tokens.push(format!("<|reserved_{}|>", tokens.len()));
        types.push(Value::I32(3));
    }
    w.add("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .add("tokenizer.ggml.pre", Value::Str("llama-bpe".into()))
        .add_strings("tokenizer.ggml.tokens", &tokens)
        .add(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        )
        .add(
            "tokenizer.ggml.merges",
            Value::Array(ValueType::Str, vec![]),
        )
        .add("tokenizer.ggml.bos_token_id", Value::U32(256))
        .add("tokenizer.ggml.eos_token_id", Value::U32(257))
        .add("tokenizer.ggml.eot_token_id", Value::U32(258))
        .add("tokenizer.ggml.add_bos_token", Value::Bool(true));
    tokens.len()
}

/// The tokenizer of the synthetic byte vocabulary (259 tokens: id = byte, then BOS, EOS
/// and EOT), for unit tests.
pub fn byte_tokenizer() -> crate::tokenizer::Tokenizer {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("ternion-bytes-{}-{n}.gguf", std::process::id()));
    let spec = Spec {
        arch: "bitnet-b1.58",
        shape: Shape::named("micro").unwrap(),
        weight_type: crate::quant::GgmlType::I2_S,
        vocab: Vocab::Bytes { n_vocab: 259 },
        seed: 1,
    };
    write(&spec, &path).unwrap();
    let file = crate::gguf::GgufFile::open(&path).unwrap();
    let t = crate::tokenizer::Tokenizer::from_gguf(&file, &Default::default()).unwrap();
    std::fs::remove_file(&path).unwrap();
    t
}
