//! The library's error type: every failure names what it was reading and what it expected.

use std::path::PathBuf;

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by the library. Each variant carries enough context (file, tensor,
/// field, expected versus found) to act on without a debugger.
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
    /// An MLC weight directory is malformed: bad JSON, a missing or short shard, a record
    /// that disagrees with its data or with the model configuration.
    #[error("MLC directory: {0}")]
    Mlc(String),
    /// The model's metadata or tensors do not fit the architecture.
    #[error("model: {0}")]
    Model(String),
    /// Tokenizer metadata is missing or inconsistent, or text cannot be tokenized.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// A request is invalid (prompt too long, bad token id, bad sampling settings).
    #[error("invalid request: {0}")]
    Request(String),
    /// The shared KV-cache pool has fewer free pages than a sequence needs.
    #[error("KV cache pool exhausted: {need} more pages needed, {free} of {capacity} free")]
    KvPoolExhausted {
        /// Pages the sequence asked for.
        need: usize,
        /// Pages free in the pool.
        free: usize,
        /// Pages in the pool.
        capacity: usize,
    },
    /// The GPU backend failed: no adapter, a shader or pipeline error, out of GPU memory,
    /// or the device was lost.
    #[error("gpu: {0}")]
    Gpu(String),
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
