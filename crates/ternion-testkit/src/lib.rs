//! Test support for the Ternion crates and the CLI's `synth` command: [`synth`] writes
//! random-weight GGUF models, [`mlc_synth`] random MLC `q4f16_1` directories, [`shared`]
//! finds the golden data beside the repository (`../shared`) and reads its vectors,
//! [`variant`] copies a GGUF file with keys and tensors added, and [`gguf_gen`] builds
//! hostile GGUF files field by field; [`scratch`] gives a test process temporary folders
//! that are removed when it exits.

pub mod gguf_gen;
pub mod mlc_synth;
pub mod scratch;
pub mod shared;
pub mod synth;
pub mod variant;

use ternion_core::{gguf, mlc, model, quant, tokenizer};
/// The writers here fail as the file formats do.
use ternion_formats::{Error, Result};
