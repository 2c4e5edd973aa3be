//! Ternion's core: [`model`] validates a GGUF file's hyper-parameters and builds the
//! forward graph, [`backend::cpu`] runs it, [`kv`] holds the paged KV cache, [`sample`]
//! picks the next id, [`generate`] is the one generation state machine every front end
//! drives, [`session`] runs it for one sequence, and [`embed`] pools hidden states into
//! text embeddings. The file formats and the text layer are re-exported under their
//! module names ([`gguf`], [`quant`], [`tokenizer`], …).

pub mod backend;
#[cfg(feature = "constrain")]
pub mod constrain;
pub mod embed;
pub mod error;
pub mod generate;
pub mod kv;
pub mod model;
pub mod sample;
pub mod session;

pub use error::{Error, Result};
pub use ternion_formats::Error as FormatError;
pub use ternion_formats::{gguf, limits, mlc, quant};
pub use ternion_text::Error as TextError;
pub use ternion_text::{chat, tokenizer};

/// The shared test data beside the repository, for the unit tests.
#[cfg(test)]
use ternion_testkit::shared as test_shared;
/// Synthetic models for the unit tests.
#[cfg(test)]
use ternion_testkit::synth;
