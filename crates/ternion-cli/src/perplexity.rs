//! `ternion perplexity`: a model's perplexity over a text file, computed as llama.cpp's
//! `llama-perplexity` computes it (`perplexity()` in tools/perplexity/perplexity.cpp), so
//! the figures of the two can be compared.
//!
//! The whole text is tokenized (BOS first when the vocabulary adds it) and cut into
//! chunks of `n_ctx` tokens; the tail that fills no chunk is dropped. Each chunk runs from
//! an empty cache, with BOS in place of its first token when the vocabulary adds BOS, and
//! only its second half is scored: the logits at positions `n_ctx/2 ..= n_ctx-2`, each
//! predicting the token after it. The running perplexity is printed after each chunk as
//! `[i]ppl,`, then `Final estimate: PPL = X +/- Y`, Y being the standard error of the mean
//! negative log-likelihood times the perplexity.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

use crate::common::{self, ModelArgs};
use crate::prompt;

/// `-c` without a value: llama-perplexity's default context.
const DEFAULT_CTX: usize = 512;

/// Arguments of `ternion perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score (`-`: standard input).
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Score at most this many chunks (default: every whole chunk of the text).
    #[arg(long)]
    chunks: Option<usize>,
    /// Print one JSON object (perplexity, uncertainty, counts, running perplexities,
    /// evaluation speed) instead of the text report.
    #[arg(long)]
    json: bool,
}

/// The sums llama.cpp keeps over the scored positions: of the negative log-likelihoods
/// and of their squares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Nll {
    /// Sum of the negative log-likelihoods.
    sum: f64,
    /// Sum of their squares.
    sum2: f64,
    /// Positions scored.
    count: usize,
}

impl Nll {
    /// Scores one position: `row` is its logits, `target` the token that follows it.
    pub fn add(&mut self, row: &[f32], target: u32) {
        let v = -log_softmax(row, target as usize);
        self.sum += v;
        self.sum2 += v * v;
        self.count += 1;
    }

    /// Scores the second half of a chunk: `logits` holds one row of `n_vocab` per token
    /// of `chunk`; positions `chunk.len()/2 ..= chunk.len()-2` predict the token after them.
    pub fn add_chunk(&mut self, logits: &[f32], chunk: &[u32], n_vocab: usize) {
        for j in chunk.len() / 2..chunk.len().saturating_sub(1) {
            self.add(&logits[j * n_vocab..(j + 1) * n_vocab], chunk[j + 1]);
        }
    }

    /// Positions scored.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The perplexity: e to the mean negative log-likelihood.
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// llama.cpp's uncertainty of [`Nll::ppl`]: the standard error of the mean negative
    /// log-likelihood (`sqrt(var / (count - 1))`) times the perplexity; `None` when the
    /// variance is not positive (llama.cpp then prints no estimate).
    pub fn uncertainty(&self) -> Option<f64> {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        (var > 0.0 && self.count > 1).then(|| (var / (n - 1.0)).sqrt() * self.ppl())
    }
}

/// `log softmax(row)[tok]` with llama.cpp's arithmetic: the maximum and each
/// `exp(logit - max)` in f32, their sum and its logarithm in f64.
pub fn log_softmax(row: &[f32], tok: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from((v - max).exp())).sum();
    f64::from(row[tok] - max) - sum.ln()
}

/// How the text is cut: `n_chunk` chunks of `n_ctx` tokens.
fn plan(n_tokens: usize, n_ctx: usize, limit: Option<usize>) -> Result<usize> {
    if n_tokens < 2 * n_ctx {
        bail!(
            "you need at least {} tokens to evaluate perplexity with a context of {n_ctx}; \
             the text tokenizes to only {n_tokens} tokens",
            2 * n_ctx
        );
    }
    let n_chunk = n_tokens / n_ctx;
    match limit {
        Some(0) => bail!("--chunks must be at least 1"),
        Some(l) => Ok(n_chunk.min(l)),
        None => Ok(n_chunk),
    }
}

/// The context size: `-c`, else 512; at least 3 (a chunk must score a position) and at
/// most the model's training context.
fn context(ctx: Option<usize>, n_ctx_train: usize) -> Result<usize> {
    let n_ctx = ctx.unwrap_or(DEFAULT_CTX);
    if n_ctx < 3 {
        bail!("--ctx-size must be at least 3 (a chunk scores positions n_ctx/2 to n_ctx-2)");
    }
    if n_ctx > n_ctx_train {
        bail!(
            "--ctx-size {n_ctx} is more than the model's context of {n_ctx_train} tokens \
             (give -c {n_ctx_train} or less)"
        );
    }
    Ok(n_ctx)
}

/// Runs `ternion perplexity`.
pub fn run(a: PerplexityArgs) -> Result<()> {
    let text = prompt::read_text(&a.file)?;
    let mut l =
        common::load_with_ctx(&a.model, false, |cfg| context(a.model.ctx, cfg.n_ctx_train))?;
    let n_ctx = l.n_ctx;
    let add_bos = l.tokenizer.add_bos();
    let tokens = l.tokenizer.encode(&text, add_bos, false)?;
    let n_chunk = plan(tokens.len(), n_ctx, a.chunks)?;
    let bos = if add_bos {
        let id = l.tokenizer.bos_id();
        Some(id.context("the vocabulary adds BOS but names no BOS token")?)
    } else {
        None
    };
    let n_vocab = l.model.config().n_vocab;
    eprintln!(
        "perplexity: {} tokens; {n_chunk} chunks of {n_ctx}, scoring {} positions each",
        tokens.len(),
        n_ctx - 1 - n_ctx / 2
    );
    let mut session = common::session(&l.model, &mut l.gpu, n_ctx);
    let mut nll = Nll::default();
    let mut running = Vec::with_capacity(n_chunk);
    let mut out = std::io::stdout().lock();
    let t0 = Instant::now();
    for (i, chunk) in tokens.chunks_exact(n_ctx).take(n_chunk).enumerate() {
        let mut chunk = chunk.to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        session.reset();
        let logits = session.logits_all(&chunk)?;
        nll.add_chunk(&logits, &chunk, n_vocab);
        running.push(nll.ppl());
        if i == 0 {
            let pass = t0.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {pass:.2} seconds per pass - ETA {:.2} minutes",
                pass * n_chunk as f64 / 60.0
            );
        }
        let progress = format!("[{}]{:.4},", i + 1, nll.ppl());
        if a.json {
            eprint!("{progress}");
        } else {
            write!(out, "{progress}")?;
            out.flush()?;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let tok_s = (n_chunk * n_ctx) as f64 / secs.max(1e-9);
    let (ppl, err) = (nll.ppl(), nll.uncertainty());
    if a.json {
        eprintln!();
        let report = json!({
            "ppl": ppl,
            "uncertainty": err,
            "n_ctx": n_ctx,
            "chunks": n_chunk,
            "tokens": tokens.len(),
            "scored": nll.count(),
            "running_ppl": running,
            "eval_seconds": secs,
            "eval_tok_s": tok_s,
        });
        writeln!(out, "{report}")?;
    } else {
        writeln!(out)?;
        match err {
            Some(e) => writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {e:.5}")?,
            None => {
                eprintln!("Unexpected negative standard deviation of log(prob)");
                writeln!(out, "Final estimate: PPL = {ppl:.4}")?;
            }
        }
    }
    eprintln!(
        "evaluated {} tokens in {secs:.2} s ({tok_s:.1} tok/s)",
        n_chunk * n_ctx
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A three-token vocabulary where the logits (0, ln 2, ln 5) give the probabilities
    /// 1/8, 2/8 and 5/8.
    fn row() -> Vec<f32> {
        vec![0.0, 2f32.ln(), 5f32.ln()]
    }

    #[test]
    fn log_softmax_of_a_hand_computed_row() {
        for (tok, p) in [(0, 1.0 / 8.0), (1, 2.0 / 8.0), (2, 5.0 / 8.0)] {
            let got = log_softmax(&row(), tok);
            assert!((got - f64::ln(p)).abs() < 1e-6, "token {tok}: {got}");
        }
        // A large shift changes nothing (the maximum is taken out first).
        let shifted: Vec<f32> = row().iter().map(|v| v + 1000.0).collect();
        assert!((log_softmax(&shifted, 2) - f64::ln(5.0 / 8.0)).abs() < 1e-4);
    }

    #[test]
    fn perplexity_and_uncertainty_of_two_positions() {
        let mut nll = Nll::default();
        nll.add(&row(), 0); // -ln(1/8) = 3 ln 2
        nll.add(&row(), 1); // -ln(2/8) = 2 ln 2
        let ln2 = 2f64.ln();
        // Mean 2.5 ln 2: PPL = 2^2.5. Variance (9 + 4)/2 ln²2 - 6.25 ln²2 = 0.25 ln²2, so
        // the standard error is sqrt(0.25 ln²2 / 1) = 0.5 ln 2.
        assert_eq!(nll.count(), 2);
        assert!((nll.ppl() - 2f64.powf(2.5)).abs() < 1e-5, "{}", nll.ppl());
        let err = nll.uncertainty().expect("a positive variance");
        assert!((err - 0.5 * ln2 * 2f64.powf(2.5)).abs() < 1e-5, "{err}");
    }

    #[test]
    fn equal_scores_have_no_uncertainty() {
        let mut nll = Nll::default();
        nll.add(&row(), 2);
        nll.add(&row(), 2);
        assert!((nll.ppl() - 8.0 / 5.0).abs() < 1e-6);
        assert_eq!(nll.uncertainty(), None);
    }

    #[test]
    fn a_chunk_scores_its_second_half_predicting_the_next_token() {
        // Six positions: rows 3 and 4 are scored, predicting chunk[4] and chunk[5]; the
        // other rows are NaN, so reading any of them would spoil the result.
        let chunk = [9, 9, 9, 9, 0, 1];
        let mut logits = vec![f32::NAN; 6 * 3];
        logits[9..12].copy_from_slice(&row());
        logits[12..15].copy_from_slice(&row());
        let mut nll = Nll::default();
        nll.add_chunk(&logits, &chunk, 3);
        assert_eq!(nll.count(), 2);
        assert!((nll.ppl() - 2f64.powf(2.5)).abs() < 1e-5);
    }

    #[test]
    fn the_text_must_hold_two_contexts() {
        let e = plan(1023, 512, None).unwrap_err().to_string();
        assert!(
            e.contains("at least 1024 tokens") && e.contains("only 1023"),
            "{e}"
        );
        assert_eq!(plan(1024, 512, None).unwrap(), 2);
        assert_eq!(plan(1600, 512, None).unwrap(), 3);
        assert_eq!(plan(1600, 512, Some(1)).unwrap(), 1);
        assert_eq!(plan(1600, 512, Some(9)).unwrap(), 3);
        assert!(plan(1600, 512, Some(0)).is_err());
    }

    #[test]
    fn the_context_defaults_to_512_within_the_model_s() {
        assert_eq!(context(None, 4096).unwrap(), 512);
        assert_eq!(context(Some(64), 4096).unwrap(), 64);
        let e = context(Some(8192), 4096).unwrap_err().to_string();
        assert!(e.contains("8192") && e.contains("4096"), "{e}");
        assert!(context(Some(2), 4096).is_err());
    }
}
