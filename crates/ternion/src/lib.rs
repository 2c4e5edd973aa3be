//! Ternion: an inference engine for ternary (BitNet b1.58) and ordinary GGUF models.
//!
//! The path of a token: [`gguf`] reads the file, [`model`] validates the hyper-parameters
//! and runs the forward pass on a backend ([`backend`]), [`tokenizer`] turns text into ids
//! and back, [`sample`] picks the next id, and [`session`] drives prefill and decode.

pub mod error;
pub mod gguf;
pub mod quant;
pub mod tokenizer;

pub use error::{Error, Result};
