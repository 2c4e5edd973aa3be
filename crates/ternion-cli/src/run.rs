//! `ternion run` (one prompt, streamed or as JSON) and `ternion chat` (interactive).

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use ternion::chat::{ChatTemplate, Conversation, TurnText};
use ternion::sample::{Sampler, SamplerConfig};
use ternion::session::{GenerateOptions, GenerationStats};

use crate::common::{self, ModelArgs, PromptArgs};

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
    /// RNG seed (same seed and settings give the same tokens).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SampleArgs {
    fn sampler(&self) -> Result<Sampler> {
        Ok(Sampler::new(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: self.seed,
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
}

/// Exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: i32 = 130;

/// A flag that the first SIGINT (Ctrl-C) sets; a second one exits at once with
/// [`EXIT_INTERRUPTED`].
fn interrupt_flag() -> Result<Arc<AtomicBool>> {
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

fn print_stats(load: std::time::Duration, s: &GenerationStats) {
    eprintln!(
        "load {:.2} s | prompt {} tokens, {:.1} tok/s | decode {} tokens, {:.1} tok/s",
        load.as_secs_f64(),
        s.prompt_tokens,
        s.prompt_tok_s(),
        s.generated.len(),
        s.decode_tok_s()
    );
}

/// Arguments of `ternion chat`.
#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// System message.
    #[arg(long, short = 's')]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value_t = 512)]
    n_predict: usize,
}

/// What the user did at the prompt.
enum Input {
    /// A line of text (without its line ending).
    Line(String),
    /// End of input or an empty line.
    End,
    /// Ctrl-C.
    Interrupted,
}

/// Stdin read line by line on a thread of its own, so that the prompt can also notice
/// Ctrl-C (a signal does not interrupt a blocking read).
struct Lines {
    rx: std::sync::mpsc::Receiver<std::io::Result<String>>,
}

impl Lines {
    /// Starts the reader thread; it ends at end of input or on a read error.
    fn stdin() -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let stop = line.is_err();
                if tx.send(line).is_err() || stop {
                    break;
                }
            }
        });
        Lines { rx }
    }

    /// Waits for the next line, end of input, or `interrupted` (checked first and every
    /// 20 ms).
    fn next(&self, interrupted: &AtomicBool) -> Result<Input> {
        use std::sync::mpsc::RecvTimeoutError;
        loop {
            if interrupted.load(Ordering::Relaxed) {
                return Ok(Input::Interrupted);
            }
            match self.rx.recv_timeout(std::time::Duration::from_millis(20)) {
                Ok(line) => {
                    let line = line?;
                    let line = line.trim_end_matches('\r');
                    return Ok(if line.trim().is_empty() {
                        Input::End
                    } else {
                        Input::Line(line.to_owned())
                    });
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(Input::End),
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

/// Totals over the replies of a chat.
#[derive(Default)]
struct ChatTotals {
    replies: usize,
    prompt_tokens: usize,
    generated: usize,
    decode_time: std::time::Duration,
}

impl ChatTotals {
    fn add(&mut self, s: &GenerationStats) {
        self.replies += 1;
        self.prompt_tokens += s.prompt_tokens;
        self.generated += s.generated.len();
        self.decode_time += s.decode_time;
    }

    fn print(&self) {
        eprintln!(
            "chat ended: {} replies, {} prompt tokens fed, {} tokens generated ({:.1} tok/s)",
            self.replies,
            self.prompt_tokens,
            self.generated,
            self.generated as f64 / self.decode_time.as_secs_f64().max(1e-9)
        );
    }
}

/// Runs `ternion chat`: reads user turns from stdin, streams replies. Ctrl-C while a
/// reply is generated stops that reply after the current token (the partial reply stays
/// in the conversation, as a reply cut by `-n` does) and returns to the prompt; Ctrl-C at
/// the prompt prints the totals and exits with status 130; end of input or an empty line
/// prints them and exits normally.
pub fn chat(a: ChatArgs) -> Result<()> {
    let mut l = common::load(&a.model, true)?;
    let tok = &l.tokenizer;
    let template = ChatTemplate::from_metadata(l.file.get_str("tokenizer.chat_template")?);
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
            .unwrap_or_default()
    };
    let mut conv = Conversation::new(
        template,
        piece(tok.bos_id()),
        piece(tok.eos_id()),
        a.system.clone(),
    );
    let mut sampler = a.sample.sampler()?;
    let mut session = common::session(&l.model, &mut l.gpu, l.n_ctx);
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        ignore_eos: false,
    };
    let interrupted = interrupt_flag()?;
    eprintln!(
        "Loaded in {:.2} s. Type a message; an empty line, Ctrl-D or Ctrl-C ends the chat \
         (Ctrl-C during a reply stops the reply).",
        l.load_time.as_secs_f64()
    );
    let lines = Lines::stdin();
    let mut totals = ChatTotals::default();
    let mut first = true;
    loop {
        eprint!("> ");
        let line = match lines.next(&interrupted)? {
            Input::Line(line) => line,
            Input::End => break,
            Input::Interrupted => {
                eprintln!();
                totals.print();
                std::process::exit(EXIT_INTERRUPTED);
            }
        };
        let ids = match conv.add_user(&line)? {
            TurnText::Append(t) => tok.encode(&t, first && tok.add_bos(), true)?,
            TurnText::Restart(t) => {
                session.reset();
                tok.encode(&t, tok.add_bos(), true)?
            }
        };
        first = false;
        if ids.len() + 1 >= session.room() {
            bail!(
                "the conversation no longer fits the context ({} tokens); raise --ctx",
                session.n_ctx()
            );
        }
        let mut reply = String::new();
        let mut out = std::io::stdout().lock();
        let stats = session.generate(&ids, tok, &mut sampler, &opts, |p| {
            reply.push_str(p);
            write!(out, "{p}").and_then(|_| out.flush()).is_ok()
                && !interrupted.load(Ordering::Relaxed)
        })?;
        // Cleared before anything is printed: once "interrupted" shows, a Ctrl-C is one at
        // the prompt.
        let was_interrupted = interrupted.swap(false, Ordering::Relaxed);
        writeln!(out)?;
        if was_interrupted {
            eprintln!("interrupted");
        }
        print_stats(l.load_time, &stats);
        totals.add(&stats);
        conv.add_assistant(&reply);
    }
    totals.print();
    Ok(())
}
