//! Model definitions: hyper-parameters from metadata and one file per architecture family.

pub mod bitnet;
pub mod config;

use std::path::Path;
use std::sync::Arc;

pub use bitnet::{BitNet, Logits, Workspace};
pub use config::{Arch, Config};

use crate::gguf::GgufFile;
use crate::Result;

/// How the LM head's weights are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LmHead {
    /// As stored in the file (F16 for BitNet 2B-4T): the reference numerics.
    #[default]
    AsStored,
    /// Requantized to Q8_0 at load, with Q8_0 activations: about half the bytes per token
    /// (an approximation; its effect on the golden sets is recorded in BENCHMARKS.md).
    Q8_0,
}

/// Choices made when binding a file to its architecture.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// LM head storage.
    pub lm_head: LmHead,
}

/// Opens a GGUF file and binds it to its architecture with default options.
pub fn load(path: impl AsRef<Path>) -> Result<(Arc<GgufFile>, BitNet)> {
    load_with(path, &LoadOptions::default())
}

/// Opens a GGUF file and binds it to its architecture.
pub fn load_with(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<(Arc<GgufFile>, BitNet)> {
    let file = Arc::new(GgufFile::open(path)?);
    let cfg = Config::from_gguf(&file)?;
    let model = BitNet::load(file.clone(), cfg, opts)?;
    Ok((file, model))
}
