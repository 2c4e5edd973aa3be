//! The error type of the file formats: every failure names the file, tensor or field it
//! was reading and what it expected.
//!
//! Variants say what happened with typed fields, so that callers match on the failure
//! rather than parse a message: a malformed GGUF file is [`Error::Gguf`] with the place
//! ([`GgufPlace`]) and the problem ([`GgufProblem`]), an MLC directory's failures are
//! [`MlcError`], the tokenizer files beside MLC weights [`TokenizerFileError`], a memory
//! check [`Error::InsufficientMemory`] with its [`MemoryUse`]. [`Error::kind`] gives each
//! variant a stable name.

use std::path::PathBuf;

use crate::gguf::{GgufPlace, GgufProblem};
use crate::limits::{human, MemoryUse, SKIP_ENV};
use crate::mlc::error::{MlcError, TokenizerFileError};
use crate::quant::{GgmlType, RowProblem};

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
    #[error("malformed GGUF: {}: {at}{problem}", .file.display())]
    Gguf {
        /// The file (or the name it was read under).
        file: PathBuf,
        /// Where in the file (boxed: it holds a tensor's name and shape, and every
        /// `Result` of the crates above carries this error's size).
        at: Box<GgufPlace>,
        /// What is wrong there.
        problem: GgufProblem,
    },
    /// A metadata value has the wrong type, or a required one is absent.
    #[error("model: {}: metadata '{key}': expected {expected}, found {found}", .file.display())]
    Metadata {
        /// The file.
        file: PathBuf,
        /// The key.
        key: String,
        /// What the reader expected, e.g. "an unsigned 32-bit integer".
        expected: &'static str,
        /// A summary of what is there ("nothing" when the key is absent).
        found: String,
    },
    /// A tensor's shape is not whole blocks of its type, or its size overflows (writer).
    #[error("GGUF writer: tensor '{tensor}': shape {shape:?} does not fit type {ty}")]
    ShapeDoesNotFit {
        /// Tensor name.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// Bytes handed to the writer for a tensor are not its declared size.
    #[error("GGUF writer: tensor '{tensor}': {given} bytes given, {expected} expected for {ty} {shape:?}")]
    TensorDataSize {
        /// Tensor name.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// Its shape.
        shape: Vec<u64>,
        /// Bytes given.
        given: u64,
        /// Bytes its type and shape take.
        expected: u64,
    },
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
    Mlc(Box<MlcError>),
    /// A model cannot be written as described (the synthetic-model writers of the test kit
    /// and `ternion synth`; the readers here report with the typed variants above).
    #[error("model: {0}")]
    Model(String),
    /// A model or a KV cache needs more memory than the machine has available now.
    #[error(
        "{what} needs {} but only {} of memory is available (MemAvailable); set {}=1 to load \
         anyway",
        human(*.need),
        human(*.available),
        SKIP_ENV
    )]
    InsufficientMemory {
        /// What needs the memory.
        what: MemoryUse,
        /// Bytes it needs.
        need: u64,
        /// Bytes available.
        available: u64,
    },
    /// The byte size of a KV cache overflows u64.
    #[error(
        "a KV cache of {n_ctx} positions × {n_layer} layers × {kv_dim} values: size overflows"
    )]
    KvCacheOverflow {
        /// Positions.
        n_ctx: usize,
        /// Layers.
        n_layer: usize,
        /// Values per position and layer.
        kv_dim: usize,
    },
    /// A row of a tensor cannot be dequantized.
    #[error("model: tensor '{tensor}' ({ty}): {problem}")]
    TensorRow {
        /// Tensor name.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// What is wrong.
        problem: RowProblem,
    },
    /// A synthetic model asked of the test kit's writers has shapes they cannot make.
    #[error("invalid request: {0}")]
    Request(String),
    /// Tokenizer files beside the weights are missing or inconsistent.
    #[error("tokenizer: {0}")]
    Tokenizer(TokenizerFileError),
}

/// `"; hint"`, or nothing for an empty hint: the tail of an error message.
pub fn hint_suffix(h: &str) -> String {
    if h.is_empty() {
        String::new()
    } else {
        format!("; {h}")
    }
}

// Not `#[from]`: that would also make the inner error the `source`, and `{:#}` chains
// would print its message twice.
impl From<MlcError> for Error {
    fn from(e: MlcError) -> Self {
        Error::Mlc(Box::new(e))
    }
}

impl From<TokenizerFileError> for Error {
    fn from(e: TokenizerFileError) -> Self {
        Error::Tokenizer(e)
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
            Error::Gguf { .. } => "Gguf",
            Error::Metadata { .. } => "Metadata",
            Error::ShapeDoesNotFit { .. } => "ShapeDoesNotFit",
            Error::TensorDataSize { .. } => "TensorDataSize",
            Error::UnsupportedType { .. } => "UnsupportedType",
            Error::Unsupported { .. } => "Unsupported",
            Error::Mlc(_) => "Mlc",
            Error::TensorRow { .. } => "TensorRow",
            Error::InsufficientMemory { .. } => "InsufficientMemory",
            Error::KvCacheOverflow { .. } => "KvCacheOverflow",
            Error::Model(_) => "Model",
            Error::Request(_) => "Request",
            Error::Tokenizer(_) => "Tokenizer",
        }
    }
}
