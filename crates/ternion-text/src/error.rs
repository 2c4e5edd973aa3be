//! The error type of the text layer: tokenizer metadata and chat templates.

use std::path::PathBuf;

/// Result alias used across the text crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from building a tokenizer, tokenizing text or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Tokenizer metadata is missing or inconsistent, or text cannot be tokenized.
    #[error("tokenizer: {0}")]
    Tokenizer(TokenizerError),
    /// A chat template failed to render.
    #[error("chat template: {0}")]
    Template(TemplateError),
    /// The GGUF file the tokenizer reads failed, or a metadata value in it (tokenizer
    /// model, pre-tokenizer) is not one this build has ([`Error::unsupported`]).
    #[error(transparent)]
    Formats(#[from] ternion_formats::Error),
}

/// What is wrong with a tokenizer's metadata, or why text cannot be tokenized.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum TokenizerError {
    /// A required `tokenizer.ggml.*` key is absent.
    #[error("{}: no {key}", .file.display())]
    MissingKey {
        /// The model file.
        file: PathBuf,
        /// The key, e.g. `tokenizer.ggml.tokens`.
        key: &'static str,
    },
    /// A byte-level BPE vocabulary comes without its merges.
    #[error("{}: byte-level BPE vocabulary without tokenizer.ggml.merges", .file.display())]
    MissingMerges {
        /// The model file.
        file: PathBuf,
    },
    /// The token list is empty or longer than token ids can number.
    #[error("tokenizer.ggml.tokens has {len} entries")]
    VocabSize {
        /// Entries in the list.
        len: usize,
    },
    /// A per-token array does not have one entry per token.
    #[error("{key} has {len} entries for {n_tokens} tokens")]
    ArrayLength {
        /// The key, e.g. `tokenizer.ggml.scores`.
        key: &'static str,
        /// Entries in the array.
        len: usize,
        /// Tokens in the vocabulary.
        n_tokens: usize,
    },
    /// More merges than ranks can number.
    #[error("{len} merges is too many")]
    TooManyMerges {
        /// Merges in the list.
        len: usize,
    },
    /// A merge rule is the empty string.
    #[error("tokenizer.ggml.merges[{rank}] is empty")]
    EmptyMerge {
        /// The merge's rank (its index).
        rank: u32,
    },
    /// The merges name more distinct strings than piece ids can number.
    #[error("too many distinct merge strings")]
    TooManyMergeStrings,
    /// Text needs a byte fallback token the vocabulary does not have.
    #[error("no token for byte 0x{byte:02X} (needed by {piece:?})")]
    NoByteToken {
        /// The byte.
        byte: u8,
        /// The text piece that needs it.
        piece: String,
    },
}

/// Why a chat template did not render. Wrapped errors are shown in the message and so are
/// not also a `source` (a `{:#}` chain would print them twice).
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The Jinja template failed to parse or render, or went over its budget.
    #[error("{error}")]
    Render {
        /// The template engine's error.
        error: minijinja::Error,
    },
    /// The thread that renders templates (with a stack large enough for deep templates)
    /// could not start.
    #[error("cannot start the template renderer: {error}")]
    RendererStart {
        /// The operating system's error.
        error: std::io::Error,
    },
    /// The renderer thread panicked.
    #[error("the template renderer panicked")]
    RendererPanicked,
    /// A message's role has no place in the built-in BitNet format.
    #[error("BitNet format has no role '{role}' (system, user, assistant)")]
    UnknownRole {
        /// The role given.
        role: String,
    },
}

impl From<TokenizerError> for Error {
    fn from(e: TokenizerError) -> Self {
        Error::Tokenizer(e)
    }
}

impl From<TemplateError> for Error {
    fn from(e: TemplateError) -> Self {
        Error::Template(e)
    }
}

impl Error {
    /// A metadata value this build does not support, with the values it does
    /// ([`ternion_formats::Error::Unsupported`]).
    pub fn unsupported<S: ToString>(
        what: impl Into<String>,
        found: impl ToString,
        supported: impl IntoIterator<Item = S>,
        hint: &'static str,
    ) -> Self {
        Error::Formats(ternion_formats::Error::unsupported(
            what, found, supported, hint,
        ))
    }

    /// A stable name for the variant (of the wrapped formats error for
    /// [`Error::Formats`]), e.g. `"Tokenizer"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Tokenizer(_) => "Tokenizer",
            Error::Template(_) => "Template",
            Error::Formats(e) => e.kind(),
        }
    }
}
