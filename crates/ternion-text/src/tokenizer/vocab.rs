//! The token list of a GGUF vocabulary: texts, scores and token types, and text -> id lookup.

use std::collections::HashMap;

use crate::gguf::GgufFile;
use crate::{Result, TokenizerError};

/// A token's type, from `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Attr {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl Attr {
    fn from_type(t: i32) -> Attr {
        match t {
            1 => Attr::Normal,
            2 => Attr::Unknown,
            3 => Attr::Control,
            4 => Attr::UserDefined,
            5 => Attr::Unused,
            6 => Attr::Byte,
            _ => Attr::Undefined,
        }
    }

    /// Control, user-defined and unknown tokens are matched as whole texts before splitting.
    pub(crate) fn is_special(self) -> bool {
        matches!(self, Attr::Control | Attr::UserDefined | Attr::Unknown)
    }
}

/// Token texts, scores and types, with a text -> id map (the last of duplicate texts wins).
pub(crate) struct Vocab {
    pub(crate) texts: Vec<String>,
    pub(crate) scores: Vec<f32>,
    pub(crate) attrs: Vec<Attr>,
    /// Whether matching the special token also drops the white space right after it
    /// (llama.cpp's `LLAMA_TOKEN_ATTR_RSTRIP`).
    pub(crate) rstrip: Vec<bool>,
    ids: HashMap<String, u32>,
}

impl Vocab {
    /// Reads `tokenizer.ggml.tokens`, `.scores` and `.token_type`. An empty token text
    /// becomes `[EMPTY_<id>]`, as in llama.cpp.
    pub(crate) fn load(file: &GgufFile) -> Result<Vocab> {
        let tokens = file
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| TokenizerError::MissingKey {
                file: file.path().to_path_buf(),
                key: "tokenizer.ggml.tokens",
            })?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TokenizerError::VocabSize { len: n }.into());
        }
        let scores = match file.get_f32_array("tokenizer.ggml.scores")? {
            Some(s) if s.len() != n => {
                return Err(TokenizerError::ArrayLength {
                    key: "tokenizer.ggml.scores",
                    len: s.len(),
                    n_tokens: n,
                }
                .into())
            }
            Some(s) => s,
            None => vec![0.0; n],
        };
        let attrs = match file.get_i32_array("tokenizer.ggml.token_type")? {
            Some(t) if t.len() != n => {
                return Err(TokenizerError::ArrayLength {
                    key: "tokenizer.ggml.token_type",
                    len: t.len(),
                    n_tokens: n,
                }
                .into())
            }
            Some(t) => t.into_iter().map(Attr::from_type).collect(),
            None => vec![Attr::Normal; n],
        };
        let mut texts = Vec::with_capacity(n);
        let mut ids = HashMap::with_capacity(n);
        for (id, t) in (0u32..).zip(tokens) {
            let text = if t.is_empty() {
                format!("[EMPTY_{id}]")
            } else {
                t.to_owned()
            };
            ids.insert(text.clone(), id);
            texts.push(text);
        }
        Ok(Vocab {
            texts,
            scores,
            rstrip: vec![false; attrs.len()],
            attrs,
            ids,
        })
    }

    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }

    /// The id of a token text.
    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The type of a token (`Undefined` for an id out of range).
    pub(crate) fn attr(&self, id: u32) -> Attr {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(Attr::Undefined)
    }
}
