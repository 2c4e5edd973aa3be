//! `ternion inspect` (metadata, tensor table, and whether the model loads) and
//! `ternion tokenize`.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use ternion::tokenizer::{PreTokenizer, Tokenizer};

use crate::{check, common, hub};

/// Arguments of `ternion inspect`.
#[derive(Args)]
pub struct InspectArgs {
    /// GGUF file or MLC `q4f16_1` directory (shown as the GGUF it converts to).
    file: PathBuf,
    /// Pre-tokenizer, by its `tokenizer.ggml.pre` name (as for `run`).
    #[arg(long, value_parser = common::parse_pre)]
    pre_tokenizer: Option<PreTokenizer>,
}

/// Prints metadata and tensors, then loads the model as `run` would: a file `run` would
/// refuse is an error that lists every problem found.
pub fn inspect(a: InspectArgs) -> Result<()> {
    let path = hub::resolve(&a.file)?;
    let f = ternion::mlc::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "GGUF v{}, {} bytes, {} metadata entries, {} tensors, alignment {}",
        f.version,
        f.file_len(),
        f.metadata.len(),
        f.tensors.len(),
        f.alignment
    )?;
    writeln!(out, "\nmetadata:")?;
    for (k, v) in &f.metadata {
        writeln!(out, "  {k} = {}", v.summary())?;
    }
    writeln!(out, "\ntensors:")?;
    for t in &f.tensors {
        writeln!(
            out,
            "  {:<32} {:<6} {:<20} offset {:>12}  {:>12} bytes",
            t.name,
            t.ty.name(),
            format!("{:?}", t.shape),
            t.offset,
            t.size
        )?;
    }
    let file = Arc::new(f);
    let (problems, model) = check::problems(&file, &common::tokenizer_options(a.pre_tokenizer));
    if let Some(m) = &model {
        writeln!(out, "\nmodel: {:?}", m.config())?;
    }
    out.flush()?;
    if !problems.is_empty() {
        bail!(
            "{}: {} problem(s), `ternion run` would refuse this model:\n  - {}",
            path.display(),
            problems.len(),
            problems.join("\n  - ")
        );
    }
    writeln!(out, "\nOK: the model loads as `ternion run` loads it")?;
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
    /// Text to tokenize (`-`: standard input).
    text: String,
}

/// Prints the ids of a text as a JSON list.
pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let path = hub::resolve(&a.model)?;
    let f = ternion::mlc::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&f, &common::tokenizer_options(a.pre_tokenizer))?;
    let text = if a.text == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the text from standard input")?;
        s
    } else {
        a.text
    };
    let ids = tok.encode(&text, tok.add_bos() && !a.no_bos, a.special)?;
    writeln!(std::io::stdout(), "{}", serde_json::to_string(&ids)?)?;
    Ok(())
}
