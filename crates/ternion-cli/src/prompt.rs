//! Prompt input of `run` and `logits`: text (`-p`), a file (`-f`), standard input
//! (`-p -` or `-f -`), or token ids; [`read_text`] also reads `perplexity`'s text.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use ternion::tokenizer::Tokenizer;

/// Prompt input shared by `run` and `logits`.
#[derive(Args, Clone)]
pub struct PromptArgs {
    /// Prompt text (tokenized; BOS added when the model asks for it); `-` reads it from
    /// standard input.
    #[arg(long, short = 'p', conflicts_with_all = ["tokens", "file"])]
    pub prompt: Option<String>,
    /// Read the prompt text from a file (`-`: standard input), used as is.
    #[arg(long, short = 'f', conflicts_with = "tokens")]
    pub file: Option<PathBuf>,
    /// Comma-separated token ids, used as given.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Do not add the BOS token.
    #[arg(long)]
    pub no_bos: bool,
    /// Parse special-token text (like `<|eot_id|>`) in the prompt.
    #[arg(long)]
    pub special: bool,
}

/// The whole of standard input as text.
fn read_stdin() -> Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("reading standard input")?;
    Ok(s)
}

/// The text of the file `p`, or of standard input when `p` is `-`.
pub fn read_text(p: &Path) -> Result<String> {
    if p.as_os_str() == "-" {
        return read_stdin();
    }
    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

impl PromptArgs {
    /// The prompt text, read from where the flags say; `None` when token ids are given.
    fn text(&self) -> Result<Option<String>> {
        Ok(match (&self.prompt, &self.file) {
            (Some(p), _) if p == "-" => Some(read_stdin()?),
            (Some(p), _) => Some(p.clone()),
            (None, Some(f)) => Some(read_text(f)?),
            (None, None) => None,
        })
    }

    /// The prompt's token ids.
    pub fn ids(&self, tok: &Tokenizer) -> Result<Vec<u32>> {
        if let Some(ids) = &self.tokens {
            return Ok(ids.clone());
        }
        match self.text()? {
            Some(text) => Ok(tok.encode(&text, tok.add_bos() && !self.no_bos, self.special)?),
            None => bail!(
                "give a prompt with --prompt TEXT, --file PATH (- for standard input) or \
                 --tokens IDS"
            ),
        }
    }
}
