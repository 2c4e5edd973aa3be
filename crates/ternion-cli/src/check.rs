//! Whether a model would load and generate: everything `run` checks, gathered as a list
//! of problems for `inspect`, and the token-id checks `run` adds to the library's.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ternion::gguf::GgufFile;
use ternion::model::{LoadOptions, Model};
use ternion::tokenizer::{Tokenizer, TokenizerOptions};

/// The metadata keys that name special tokens.
const SPECIAL_KEYS: [&str; 9] = [
    "bos",
    "eos",
    "eot",
    "eom",
    "unknown",
    "seperator",
    "padding",
    "mask",
    "cls",
];

/// Problems with the token ids of `file`: a special token (BOS, EOS, ...) past the end of
/// the vocabulary, or a vocabulary larger than the embedding's `n_vocab` rows (its last
/// ids would have no row).
fn token_problems(file: &GgufFile, n_embd_rows: Option<usize>) -> Vec<String> {
    let mut problems = Vec::new();
    let n_tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map(<[_]>::len);
    if let (Some(n), Some(rows)) = (n_tokens, n_embd_rows) {
        if n > rows {
            problems.push(format!(
                "the vocabulary has {n} tokens but the embedding only {rows} rows"
            ));
        }
    }
    let Some(n) = n_tokens.or(n_embd_rows) else {
        return problems;
    };
    for name in SPECIAL_KEYS {
        let key = format!("tokenizer.ggml.{name}_token_id");
        match file.get_u32(&key) {
            Ok(Some(id)) if id as usize >= n => problems.push(format!(
                "{key} = {id} is past the vocabulary ({n} tokens, ids 0..{})",
                n - 1
            )),
            Ok(_) => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    problems
}

/// [`token_problems`] as one error (what `run`, `chat` and `serve` refuse).
pub fn special_tokens(file: &GgufFile, n_embd_rows: usize) -> Result<()> {
    let problems = token_problems(file, Some(n_embd_rows));
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(())
}

/// [`special_tokens`] for the GGUF file at `path`, read without loading the model (for
/// `serve`, whose engine loads it); an MLC directory is converted with its own checked
/// vocabulary and passes.
pub fn special_tokens_at(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    let file = GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    let rows = embedding_rows(&file);
    let problems = token_problems(&file, rows);
    if !problems.is_empty() {
        bail!("loading {}: {}", path.display(), problems.join("; "));
    }
    Ok(())
}

/// The rows of the token embedding (the model's `n_vocab`), when the file has one.
fn embedding_rows(file: &GgufFile) -> Option<usize> {
    file.tensor("token_embd.weight")
        .and_then(|t| t.shape.get(1))
        .map(|&r| r as usize)
}

/// Every reason `run` would refuse the model in `file` (empty when it loads): memory,
/// configuration and architecture, tensor presence, shapes and types, the tokenizer, and
/// the token ids. The model, when it loads, is returned for its configuration.
pub fn problems(file: &Arc<GgufFile>, tok: &TokenizerOptions) -> (Vec<String>, Option<Model>) {
    let mut problems = Vec::new();
    if let Err(e) = ternion::limits::check_model_fits(file) {
        problems.push(e.to_string());
    }
    let model = match Model::from_file(file.clone(), &LoadOptions::default()) {
        Ok(m) => Some(m),
        Err(e) => {
            problems.push(e.to_string());
            None
        }
    };
    if let Err(e) = Tokenizer::from_gguf(file, tok) {
        problems.push(format!("tokenizer: {e}"));
    }
    let rows = model
        .as_ref()
        .map(|m| m.config().n_vocab)
        .or_else(|| embedding_rows(file));
    problems.extend(token_problems(file, rows));
    (problems, model)
}
