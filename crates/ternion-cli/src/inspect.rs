//! `ternion inspect` (metadata and tensor table) and `ternion tokenize`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ternion::model::Config;
use ternion::tokenizer::{PreTokenizer, Tokenizer};

use crate::common;

/// Arguments of `ternion inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// GGUF file or MLC `q4f16_1` directory (shown as the GGUF it converts to).
    file: PathBuf,
}

/// Prints metadata and tensors; a file that does not fully validate is an error.
pub fn inspect(a: InspectArgs) -> Result<()> {
    let f = ternion::mlc::open(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    println!(
        "GGUF v{}, {} bytes, {} metadata entries, {} tensors, alignment {}",
        f.version,
        f.file_len(),
        f.metadata.len(),
        f.tensors.len(),
        f.alignment
    );
    println!("\nmetadata:");
    for (k, v) in &f.metadata {
        println!("  {k} = {}", v.summary());
    }
    println!("\ntensors:");
    for t in &f.tensors {
        println!(
            "  {:<32} {:<6} {:<20} offset {:>12}  {:>12} bytes",
            t.name,
            t.ty.name(),
            format!("{:?}", t.shape),
            t.offset,
            t.size
        );
    }
    if f.get("general.architecture").is_some() && !f.tensors.is_empty() {
        let cfg = Config::from_gguf(&f)?;
        println!("\nmodel: {cfg:?}");
    }
    Ok(())
}

/// Arguments of `ternion tokenize`.
#[derive(Args)]
pub struct TokenizeArgs {
    /// Model or vocab-only GGUF file, or MLC directory.
    #[arg(long, short = 'm')]
    model: PathBuf,
    /// Do not add the BOS token.
    #[arg(long)]
    no_bos: bool,
    /// Parse special-token text.
    #[arg(long)]
    special: bool,
    /// Pre-tokenizer, by its `tokenizer.ggml.pre` name, used whatever the file says
    /// (without it: the file's own, llama3 when it names none).
    #[arg(long, value_parser = common::parse_pre)]
    pre_tokenizer: Option<PreTokenizer>,
    /// Text to tokenize.
    text: String,
}

/// Prints the ids of a text as a JSON list.
pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let f =
        ternion::mlc::open(&a.model).with_context(|| format!("reading {}", a.model.display()))?;
    let tok = Tokenizer::from_gguf(&f, &common::tokenizer_options(a.pre_tokenizer))?;
    let ids = tok.encode(&a.text, tok.add_bos() && !a.no_bos, a.special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
