//! `ternion logits`: evaluate a prompt as one batch, write `[n_tokens, n_vocab]` float32
//! logits as NumPy `.npy`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

use crate::common::{self, ModelArgs};
use crate::prompt::PromptArgs;

/// Arguments of `ternion logits`.
#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Output `.npy` file.
    #[arg(long)]
    out: PathBuf,
}

/// Runs `ternion logits`.
pub fn run(a: LogitsArgs) -> Result<()> {
    let mut l = common::load(&a.model, false)?;
    let ids = a.prompt.ids(&l.tokenizer)?;
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    let mut session = common::session(&l.model, &mut l.gpu, l.n_ctx);
    let logits = session.logits_all(&ids)?;
    write_npy(&a.out, &logits, ids.len(), l.model.config().n_vocab)?;
    writeln!(std::io::stdout(), "{}", json!({ "tokens": ids }))?;
    Ok(())
}

/// Writes a 2-D little-endian float32 array in NumPy's `.npy` format (version 1.0).
pub fn write_npy(path: &Path, data: &[f32], rows: usize, cols: usize) -> Result<()> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let pad = (64 - (10 + header.len() + 1) % 64) % 64;
    header.push_str(&" ".repeat(pad));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(&bytes))
        .with_context(|| format!("writing {}", path.display()))
}
