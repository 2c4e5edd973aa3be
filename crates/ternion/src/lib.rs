//! Ternion: an inference engine for ternary (BitNet b1.58) and ordinary GGUF models.
//!
//! The path of a token: [`gguf`] reads the file, [`model`] validates the hyper-parameters
//! and runs the forward pass on a backend ([`backend`]), [`tokenizer`] turns text into ids
//! and back, [`sample`] picks the next id, and [`session`] drives prefill and decode;
//! [`chat`] renders conversations with the model's template; [`embed`] pools hidden states
//! into text embeddings. [`mlc`] converts MLC
//! `q4f16_1` weight directories into GGUF at load.
//!
//! This crate is the facade over the crates that hold the code, under the paths above:
//! `ternion-formats` (gguf, quant, mlc, limits), `ternion-text` (tokenizer, chat),
//! `ternion-core` (model, CPU backend, generation, sampling, KV cache, session, errors)
//! and `ternion-gpu` (`backend::gpu`, feature `gpu`).

#[cfg(feature = "constrain")]
pub use ternion_core::constrain;
pub use ternion_core::{embed, error, kv, model, sample};
pub use ternion_core::{Error, FormatError, Result, TextError};
pub use ternion_formats::{gguf, limits, mlc, quant};
pub use ternion_text::{chat, tokenizer};

/// Compute backends.
pub mod backend {
    pub use ternion_core::backend::cpu;
    #[cfg(feature = "gpu")]
    pub use ternion_gpu as gpu;
}

/// One generation core for every front end (see [`ternion_core::generate`]).
pub mod generate {
    pub use ternion_core::generate::*;
    #[cfg(feature = "gpu")]
    pub use ternion_gpu::GpuBatch;
}

/// A sequence being generated (see [`ternion_core::session`]).
pub mod session {
    pub use ternion_core::session::*;
    #[cfg(feature = "gpu")]
    pub use ternion_gpu::GpuEngine;
}
