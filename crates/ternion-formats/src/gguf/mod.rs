//! GGUF files: a bounds-checked, memory-mapped reader and a streaming writer.

mod cursor;
mod error;
mod reader;
mod value;
mod writer;

pub use error::{GgufPlace, GgufProblem};
pub use reader::{GgufFile, TensorInfo};
pub use value::{Value, ValueType};
pub use writer::GgufWriter;

/// The four magic bytes that open every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's limit).
pub const MAX_DIMS: usize = 4;

#[cfg(test)]
mod tests;
