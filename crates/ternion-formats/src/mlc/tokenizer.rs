//! The tokenizer files of an MLC directory → GGUF `tokenizer.ggml.*` keys, as llama.cpp's
//! converter builds them for Phi-3 (`Phi3MiniModel.set_vocab` in convert_hf_to_gguf.py):
//!
//! 1. every id up to `vocab_size` starts as `[PAD{id}]`, score −10000, type UNKNOWN;
//! 2. `tokenizer.model` (SentencePiece BPE) fills its pieces with their scores; piece types
//!    UNKNOWN, CONTROL, UNUSED and BYTE are kept, every other type becomes NORMAL;
//! 3. the added tokens of `tokenizer_config.json` (`added_tokens_decoder`) and then of
//!    `tokenizer.json` (`added_tokens`) overwrite their ids with score −1000 and type
//!    CONTROL when `special`, else USER_DEFINED.
//!
//! llama.cpp also reads `added_tokens.json` first (as USER_DEFINED); it is not read here,
//! since the same tokens are listed again, with their `special` flag, by the two files above.
//! `tokenizer.json` alone cannot be used: it has no piece scores, and SentencePiece's
//! merge order comes from them. BOS, EOS and padding ids come from `mlc-chat-config.json`;
//! `add_bos_token`, `add_eos_token` and `chat_template` from `tokenizer_config.json`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::cache::{parse_json, read_small, MAX_INDEX_BYTES};
use super::config::Phi3Config;
use super::error::TokenizerFileError;
use super::spm::{self, piece_type};
use crate::gguf::{GgufWriter, Value, ValueType};
use crate::Result;

/// The SentencePiece model file.
pub const SPM_FILE: &str = "tokenizer.model";
/// The Hugging Face tokenizer file (its added tokens are read).
pub const HF_FILE: &str = "tokenizer.json";
/// The Hugging Face tokenizer configuration.
pub const HF_CONFIG_FILE: &str = "tokenizer_config.json";

/// Score llama.cpp gives padding ids.
pub const PAD_SCORE: f32 = -10_000.0;
/// Score llama.cpp gives added tokens.
pub const ADDED_SCORE: f32 = -1_000.0;

/// Largest `tokenizer.model` read.
const MAX_SPM_BYTES: u64 = 64 << 20;

#[derive(Deserialize)]
struct AddedToken {
    id: u64,
    content: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct HfTokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
}

#[derive(Deserialize)]
struct DecoderEntry {
    content: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ChatTemplate {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize)]
struct HfConfigJson {
    #[serde(default)]
    add_bos_token: Option<bool>,
    #[serde(default)]
    add_eos_token: Option<bool>,
    #[serde(default)]
    chat_template: Option<ChatTemplate>,
    #[serde(default)]
    added_tokens_decoder: BTreeMap<String, DecoderEntry>,
}

/// The tokenizer files of an MLC directory, as bytes.
pub struct TokenizerFiles {
    /// `tokenizer.model`.
    pub spm: Vec<u8>,
    /// `tokenizer_config.json`, when present.
    pub hf_config: Option<Vec<u8>>,
    /// `tokenizer.json`, when present.
    pub hf: Option<Vec<u8>>,
}

impl TokenizerFiles {
    /// Reads the tokenizer files of `dir` (`tokenizer.model` must be there).
    pub fn read(dir: &Path) -> Result<TokenizerFiles> {
        let spm_path = dir.join(SPM_FILE);
        if !spm_path.is_file() {
            return Err(TokenizerFileError::SpmMissing { path: spm_path }.into());
        }
        let optional = |name: &str| {
            let p = dir.join(name);
            p.is_file()
                .then(|| read_small(&p, MAX_INDEX_BYTES))
                .transpose()
        };
        Ok(TokenizerFiles {
            spm: read_small(&spm_path, MAX_SPM_BYTES)?,
            hf_config: optional(HF_CONFIG_FILE)?,
            hf: optional(HF_FILE)?,
        })
    }
}

/// Adds the `tokenizer.*` keys for `files`, the tokenizer files of the directory `dir`
/// (named in errors).
pub fn add_tokenizer(
    w: &mut GgufWriter,
    files: &TokenizerFiles,
    dir: &str,
    cfg: &Phi3Config,
) -> Result<()> {
    let n = cfg.n_vocab;
    let spm_path = format!("{dir}/{SPM_FILE}");
    let model = spm::parse(&files.spm)?;
    if model.model_type.is_some_and(|t| t != spm::MODEL_BPE) {
        return Err(TokenizerFileError::NotBpe {
            file: spm_path,
            model_type: model.model_type,
        }
        .into());
    }
    if model.pieces.len() > n {
        return Err(TokenizerFileError::TooManyPieces {
            file: spm_path,
            pieces: model.pieces.len(),
            vocab: n,
        }
        .into());
    }
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![PAD_SCORE; n];
    let mut types = vec![piece_type::UNKNOWN; n];
    let mut unk = None;
    for (i, p) in model.pieces.into_iter().enumerate() {
        types[i] = match p.kind {
            piece_type::UNKNOWN | piece_type::CONTROL | piece_type::UNUSED | piece_type::BYTE => {
                p.kind
            }
            _ => piece_type::NORMAL,
        };
        if p.kind == piece_type::UNKNOWN && unk.is_none() {
            unk = Some(i as u32);
        }
        tokens[i] = p.piece;
        scores[i] = p.score;
    }

    let mut added = Vec::new();
    let hf_config_path = format!("{dir}/{HF_CONFIG_FILE}");
    let hf_config: Option<HfConfigJson> = files
        .hf_config
        .as_deref()
        .map(|b| parse_json(b, &hf_config_path))
        .transpose()?;
    if let Some(c) = &hf_config {
        for (id, e) in &c.added_tokens_decoder {
            let id = id
                .parse::<u64>()
                .map_err(|_| TokenizerFileError::AddedTokenKey {
                    file: hf_config_path.clone(),
                    key: id.clone(),
                })?;
            added.push((id, e.content.as_str(), e.special, &hf_config_path));
        }
    }
    let hf_path = format!("{dir}/{HF_FILE}");
    let hf: Option<HfTokenizerJson> = files
        .hf
        .as_deref()
        .map(|b| parse_json(b, &hf_path))
        .transpose()?;
    for t in hf.iter().flat_map(|h| &h.added_tokens) {
        added.push((t.id, t.content.as_str(), t.special, &hf_path));
    }
    for (id, content, special, file) in added {
        let i = usize::try_from(id).ok().filter(|&i| i < n).ok_or_else(|| {
            TokenizerFileError::AddedTokenId {
                file: file.to_string(),
                content: content.to_string(),
                id,
                vocab: n,
            }
        })?;
        tokens[i] = content.to_string();
        scores[i] = ADDED_SCORE;
        types[i] = if special {
            piece_type::CONTROL
        } else {
            piece_type::USER_DEFINED
        };
    }

    w.add("tokenizer.ggml.model", Value::Str("llama".into()))
        .add("tokenizer.ggml.pre", Value::Str("default".into()))
        .add_strings("tokenizer.ggml.tokens", &tokens)
        .add(
            "tokenizer.ggml.scores",
            Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
        )
        .add(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
        );
    for (key, id) in [
        ("tokenizer.ggml.bos_token_id", cfg.bos),
        ("tokenizer.ggml.eos_token_id", cfg.eos),
        ("tokenizer.ggml.unknown_token_id", unk),
        ("tokenizer.ggml.padding_token_id", cfg.pad),
    ] {
        if let Some(id) = id {
            w.add(key, Value::U32(id));
        }
    }
    let c = hf_config.as_ref();
    w.add(
        "tokenizer.ggml.add_bos_token",
        Value::Bool(c.and_then(|c| c.add_bos_token).unwrap_or(true)),
    )
    .add(
        "tokenizer.ggml.add_eos_token",
        Value::Bool(c.and_then(|c| c.add_eos_token).unwrap_or(false)),
    );
    let template = c.and_then(|c| match c.chat_template.as_ref()? {
        ChatTemplate::One(t) => Some(t.clone()),
        ChatTemplate::Named(list) => list
            .iter()
            .find(|t| t.name == "default")
            .or(list.first())
            .map(|t| t.template.clone()),
    });
    if let Some(t) = template {
        w.add("tokenizer.chat_template", Value::Str(t));
    }
    Ok(())
}
