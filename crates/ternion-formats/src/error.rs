//! The error type of the file formats: every failure names the file, tensor or field it
//! was reading and what it expected.

use std::path::PathBuf;

/// Result alias used across the formats crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from reading, writing or converting model files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O failure on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A GGUF file is malformed: truncated, inconsistent or out of bounds.
    #[error("malformed GGUF: {0}")]
    Gguf(String),
    /// A tensor uses a type this build does not know or cannot use where it appears.
    #[error("tensor '{tensor}': unsupported type {type_name} (ggml type id {type_id})")]
    UnsupportedType {
        /// Tensor name.
        tensor: String,
        /// ggml type id as stored in the file.
        type_id: u32,
        /// Human-readable type name, or "unknown".
        type_name: String,
    },
    /// A named choice (model type, quantization, …) is not one this build can read; lists
    /// the ones it can.
    #[error("{what} '{found}' is not supported (supported: {}){}", .supported.join(", "), hint_suffix(.hint))]
    Unsupported {
        /// What was chosen, e.g. "model_type".
        what: String,
        /// The value found.
        found: String,
        /// The values this build supports there.
        supported: Vec<String>,
        /// What to do instead (may be empty).
        hint: &'static str,
    },
    /// An MLC weight directory is malformed: bad JSON, a missing or short shard, a record
    /// that disagrees with its data or with the model configuration.
    #[error("MLC directory: {0}")]
    Mlc(String),
    /// Tensor data or sizes do not fit what the file declares.
    #[error("model: {0}")]
    Model(String),
    /// A size asked for cannot be represented or allocated.
    #[error("invalid request: {0}")]
    Request(String),
    /// Tokenizer files beside the weights are missing or inconsistent.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// `"; hint"`, or nothing for an empty hint: the tail of an error message.
pub fn hint_suffix(h: &str) -> String {
    if h.is_empty() {
        String::new()
    } else {
        format!("; {h}")
    }
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

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

    /// A stable name for the variant, e.g. `"Gguf"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Io { .. } => "Io",
            Error::Gguf(_) => "Gguf",
            Error::UnsupportedType { .. } => "UnsupportedType",
            Error::Unsupported { .. } => "Unsupported",
            Error::Mlc(_) => "Mlc",
            Error::Model(_) => "Model",
            Error::Request(_) => "Request",
            Error::Tokenizer(_) => "Tokenizer",
        }
    }
}
