//! The error type of the text layer: tokenizer metadata and chat templates.

use ternion_formats::error::hint_suffix;

/// Result alias used across the text crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from building a tokenizer, tokenizing text or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Tokenizer metadata is missing or inconsistent, or text cannot be tokenized.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// A named choice (tokenizer model, pre-tokenizer) is not one this build has; lists
    /// the ones it has.
    #[error("{what} '{found}' is not supported (supported: {}){}", .supported.join(", "), hint_suffix(.hint))]
    Unsupported {
        /// What was chosen, e.g. "tokenizer.ggml.pre".
        what: String,
        /// The value found.
        found: String,
        /// The values this build supports there.
        supported: Vec<String>,
        /// What to do instead (may be empty).
        hint: &'static str,
    },
    /// The GGUF file the tokenizer reads failed.
    #[error(transparent)]
    Formats(#[from] ternion_formats::Error),
}

impl Error {
    /// An [`Error::Unsupported`] with the supported values as strings.
    pub fn unsupported<S: ToString>(
        what: impl Into<String>,
        found: impl ToString,
        supported: impl IntoIterator<Item = S>,
        hint: &'static str,
    ) -> Self {
        Error::Unsupported {
            what: what.into(),
            found: found.to_string(),
            supported: supported.into_iter().map(|s| s.to_string()).collect(),
            hint,
        }
    }

    /// A stable name for the variant (of the wrapped formats error for
    /// [`Error::Formats`]), e.g. `"Tokenizer"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Tokenizer(_) => "Tokenizer",
            Error::Template(_) => "Template",
            Error::Unsupported { .. } => "Unsupported",
            Error::Formats(e) => e.kind(),
        }
    }
}
