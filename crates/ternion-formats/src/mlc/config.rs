//! `mlc-chat-config.json` → the hyper-parameters of a Phi-3 model, written as the GGUF
//! `phi3.*` keys llama.cpp uses.

use std::path::Path;

use serde::Deserialize;

use super::cache::{parse_json, read_small, MAX_INDEX_BYTES};
use super::error::{ConfigProblem, MlcError};
use crate::gguf::{GgufWriter, Value};
use crate::{Error, Result};

/// The chat configuration file of an MLC directory.
pub const CONFIG_FILE: &str = "mlc-chat-config.json";
/// The only quantization this loader converts.
pub const QUANTIZATION: &str = "q4f16_1";
/// Largest dimension accepted from a configuration.
const MAX_DIM: u32 = 1 << 20;

#[derive(Deserialize)]
struct ChatConfigJson {
    model_type: String,
    quantization: String,
    model_config: ModelConfigJson,
    #[serde(default)]
    context_window_size: Option<i64>,
    #[serde(default)]
    sliding_window_size: Option<i64>,
    #[serde(default)]
    bos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pad_token_id: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ModelConfigJson {
    hidden_size: u32,
    intermediate_size: u32,
    num_hidden_layers: u32,
    num_attention_heads: u32,
    #[serde(default)]
    num_key_value_heads: Option<u32>,
    rms_norm_eps: f32,
    vocab_size: u32,
    #[serde(default)]
    max_position_embeddings: Option<u32>,
    #[serde(default)]
    position_embedding_base: Option<f32>,
    #[serde(default)]
    rope_theta: Option<f32>,
    #[serde(default)]
    head_dim: Option<u32>,
    #[serde(default)]
    partial_rotary_factor: Option<f32>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    sliding_window: Option<u32>,
}

/// Validated Phi-3 hyper-parameters and special-token ids of an MLC directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Phi3Config {
    /// Model width.
    pub n_embd: usize,
    /// FFN width (each half of `gate_up_proj`).
    pub n_ff: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Vocabulary size (embedding rows).
    pub n_vocab: usize,
    /// Training context (`max_position_embeddings`, else `context_window_size`).
    pub n_ctx: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Sliding-window length (the context when the configuration gives none).
    pub sliding_window: usize,
    /// Whether the LM head is the embedding (no `lm_head` tensors).
    pub tied: bool,
    /// BOS id, when given.
    pub bos: Option<u32>,
    /// EOS id (the first, when a list is given).
    pub eos: Option<u32>,
    /// Padding id, when given.
    pub pad: Option<u32>,
}

impl Phi3Config {
    /// Reads and checks `dir/mlc-chat-config.json`.
    pub fn read(dir: &Path) -> Result<Phi3Config> {
        let path = dir.join(CONFIG_FILE);
        let text = read_small(&path, MAX_INDEX_BYTES)?;
        Phi3Config::parse(&text, &path.display().to_string())
    }

    /// Parses and checks the bytes of an `mlc-chat-config.json`; `label` names the file in
    /// errors.
    pub fn parse(text: &[u8], label: &str) -> Result<Phi3Config> {
        let j: ChatConfigJson = parse_json(text, label)?;
        let bad = |problem: ConfigProblem| -> Error {
            MlcError::Config {
                file: label.to_string(),
                problem,
            }
            .into()
        };
        let only = |key: &str, found: &str, supported: &str| {
            let what = format!("MLC directory: {label}: {key}");
            Error::unsupported(what, found, [supported], "")
        };
        if j.model_type != "phi3" {
            return Err(only("model_type", &j.model_type, "phi3"));
        }
        if j.quantization != QUANTIZATION {
            return Err(only("quantization", &j.quantization, QUANTIZATION));
        }
        let m = &j.model_config;
        if m.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(bad(ConfigProblem::RopeScaling));
        }
        let dim = |key: &'static str, value: u32| -> Result<usize> {
            if value == 0 || value > MAX_DIM {
                return Err(bad(ConfigProblem::OutOfRange {
                    key,
                    value,
                    max: MAX_DIM,
                }));
            }
            Ok(value as usize)
        };
        let n_embd = dim("hidden_size", m.hidden_size)?;
        let n_head = dim("num_attention_heads", m.num_attention_heads)?;
        let n_head_kv = dim(
            "num_key_value_heads",
            m.num_key_value_heads
                .filter(|&v| v != 0)
                .unwrap_or(m.num_attention_heads),
        )?;
        if n_embd % n_head != 0 || n_head % n_head_kv != 0 {
            return Err(bad(ConfigProblem::Heads {
                n_embd,
                n_head,
                n_head_kv,
            }));
        }
        let head_dim = n_embd / n_head;
        if m.head_dim.is_some_and(|h| h != 0 && h as usize != head_dim) {
            return Err(bad(ConfigProblem::HeadDim {
                found: m.head_dim,
                head_dim,
            }));
        }
        let factor = m.partial_rotary_factor.unwrap_or(1.0);
        let n_rot = (head_dim as f32 * factor) as usize;
        if !(factor > 0.0 && factor <= 1.0) || n_rot == 0 || !n_rot.is_multiple_of(2) {
            return Err(bad(ConfigProblem::RotaryFactor {
                factor,
                n_rot,
                head_dim,
            }));
        }
        let ctx = m
            .max_position_embeddings
            .or_else(|| j.context_window_size.and_then(|c| u32::try_from(c).ok()))
            .unwrap_or(0);
        let n_ctx = dim("max_position_embeddings (or context_window_size)", ctx)?;
        let window = m
            .sliding_window
            .or_else(|| j.sliding_window_size.and_then(|c| u32::try_from(c).ok()))
            .filter(|&w| w > 0)
            .map_or(Ok(n_ctx), |w| dim("sliding_window", w))?;
        let rope_base = m
            .position_embedding_base
            .or(m.rope_theta)
            .filter(|&b| b != 0.0)
            .unwrap_or(10_000.0);
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad(ConfigProblem::RopeBase { base: rope_base }));
        }
        if !(m.rms_norm_eps.is_finite() && m.rms_norm_eps > 0.0) {
            return Err(bad(ConfigProblem::RmsEps {
                eps: m.rms_norm_eps,
            }));
        }
        let id = |name: &str, v: &Option<serde_json::Value>| -> Result<Option<u32>> {
            let first = match v {
                Some(serde_json::Value::Array(items)) => items.first(),
                other => other.as_ref(),
            };
            match first {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        bad(ConfigProblem::TokenId {
                            key: name.to_string(),
                            value: x.to_string(),
                        })
                    }),
            }
        };
        Ok(Phi3Config {
            n_embd,
            n_ff: dim("intermediate_size", m.intermediate_size)?,
            n_layer: dim("num_hidden_layers", m.num_hidden_layers)?,
            n_head,
            n_head_kv,
            n_vocab: dim("vocab_size", m.vocab_size)?,
            n_ctx,
            n_rot,
            rope_base,
            rms_eps: m.rms_norm_eps,
            sliding_window: window,
            tied: m.tie_word_embeddings.unwrap_or(false),
            bos: id("bos_token_id", &j.bos_token_id)?,
            eos: id("eos_token_id", &j.eos_token_id)?,
            pad: id("pad_token_id", &j.pad_token_id)?,
        })
    }

    /// Query width (`n_head · head_dim` = `n_embd`).
    pub fn q_dim(&self) -> usize {
        self.n_embd
    }

    /// Key/value width.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * (self.n_embd / self.n_head)
    }

    /// Adds `general.*` and `phi3.*` metadata as llama.cpp names it.
    pub fn add_metadata(&self, w: &mut GgufWriter, name: &str) {
        let u = |v: usize| Value::U32(v as u32);
        w.add("general.architecture", Value::Str("phi3".into()))
            .add("general.name", Value::Str(name.into()))
            .add("phi3.context_length", u(self.n_ctx))
            .add("phi3.embedding_length", u(self.n_embd))
            .add("phi3.feed_forward_length", u(self.n_ff))
            .add("phi3.block_count", u(self.n_layer))
            .add("phi3.attention.head_count", u(self.n_head))
            .add("phi3.attention.head_count_kv", u(self.n_head_kv))
            .add(
                "phi3.attention.layer_norm_rms_epsilon",
                Value::F32(self.rms_eps),
            )
            .add("phi3.attention.sliding_window", u(self.sliding_window))
            .add("phi3.rope.dimension_count", u(self.n_rot))
            .add("phi3.rope.freq_base", Value::F32(self.rope_base));
    }
}
