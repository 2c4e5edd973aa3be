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
pub mod error;
pub mod q4f16;
pub mod spm;
pub mod tokenizer;

#[cfg(test)]
mod tests;

use std::path::Path;

use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::GgmlType;
use crate::Result;
use cache::{Cache, Index, Stored};
use config::Phi3Config;
use error::MlcError;
use tokenizer::TokenizerFiles;

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
#[derive(Clone, Debug)]
enum Source {
    /// `<prefix>.q_weight` / `<prefix>.q_scale`, to Q4_0 (or Q8_0 when a code is 15).
    Quant,
    /// A float vector, to F32.
    Norm(Stored),
}

/// How one GGUF tensor is made from MLC records: which records to read, and the repack.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// GGUF tensor name.
    pub name: String,
    /// GGUF type (Q4_0, Q8_0 or F32).
    pub ty: GgmlType,
    /// GGUF shape, innermost dimension first.
    pub shape: Vec<u64>,
    /// The MLC records it is made from, in the order [`Recipe::convert`] takes them.
    pub inputs: Vec<String>,
    source: Source,
}

/// An MLC model converted without reading its shards: the GGUF metadata and tensor table,
/// the parsed index, and one [`Recipe`] per GGUF tensor in data order. Loaders that stream
/// (the browser's) fetch each recipe's records and [`Recipe::convert`] them;
/// [`load_dir`] does the same from mapped files.
pub struct Layout {
    /// The GGUF being built (metadata and tensor table declared; no data).
    pub writer: GgufWriter,
    /// The checked index.
    pub index: Index,
    /// One recipe per GGUF tensor, in data order.
    pub recipes: Vec<Recipe>,
}

impl Layout {
    /// Builds the layout of a directory named `name` from its files' bytes. `q8(prefix)`
    /// says whether the weight `prefix` holds a code 15 (so converts to Q8_0); a loader
    /// that cannot look at the data yet answers `false`, and a code 15 then fails in
    /// [`Recipe::convert`].
    pub fn new(
        name: &str,
        cfg: &Phi3Config,
        index: Index,
        tokenizer: &TokenizerFiles,
        q8: impl FnMut(&str) -> Result<bool>,
    ) -> Result<Layout> {
        let recipes = plan(cfg, &index, q8)?;
        let mut writer = GgufWriter::new();
        let short = name
            .rsplit(['/', '\\'])
            .find(|s| !s.is_empty())
            .unwrap_or("mlc");
        cfg.add_metadata(&mut writer, short);
        tokenizer::add_tokenizer(&mut writer, tokenizer, name, cfg)?;
        for r in &recipes {
            writer.declare(&r.name, r.ty, &r.shape)?;
        }
        Ok(Layout {
            writer,
            index,
            recipes,
        })
    }
}

/// Converts the MLC directory `dir` into an in-memory GGUF (`phi3` metadata, tokenizer,
/// Q4_0 weights and F32 norms) whose path is `dir`.
pub fn load_dir(dir: &Path) -> Result<GgufFile> {
    let cfg = Phi3Config::read(dir)?;
    let cache = Cache::open(dir)?;
    let tokenizer = TokenizerFiles::read(dir)?;
    let layout = Layout::new(
        &dir.display().to_string(),
        &cfg,
        cache.index().clone(),
        &tokenizer,
        |prefix| {
            Ok(q4f16::has_code_15(
                cache.get(&format!("{prefix}.q_weight"))?.bytes,
            ))
        },
    )?;
    let bytes = layout.writer.to_bytes(dir, |i, _| {
        let r = &layout.recipes[i];
        let parts = r
            .inputs
            .iter()
            .map(|n| Ok(cache.get(n)?.bytes))
            .collect::<Result<Vec<_>>>()?;
        r.convert(&parts)
    })?;
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
fn plan(
    cfg: &Phi3Config,
    index: &Index,
    mut q8: impl FnMut(&str) -> Result<bool>,
) -> Result<Vec<Recipe>> {
    let d = cfg.n_embd;
    tensor_map(cfg)
        .into_iter()
        .map(|m| match m.linear {
            Some((n_in, n_out)) => {
                check_quant(index, &m.mlc, n_in, n_out)?;
                Ok(Recipe {
                    name: m.gguf,
                    ty: if q8(&m.mlc)? {
                        GgmlType::Q8_0
                    } else {
                        GgmlType::Q4_0
                    },
                    shape: vec![n_in as u64, n_out as u64],
                    inputs: vec![format!("{}.q_weight", m.mlc), format!("{}.q_scale", m.mlc)],
                    source: Source::Quant,
                })
            }
            None => {
                let t = index.record(&m.mlc)?;
                if t.shape != [d as u64] || t.stored == Stored::U32 {
                    return Err(MlcError::NormShape {
                        tensor: m.mlc,
                        width: d,
                        stored: t.stored,
                        shape: t.shape.clone(),
                    }
                    .into());
                }
                Ok(Recipe {
                    name: m.gguf,
                    ty: GgmlType::F32,
                    shape: vec![d as u64],
                    inputs: vec![m.mlc],
                    source: Source::Norm(t.stored),
                })
            }
        })
        .collect()
}

/// Checks the `q_weight`/`q_scale` pair of an `n_out × n_in` weight.
fn check_quant(index: &Index, prefix: &str, n_in: usize, n_out: usize) -> Result<()> {
    let w = index.record(&format!("{prefix}.q_weight"))?;
    let s = index.record(&format!("{prefix}.q_scale"))?;
    let (n_in, n_out) = (n_in as u64, n_out as u64);
    let g = q4f16::GROUP as u64;
    let ok = n_in % g == 0
        && w.stored == Stored::U32
        && w.shape == [n_out, n_in / 8]
        && s.stored == Stored::F16
        && s.shape == [n_out, n_in / g];
    if !ok {
        return Err(MlcError::QuantShape {
            prefix: prefix.to_string(),
            n_in,
            n_out,
            group: g,
            weight: (w.stored, w.shape.clone()),
            scale: (s.stored, s.shape.clone()),
        }
        .into());
    }
    Ok(())
}

impl Recipe {
    /// The GGUF bytes of this tensor from its [`Recipe::inputs`]' bytes, in that order.
    pub fn convert(&self, parts: &[&[u8]]) -> Result<Vec<u8>> {
        match (&self.source, parts) {
            (Source::Quant, [w, s]) => {
                if q4f16::groups(w, s).is_none() {
                    return Err(MlcError::QuantBytes {
                        tensor: self.name.clone(),
                        weight_bytes: w.len(),
                        scale_bytes: s.len(),
                    }
                    .into());
                }
                match self.ty {
                    GgmlType::Q8_0 => Ok(q4f16::to_q8_0(w, s)),
                    _ if q4f16::has_code_15(w) => Err(MlcError::Code15 {
                        tensor: self.inputs[0].clone(),
                    }
                    .into()),
                    _ => Ok(q4f16::to_q4_0(w, s)),
                }
            }
            (Source::Norm(stored), [b]) => {
                let n = stored.elem_bytes() as usize;
                Ok(b.chunks_exact(n)
                    .flat_map(|b| float_value(*stored, b).to_le_bytes())
                    .collect())
            }
            _ => Err(MlcError::InputCount {
                tensor: self.name.clone(),
                given: parts.len(),
                expected: self.inputs.len(),
            }
            .into()),
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
