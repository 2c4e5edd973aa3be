//! The error type of the text layer: tokenizer metadata and chat templates.

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
    /// The GGUF file the tokenizer reads failed, or a metadata value in it (tokenizer
    /// model, pre-tokenizer) is not one this build has ([`Error::unsupported`]).
    #[error(transparent)]
    Formats(#[from] ternion_formats::Error),
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
