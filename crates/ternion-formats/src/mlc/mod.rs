//! MLC weight directories (`q4f16_1`, the format WebLLM and MLC LLM ship Phi-3-mini in),
//! converted at load into an in-memory GGUF that the `phi3` definition runs unchanged.
//!
//! A directory holds `mlc-chat-config.json` ([`config`]), `ndarray-cache.json` (newer TVM:
//! `tensor-cache.json`) with `params_shard_*.bin` ([`cache`]), and the tokenizer files
//! ([`tokenizer`]). Facts the conversion relies on, with their sources:
//!
//! - Index (apache/tvm `python/tvm/contrib/tvmjs.py`, `dump_tensor_cache`): `{"metadata",
//!   "records": [shard]}`; a shard is `{dataPath, format: "raw-shard", nbytes, records,
//!   md5sum}`; a record is `{name, shape, dtype, format: "raw" | "f32-to-bf16", nbytes,
//!   byteOffset}`, its bytes at `byteOffset` in the shard; `f32-to-bf16` stores a float32
//!   tensor as bfloat16 and leaves other dtypes raw. MLC dumps with `f32-to-bf16`, so its
//!   uint32 and float16 records carry that format too (a real Phi-3 record quoted in
//!   mlc-ai/mlc-llm issue "Cannot find parameter in cache: vision_embed_tokens...":
//!   `"dtype": "uint32", "format": "f32-to-bf16"`). Data is little-endian.
//! - `q4f16_1` (mlc-llm `python/mlc_llm/quantization/quantization.py`,
//!   `group_quantization.py`, `utils.py`): group size 32, int4 codes packed 8 per uint32
//!   (element `k` of a word in bits `4k`), float16 scale = max|w|/7 per group, code =
//!   clamp(round(w/scale) + 7, 0, 14), value = (code − 7)·scale; layout "NK": `q_weight`
//!   `[out, in/8]`, `q_scale` `[out, in/32]`; embedding and LM head are quantized too.
//!   MLC's kernels form (code − 7)·scale in float16; this loader keeps the exact f32
//!   product (see [`q4f16`] for the repack into Q4_0).
//! - Phi-3 parameter names (mlc-llm `python/mlc_llm/model/phi3/phi3_model.py`,
//!   `phi3_loader.py`): `transformer.embd`, `transformer.h.{i}.ln`,
//!   `transformer.h.{i}.mixer.qkv_proj` (rows Q | K | V), `mixer.out_proj`,
//!   `mlp.gate_up_proj` (rows gate | up, `up · silu(gate)`), `mlp.down_proj`,
//!   `transformer.h.{i}.post_attention_layernorm`, `transformer.norm`, `lm_head` (absent
//!   when `tie_word_embeddings`); norms are float16. These map one to one onto llama.cpp's
//!   `token_embd`, `blk.{i}.attn_norm`, `attn_qkv`, `attn_output`, `ffn_up`, `ffn_down`,
//!   `ffn_norm`, `output_norm`, `output`; Q/K need no permutation (both use NeoX RoPE).
//!
//! Only `model_type: "phi3"` with `quantization: "q4f16_1"` and no `rope_scaling` is
//! converted; anything else is an [`Error::Mlc`].

pub mod cache;
pub mod config;
pub mod q4f16;
pub mod spm;
pub mod tokenizer;

#[cfg(test)]
mod tests;

use std::path::Path;

use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::GgmlType;
use crate::{Error, Result};
use cache::{Cache, Stored};
use config::Phi3Config;

/// Whether `path` is a directory with an MLC tensor index.
pub fn is_mlc_dir(path: &Path) -> bool {
    path.is_dir() && cache::index_path(path).is_some()
}

/// Opens a model: an MLC directory ([`load_dir`]) or a GGUF file.
pub fn open(path: &Path) -> Result<GgufFile> {
    if is_mlc_dir(path) {
        load_dir(path)
    } else {
        GgufFile::open(path)
    }
}

/// Where a GGUF tensor's data comes from.
enum Source {
    /// `<prefix>.q_weight` / `<prefix>.q_scale`, to Q4_0 (or Q8_0 when a code is 15).
    Quant(String),
    /// A float vector, to F32.
    Norm(String),
}

/// One GGUF tensor to produce.
struct Planned {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    source: Source,
}

/// Converts the MLC directory `dir` into an in-memory GGUF (`phi3` metadata, tokenizer,
/// Q4_0 weights and F32 norms) whose path is `dir`.
pub fn load_dir(dir: &Path) -> Result<GgufFile> {
    let cfg = Phi3Config::read(dir)?;
    let cache = Cache::open(dir)?;
    let plan = plan(&cfg, &cache)?;
    let mut w = GgufWriter::new();
    let name = dir
        .file_name()
        .map_or("mlc".into(), |n| n.to_string_lossy().into_owned());
    cfg.add_metadata(&mut w, &name);
    tokenizer::add_tokenizer(&mut w, dir, &cfg)?;
    for p in &plan {
        w.declare(&p.name, p.ty, &p.shape)?;
    }
    let bytes = w.to_bytes(dir, |i, _| convert(&cache, &plan[i]))?;
    GgufFile::from_bytes(dir, bytes)
}

/// One MLC parameter and the GGUF tensor it becomes.
pub struct Mapped {
    /// MLC name: a prefix of `.q_weight`/`.q_scale` for a linear, the full name for a norm.
    pub mlc: String,
    /// GGUF tensor name.
    pub gguf: String,
    /// `(n_in, n_out)` of a linear; `None` for a norm of width `n_embd`.
    pub linear: Option<(usize, usize)>,
}

/// Every parameter of a Phi-3 model of `cfg`, MLC name to llama.cpp name.
pub fn tensor_map(cfg: &Phi3Config) -> Vec<Mapped> {
    let (d, q, kv, ff, v) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff, cfg.n_vocab);
    let mut out = Vec::new();
    let mut add = |mlc: String, gguf: String, linear| out.push(Mapped { mlc, gguf, linear });
    add(
        "transformer.embd".into(),
        "token_embd.weight".into(),
        Some((d, v)),
    );
    for l in 0..cfg.n_layer {
        let m = |s: &str| format!("transformer.h.{l}.{s}");
        let g = |s: &str| format!("blk.{l}.{s}.weight");
        add(m("ln.weight"), g("attn_norm"), None);
        add(m("mixer.qkv_proj"), g("attn_qkv"), Some((d, q + 2 * kv)));
        add(m("mixer.out_proj"), g("attn_output"), Some((q, d)));
        add(m("post_attention_layernorm.weight"), g("ffn_norm"), None);
        add(m("mlp.gate_up_proj"), g("ffn_up"), Some((d, 2 * ff)));
        add(m("mlp.down_proj"), g("ffn_down"), Some((ff, d)));
    }
    add(
        "transformer.norm.weight".into(),
        "output_norm.weight".into(),
        None,
    );
    if !cfg.tied {
        add("lm_head".into(), "output.weight".into(), Some((d, v)));
    }
    out
}

/// The GGUF tensors of `cfg`, each checked against the index.
fn plan(cfg: &Phi3Config, cache: &Cache) -> Result<Vec<Planned>> {
    let d = cfg.n_embd;
    tensor_map(cfg)
        .into_iter()
        .map(|m| match m.linear {
            Some((n_in, n_out)) => Ok(Planned {
                name: m.gguf,
                ty: quant_type(cache, &m.mlc, n_in, n_out)?,
                shape: vec![n_in as u64, n_out as u64],
                source: Source::Quant(m.mlc),
            }),
            None => {
                let t = cache.get(&m.mlc)?;
                if t.shape != [d as u64] || t.stored == Stored::U32 {
                    return Err(Error::Mlc(format!(
                        "tensor '{}': expected a float vector of [{d}], found {:?} {:?}",
                        m.mlc, t.stored, t.shape
                    )));
                }
                Ok(Planned {
                    name: m.gguf,
                    ty: GgmlType::F32,
                    shape: vec![d as u64],
                    source: Source::Norm(m.mlc),
                })
            }
        })
        .collect()
}

/// Checks the `q_weight`/`q_scale` pair of an `n_out × n_in` weight; Q4_0 unless a code is
/// 15.
fn quant_type(cache: &Cache, prefix: &str, n_in: usize, n_out: usize) -> Result<GgmlType> {
    let (w, s) = quant_pair(cache, prefix)?;
    let (n_in, n_out) = (n_in as u64, n_out as u64);
    let g = q4f16::GROUP as u64;
    let ok = n_in % g == 0
        && w.stored == Stored::U32
        && w.shape == [n_out, n_in / 8]
        && s.stored == Stored::F16
        && s.shape == [n_out, n_in / g];
    if !ok {
        return Err(Error::Mlc(format!(
            "'{prefix}': expected q_weight uint32 [{n_out}, {}] and q_scale float16 [{n_out}, {}] \
             for a {n_out} × {n_in} weight, found {:?} {:?} and {:?} {:?}",
            n_in / 8,
            n_in / g,
            w.stored,
            w.shape,
            s.stored,
            s.shape
        )));
    }
    Ok(if q4f16::has_code_15(w.bytes) {
        GgmlType::Q8_0
    } else {
        GgmlType::Q4_0
    })
}

fn quant_pair<'a>(
    cache: &'a Cache,
    prefix: &str,
) -> Result<(cache::Tensor<'a>, cache::Tensor<'a>)> {
    Ok((
        cache.get(&format!("{prefix}.q_weight"))?,
        cache.get(&format!("{prefix}.q_scale"))?,
    ))
}

/// The GGUF bytes of one planned tensor.
fn convert(cache: &Cache, p: &Planned) -> Result<Vec<u8>> {
    match &p.source {
        Source::Quant(prefix) => {
            let (w, s) = quant_pair(cache, prefix)?;
            Ok(match p.ty {
                GgmlType::Q8_0 => q4f16::to_q8_0(w.bytes, s.bytes),
                _ => q4f16::to_q4_0(w.bytes, s.bytes),
            })
        }
        Source::Norm(name) => {
            let t = cache.get(name)?;
            let n = t.stored.elem_bytes() as usize;
            Ok(t.bytes
                .chunks_exact(n)
                .flat_map(|b| float_value(t.stored, b).to_le_bytes())
                .collect())
        }
    }
}

/// One stored float element as f32 (exact for every float storage).
fn float_value(stored: Stored, b: &[u8]) -> f32 {
    match stored {
        Stored::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
        Stored::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        Stored::F32 | Stored::U32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}
