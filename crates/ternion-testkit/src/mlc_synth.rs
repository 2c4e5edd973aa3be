//! Random-weight MLC `q4f16_1` Phi-3 directories for tests, each with a GGUF of the same
//! weights written independently of the loader (Q4_0 blocks built from the integer codes,
//! tokenizer keys copied from the source vocabulary), so a loaded directory can be checked
//! against it logit for logit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::gguf::{GgufFile, GgufWriter};
use crate::mlc::config::{Phi3Config, CONFIG_FILE, QUANTIZATION};
use crate::mlc::error::MlcError;
use crate::mlc::q4f16::{GROUP, ZERO_CODE};
use crate::mlc::spm::{self, piece_type, Piece};
use crate::mlc::tokenizer::{HF_CONFIG_FILE, HF_FILE, PAD_SCORE, SPM_FILE};
use crate::quant::GgmlType;
use crate::shared::shared_path;
use crate::synth::Shape;
use crate::{Error, Result};

/// What [`write_phi3`] writes.
pub struct Phi3Spec<'a> {
    /// Dimensions.
    pub shape: Shape,
    /// A GGUF with a SentencePiece (`llama`) vocabulary, such as `ggml-vocab-phi-3.gguf`;
    /// its size is the model's vocabulary size.
    pub vocab: &'a Path,
    /// RNG seed.
    pub seed: u64,
    /// Put one code 15 into `blk.0.ffn_down` (so it converts to Q8_0, not Q4_0).
    pub code_15: bool,
    /// Largest shard in bytes (small values spread the tensors over many shards).
    pub shard_bytes: usize,
}

/// One random quantized weight: codes in element order and one scale per group.
struct QWeight {
    codes: Vec<u8>,
    scales: Vec<f16>,
}

impl QWeight {
    fn random(rng: &mut StdRng, n_in: usize, n_out: usize, code_15: bool) -> QWeight {
        let mut codes: Vec<u8> = (0..n_in * n_out)
            .map(|_| rng.random_range(0..=2 * ZERO_CODE))
            .collect();
        if code_15 {
            let at = rng.random_range(0..codes.len());
            codes[at] = 15;
        }
        let base = 1.0 / (4.0 * (n_in as f32).sqrt());
        let scales = (0..codes.len() / GROUP)
            .map(|_| f16::from_f32(base * rng.random_range(0.5f32..1.5)))
            .collect();
        QWeight { codes, scales }
    }

    /// MLC's `q_weight` bytes: eight codes per little-endian uint32, element `k` at bit `4k`.
    fn mlc_q_weight(&self) -> Vec<u8> {
        self.codes
            .chunks_exact(8)
            .flat_map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u32, |w, (k, &q)| w | u32::from(q) << (4 * k))
                    .to_le_bytes()
            })
            .collect()
    }

    fn mlc_q_scale(&self) -> Vec<u8> {
        self.scales.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    /// GGUF blocks: Q4_0 (`d` = scale, nibble = code + 1, element j and j + 16 share byte
    /// j) or, with a code 15, Q8_0 (`d` = scale, int8 = code − 7).
    fn gguf(&self) -> (GgmlType, Vec<u8>) {
        let q8 = self.codes.contains(&15);
        let mut out = Vec::new();
        for (c, s) in self.codes.chunks_exact(GROUP).zip(&self.scales) {
            out.extend_from_slice(&s.to_le_bytes());
            if q8 {
                out.extend(c.iter().map(|&q| (i16::from(q) - 7) as i8 as u8));
            } else {
                out.extend((0..GROUP / 2).map(|j| (c[j] + 1) | (c[j + GROUP / 2] + 1) << 4));
            }
        }
        (if q8 { GgmlType::Q8_0 } else { GgmlType::Q4_0 }, out)
    }
}

/// A record of the index being built and its bytes.
struct Entry {
    name: String,
    shape: Vec<u64>,
    dtype: &'static str,
    bytes: Vec<u8>,
}

/// Writes a random `q4f16_1` Phi-3 MLC directory to `mlc_dir` (created if needed) and the
/// same model as a GGUF to `gguf`. The directory's `tokenizer.json` carries only what the
/// loader reads from it (`added_tokens`), not a full Hugging Face tokenizer.
pub fn write_phi3(spec: &Phi3Spec, mlc_dir: &Path, gguf: &Path) -> Result<()> {
    let vocab = GgufFile::open(spec.vocab)?;
    let tokens = vocab.require_str_array("tokenizer.ggml.tokens")?;
    let n_vocab = tokens.len();
    let sh = &spec.shape;
    let cfg = Phi3Config {
        n_embd: sh.n_embd,
        n_ff: sh.n_ff,
        n_layer: sh.n_layer,
        n_head: sh.n_head,
        n_head_kv: sh.n_head_kv,
        n_vocab,
        n_ctx: 4096,
        n_rot: sh.n_embd / sh.n_head,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
        sliding_window: 2047,
        tied: false,
        bos: vocab.get_u32("tokenizer.ggml.bos_token_id")?,
        eos: vocab.get_u32("tokenizer.ggml.eos_token_id")?,
        pad: vocab.get_u32("tokenizer.ggml.padding_token_id")?,
    };
    if !sh.n_embd.is_multiple_of(GROUP)
        || !sh.n_ff.is_multiple_of(GROUP)
        || sh.n_head == 0
        || !sh.n_embd.is_multiple_of(sh.n_head)
    {
        return Err(Error::Request(format!(
            "mlc synth: widths {} and {} must be multiples of {GROUP} and of the head count",
            sh.n_embd, sh.n_ff
        )));
    }

    let mut rng = StdRng::seed_from_u64(spec.seed);
    let mut entries = Vec::new();
    let mut gguf_tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    let d = cfg.n_embd;
    for m in crate::mlc::tensor_map(&cfg) {
        let Some((n_in, n_out)) = m.linear else {
            let vals: Vec<f16> = (0..d)
                .map(|_| f16::from_f32(rng.random_range(0.5f32..1.5)))
                .collect();
            entries.push(Entry {
                name: m.mlc,
                shape: vec![d as u64],
                dtype: "float16",
                bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            });
            let f32s = vals.iter().flat_map(|v| v.to_f32().to_le_bytes()).collect();
            gguf_tensors.push((m.gguf, GgmlType::F32, vec![d as u64], f32s));
            continue;
        };
        let code_15 = spec.code_15 && m.gguf == "blk.0.ffn_down.weight";
        let w = QWeight::random(&mut rng, n_in, n_out, code_15);
        let (n_in64, n_out64) = (n_in as u64, n_out as u64);
        entries.push(Entry {
            name: format!("{}.q_weight", m.mlc),
            shape: vec![n_out64, n_in64 / 8],
            dtype: "uint32",
            bytes: w.mlc_q_weight(),
        });
        entries.push(Entry {
            name: format!("{}.q_scale", m.mlc),
            shape: vec![n_out64, n_in64 / GROUP as u64],
            dtype: "float16",
            bytes: w.mlc_q_scale(),
        });
        let (ty, bytes) = w.gguf();
        gguf_tensors.push((m.gguf, ty, vec![n_in64, n_out64], bytes));
    }

    std::fs::create_dir_all(mlc_dir).map_err(|e| Error::io(mlc_dir, e))?;
    write_shards(mlc_dir, entries, spec.shard_bytes)?;
    write_chat_config(mlc_dir, &cfg)?;
    write_tokenizer(mlc_dir, &vocab, &tokens)?;

    let mut w = GgufWriter::new();
    cfg.add_metadata(&mut w, "ternion-synth-mlc-phi3");
    for (k, v) in &vocab.metadata {
        if k.starts_with("tokenizer.") {
            w.add(k, v.clone());
        }
    }
    for (name, ty, shape, _) in &gguf_tensors {
        w.declare(name, *ty, shape)?;
    }
    let mut data: HashMap<String, Vec<u8>> = gguf_tensors
        .into_iter()
        .map(|(n, _, _, b)| (n, b))
        .collect();
    w.write(gguf, |_, name| {
        data.remove(name)
            .ok_or_else(|| Error::Model(format!("mlc synth: no data for '{name}'")))
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|error| MlcError::InvalidJson {
        file: path.display().to_string(),
        error,
    })?;
    write_file(path, text.as_bytes())
}

/// `params_shard_{i}.bin` files of at most `cap` bytes (a larger tensor gets its own) and
/// `ndarray-cache.json`.
fn write_shards(dir: &Path, entries: Vec<Entry>, cap: usize) -> Result<()> {
    let mut shards: Vec<(Vec<u8>, Vec<serde_json::Value>)> = vec![(Vec::new(), Vec::new())];
    for e in entries {
        let cur = shards.last_mut().expect("one shard");
        if !cur.0.is_empty() && cur.0.len() + e.bytes.len() > cap {
            shards.push((Vec::new(), Vec::new()));
        }
        let cur = shards.last_mut().expect("one shard");
        cur.1.push(json!({
            "name": e.name,
            "shape": e.shape,
            "dtype": e.dtype,
            // What MLC's converter writes on every record (it changes only float32 ones).
            "format": "f32-to-bf16",
            "nbytes": e.bytes.len(),
            "byteOffset": cur.0.len(),
        }));
        cur.0.extend_from_slice(&e.bytes);
    }
    let mut records = Vec::new();
    for (i, (bytes, recs)) in shards.into_iter().enumerate() {
        let file = format!("params_shard_{i}.bin");
        write_file(&dir.join(&file), &bytes)?;
        records.push(json!({
            "dataPath": file,
            "format": "raw-shard",
            "nbytes": bytes.len(),
            "records": recs,
        }));
    }
    write_json(
        &dir.join(crate::mlc::cache::INDEX_FILES[1]),
        &json!({ "metadata": { "ParamSize": records.len() }, "records": records }),
    )
}

fn write_chat_config(dir: &Path, cfg: &Phi3Config) -> Result<()> {
    write_json(
        &dir.join(CONFIG_FILE),
        &json!({
            "version": "0.1.0",
            "model_type": "phi3",
            "quantization": QUANTIZATION,
            "model_config": {
                "model_type": "phi3",
                "hidden_size": cfg.n_embd,
                "vocab_size": cfg.n_vocab,
                "num_hidden_layers": cfg.n_layer,
                "num_attention_heads": cfg.n_head,
                "intermediate_size": cfg.n_ff,
                "rms_norm_eps": cfg.rms_eps,
                "num_key_value_heads": cfg.n_head_kv,
                "max_position_embeddings": cfg.n_ctx,
                "position_embedding_base": cfg.rope_base,
                "rope_scaling": null,
                "context_window_size": cfg.n_ctx,
                "prefill_chunk_size": 2048,
                "head_dim": cfg.n_embd / cfg.n_head,
                "tensor_parallel_shards": 1,
                "tie_word_embeddings": false,
                "partial_rotary_factor": 1.0
            },
            "vocab_size": cfg.n_vocab,
            "context_window_size": cfg.n_ctx,
            "sliding_window_size": cfg.sliding_window,
            "prefill_chunk_size": 2048,
            "bos_token_id": cfg.bos,
            "eos_token_id": cfg.eos,
            "pad_token_id": cfg.pad,
            "tokenizer_files": [SPM_FILE, HF_FILE, HF_CONFIG_FILE]
        }),
    )
}

/// `tokenizer.model` (the SentencePiece part of the vocabulary), `tokenizer.json` (its
/// added tokens) and `tokenizer_config.json`, such that llama.cpp's Phi-3 conversion rules
/// give back `vocab`'s tokens, scores and types.
fn write_tokenizer(dir: &Path, vocab: &GgufFile, tokens: &[&str]) -> Result<()> {
    let path = vocab.path().display().to_string();
    let bad = |m: String| Error::Model(format!("{path}: {m}"));
    let n = tokens.len();
    let scores = vocab
        .get_f32_array("tokenizer.ggml.scores")?
        .filter(|s| s.len() == n)
        .ok_or_else(|| bad("scores missing or not one per token".into()))?;
    let types = vocab
        .get_i32_array("tokenizer.ggml.token_type")?
        .filter(|t| t.len() == n)
        .ok_or_else(|| bad("token types missing or not one per token".into()))?;
    let unk = vocab.get_u32("tokenizer.ggml.unknown_token_id")?;
    let added = |t: i32| t == piece_type::CONTROL || t == piece_type::USER_DEFINED;
    let n_spm = 1 + types
        .iter()
        .rposition(|&t| t == piece_type::NORMAL || t == piece_type::BYTE)
        .ok_or_else(|| bad("no normal or byte tokens".into()))?;
    let pieces: Vec<Piece> = (0..n_spm)
        .map(|i| Piece {
            piece: tokens[i].to_string(),
            score: if added(types[i]) { 0.0 } else { scores[i] },
            kind: if unk == Some(i as u32) {
                piece_type::UNKNOWN
            } else if added(types[i]) {
                piece_type::CONTROL
            } else {
                types[i]
            },
        })
        .collect();
    for i in n_spm..n {
        let pad = types[i] == piece_type::UNKNOWN
            && tokens[i] == format!("[PAD{i}]")
            && scores[i] == PAD_SCORE;
        if !added(types[i]) && !pad {
            return Err(bad(format!(
                "token {i} '{}' is neither an added token nor padding",
                tokens[i]
            )));
        }
    }
    write_file(&dir.join(SPM_FILE), &spm::encode(&pieces))?;
    let added_tokens: Vec<serde_json::Value> = (0..n)
        .filter(|&i| added(types[i]))
        .map(|i| {
            json!({
                "id": i, "content": tokens[i], "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": types[i] == piece_type::CONTROL
            })
        })
        .collect();
    write_json(
        &dir.join(HF_FILE),
        &json!({ "version": "1.0", "added_tokens": added_tokens,
                 "model": { "type": "BPE", "byte_fallback": true } }),
    )?;
    let text = |key: &str| -> Result<Option<&str>> {
        Ok(vocab
            .get_u32(key)?
            .and_then(|id| tokens.get(id as usize).copied()))
    };
    write_json(
        &dir.join(HF_CONFIG_FILE),
        &json!({
            "add_bos_token": vocab.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(true),
            "add_eos_token": vocab.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            "bos_token": text("tokenizer.ggml.bos_token_id")?,
            "eos_token": text("tokenizer.ggml.eos_token_id")?,
            "unk_token": text("tokenizer.ggml.unknown_token_id")?,
            "chat_template": vocab.get_str("tokenizer.chat_template")?,
        }),
    )
}

/// The Phi-3 vocabulary of the shared test data.
pub fn phi3_vocab() -> PathBuf {
    shared_path("vocab/ggml-vocab-phi-3.gguf")
}

/// A fresh directory under the system temp folder.
pub fn scratch(tag: &str) -> PathBuf {
    let dir = crate::scratch::dir("ternion-mlc").join(tag);
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A random MLC Phi-3 directory (`dir/mlc`) and the same model as `dir/ref.gguf`.
pub fn fixture(tag: &str, code_15: bool) -> (PathBuf, PathBuf) {
    let dir = scratch(tag);
    let (mlc, gguf) = (dir.join("mlc"), dir.join("ref.gguf"));
    let spec = Phi3Spec {
        shape: Shape {
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
        },
        vocab: &phi3_vocab(),
        seed: 17,
        code_15,
        shard_bytes: 64 << 10,
    };
    write_phi3(&spec, &mlc, &gguf).unwrap();
    (mlc, gguf)
}
