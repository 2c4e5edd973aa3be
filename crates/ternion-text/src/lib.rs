//! Ternion's text layer: [`tokenizer`] builds the BPE and SentencePiece tokenizers from a
//! GGUF file's metadata and turns text into ids and back; [`chat`] renders conversations
//! with the model's Jinja template in bounded memory and time.

pub mod chat;
pub mod error;
mod jinja_budget;
pub mod tokenizer;

/// The shared test data beside the repository, for the unit tests.
#[cfg(test)]
use ternion_testkit::shared as test_shared;

pub use error::{Error, Result, TemplateError, TokenizerError};
/// The formats crate the tokenizer reads GGUF metadata through.
pub(crate) use ternion_formats::gguf;
