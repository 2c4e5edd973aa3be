//! Ternion's file formats: [`gguf`] reads and writes GGUF files, [`quant`] holds every
//! quantized block format (layouts, dequantization, reference dots), [`mlc`] converts MLC
//! `q4f16_1` weight directories into GGUF at load, and [`limits`] checks sizes read from a
//! file against the memory at hand. Depends on no other Ternion crate.

pub mod error;
pub mod gguf;
pub mod limits;
pub mod mlc;
pub mod quant;

/// The shared test data beside the repository, for the unit tests.
#[cfg(test)]
use ternion_testkit::shared as test_shared;

pub use error::{Error, Result};
