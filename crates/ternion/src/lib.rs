//! Ternion: an inference engine for ternary (BitNet b1.58) and ordinary GGUF models.
//!
//! The path of a token: [`gguf`] reads the file, [`model`] validates the hyper-parameters
//! and runs the forward pass on a backend ([`backend`]), [`tokenizer`] turns text into ids
//! and back, [`sample`] picks the next id, and [`session`] drives prefill and decode;
//! [`chat`] renders conversations with the model's template; [`embed`] pools hidden states
//! into text embeddings. [`mlc`] converts MLC
//! `q4f16_1` weight directories into GGUF at load.

pub mod backend;
pub mod chat;
#[cfg(feature = "constrain")]
pub mod constrain;
pub mod embed;
pub mod error;
pub mod generate;
pub mod gguf;
mod jinja_budget;
pub mod kv;
pub mod limits;
pub mod mlc;
pub mod model;
pub mod quant;
pub mod sample;
pub mod session;
pub mod synth;
pub mod tokenizer;

/// The shared test data beside the repository, for the unit tests.
#[cfg(test)]
#[path = "../tests/support/shared.rs"]
mod test_shared;

pub use error::{Error, Result};
