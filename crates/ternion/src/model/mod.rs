//! Model definitions: hyper-parameters from metadata and one file per architecture family.

pub mod bitnet;
pub mod config;

use std::path::Path;
use std::sync::Arc;

pub use bitnet::{BitNet, Logits, Workspace};
pub use config::{Arch, Config};

use crate::gguf::GgufFile;
use crate::Result;

/// Opens a GGUF file and binds it to its architecture.
pub fn load(path: impl AsRef<Path>) -> Result<(Arc<GgufFile>, BitNet)> {
    let file = Arc::new(GgufFile::open(path)?);
    let cfg = Config::from_gguf(&file)?;
    let model = BitNet::load(file.clone(), cfg)?;
    Ok((file, model))
}
