//! `ternion run`: one prompt, streamed or as JSON; the sampling flags `chat` shares.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use ternion::sample::{Sampler, SamplerConfig};
use ternion::session::{GenerateOptions, GenerationStats};

use crate::common::{self, ModelArgs};
use crate::constrain::ConstrainArgs;
use crate::prompt::PromptArgs;

/// Sampling settings.
#[derive(Args, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 means greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the best one (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for tokens seen in the last `repeat_last_n` (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed: the same seed and settings give the same tokens. -1 (the default) picks a
    /// random one; the seed used is printed to standard error as `seed: N`.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
}

impl SampleArgs {
    /// The sampler, with the seed resolved (and printed).
    pub fn sampler(&self) -> Result<Sampler> {
        let seed = match self.seed {
            -1 => u64::from(rand::random::<u32>()),
            s if s >= 0 => s as u64,
            s => bail!("--seed must be 0 or more, or -1 for a random seed; got {s}"),
        };
        eprintln!("seed: {seed}");
        Ok(Sampler::new(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed,
        })?)
    }
}

/// Arguments of `ternion run`.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    n_predict: usize,
    /// Do not stop at end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object (prompt_tokens, tokens, text, timings) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Stop string (repeatable): generation ends before it, and it is not printed.
    #[arg(long)]
    stop: Vec<String>,
    #[command(flatten)]
    constrain: ConstrainArgs,
}

/// Exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: i32 = 130;

/// A flag that the first SIGINT (Ctrl-C) sets; a second one exits at once with
/// [`EXIT_INTERRUPTED`].
pub fn interrupt_flag() -> Result<Arc<AtomicBool>> {
    use signal_hook::consts::SIGINT;
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_shutdown(SIGINT, EXIT_INTERRUPTED, flag.clone())?;
    signal_hook::flag::register(SIGINT, flag.clone())?;
    Ok(flag)
}

/// Runs `ternion run`. Ctrl-C during generation stops it after the current token; the
/// partial text and the statistics are printed as usual (`finish_reason`
/// "interrupted" with `--json`) and the process exits with status 130.
pub fn run(a: RunArgs) -> Result<()> {
    let mut l = common::load(&a.model, true)?;
    let ids = a.prompt.ids(&l.tokenizer)?;
    if ids.is_empty() {
        bail!("the prompt is empty");
    }
    if ids.len() >= l.n_ctx {
        bail!(
            "the prompt has {} tokens but the context holds {} (raise --ctx)",
            ids.len(),
            l.n_ctx
        );
    }
    let mut sampler = a.sample.sampler()?;
    let mut session = common::session(&l.model, &mut l.gpu, l.n_ctx);
    session.set_stops(a.stop.clone());
    a.constrain
        .apply(&mut session, &l.tokenizer, l.model.config().n_vocab)?;
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        ignore_eos: a.ignore_eos,
    };
    let interrupted = interrupt_flag()?;
    eprintln!(
        "generating up to {} tokens (Ctrl-C stops and prints what was done)",
        a.n_predict
    );
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    let stats = session.generate(&ids, &l.tokenizer, &mut sampler, &opts, |piece| {
        text.push_str(piece);
        if !a.json {
            // A closed stdout ends generation.
            if write!(out, "{piece}").and_then(|_| out.flush()).is_err() {
                return false;
            }
        }
        !interrupted.load(Ordering::Relaxed)
    })?;
    let interrupted = interrupted.load(Ordering::Relaxed);
    let finish = if interrupted {
        "interrupted"
    } else {
        stats.finish.as_str()
    };
    if a.json {
        let v = json!({
            "prompt_tokens": ids,
            "tokens": stats.generated,
            "text": text,
            "finish_reason": finish,
            "load_ms": l.load_time.as_secs_f64() * 1e3,
            "prompt_ms": stats.prompt_time.as_secs_f64() * 1e3,
            "decode_ms": stats.decode_time.as_secs_f64() * 1e3,
            "prompt_tok_s": stats.prompt_tok_s(),
            "decode_tok_s": stats.decode_tok_s(),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(out)?;
        if interrupted {
            eprintln!("interrupted");
        }
        print_stats(l.load_time, &stats);
    }
    if interrupted {
        out.flush()?;
        std::process::exit(EXIT_INTERRUPTED);
    }
    Ok(())
}

/// Prints load time and prompt and decode speed to standard error.
pub fn print_stats(load: std::time::Duration, s: &GenerationStats) {
    eprintln!(
        "load {:.2} s | prompt {} tokens, {:.1} tok/s | decode {} tokens, {:.1} tok/s",
        load.as_secs_f64(),
        s.prompt_tokens,
        s.prompt_tok_s(),
        s.generated.len(),
        s.decode_tok_s()
    );
}
