//! `ternion chat`: an interactive, streaming, multi-turn chat that reuses the KV cache.
//!
//! Input: one line is one message; a line ending in `\` continues on the next line, and a
//! line `"""` opens a block that the next `"""` line closes. Commands: `/reset` (forget the
//! conversation, keep the system prompt), `/save FILE` (the conversation as JSON messages,
//! OpenAI's shape), `/exit`. `--json-schema` and the other constraint flags of `run` hold
//! every reply to that output. End of input (Ctrl-D) ends the chat;
//! an empty line does nothing. When a new message and its reply no longer fit the
//! context, the oldest turns are dropped (the system prompt stays) and the chat goes on.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use clap::Args;
use ternion::chat::{ChatTemplate, Conversation, Message, TurnText};
use ternion::session::{GenerateOptions, GenerationStats};
use ternion::tokenizer::Tokenizer;

use crate::common::{self, ModelArgs};
use crate::constrain::ConstrainArgs;
use crate::run::{interrupt_flag, print_stats, SampleArgs, EXIT_INTERRUPTED};

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
    #[command(flatten)]
    constrain: ConstrainArgs,
}

/// What the user did at the prompt.
enum Input {
    /// A message (its lines joined by newlines).
    Message(String),
    /// `/reset`.
    Reset,
    /// `/save FILE` (the text after the command, trimmed).
    Save(String),
    /// `/exit` or end of input.
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

    /// The next line (without its line ending), `None` at end of input, or `Err(true)`
    /// when `interrupted` is set (checked first and every 20 ms).
    fn line(&self, interrupted: &AtomicBool) -> Result<Option<String>, bool> {
        use std::sync::mpsc::RecvTimeoutError;
        loop {
            if interrupted.load(Ordering::Relaxed) {
                return Err(true);
            }
            match self.rx.recv_timeout(std::time::Duration::from_millis(20)) {
                Ok(Ok(line)) => return Ok(Some(line.trim_end_matches('\r').to_owned())),
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => return Ok(None),
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Reads one message or command, prompting with `> ` (and `. ` for continued lines).
    fn next(&self, interrupted: &AtomicBool) -> Input {
        let mut text = String::new();
        let mut block = false;
        eprint!("> ");
        loop {
            let line = match self.line(interrupted) {
                Ok(Some(line)) => line,
                Ok(None) => return Input::End,
                Err(_) => return Input::Interrupted,
            };
            if line.trim() == "\"\"\"" {
                if block {
                    return Input::Message(text);
                }
                block = true;
            } else if block {
                text.push_str(&line);
                text.push('\n');
            } else if let Some(head) = line.strip_suffix('\\') {
                text.push_str(head);
                text.push('\n');
            } else {
                text.push_str(&line);
                match text.trim() {
                    "" => {
                        text.clear();
                        eprint!("> ");
                        continue;
                    }
                    "/exit" | "/quit" => return Input::End,
                    "/reset" => return Input::Reset,
                    t if t == "/save" || t.starts_with("/save ") => {
                        return Input::Save(t["/save".len()..].trim().to_owned())
                    }
                    _ => return Input::Message(text),
                }
            }
            eprint!(". ");
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

/// The conversation and what it needs to be rebuilt (after `/reset` or when old turns are
/// dropped).
struct Dialog<'t> {
    conv: Conversation,
    template: ChatTemplate,
    bos: String,
    eos: String,
    system: Option<String>,
    tok: &'t Tokenizer,
    /// Whether nothing was fed to the model yet (the next text gets the BOS token).
    fresh: bool,
}

impl Dialog<'_> {
    /// A conversation holding the system prompt and `history` (user and assistant
    /// messages in turn).
    fn rebuild(&mut self, history: &[Message]) -> Result<()> {
        self.conv = Conversation::new(
            self.template.clone(),
            (self.bos.clone(), self.eos.clone()),
            self.tok.add_bos(),
            self.system.clone(),
        );
        for m in history {
            if m.role == "assistant" {
                self.conv.add_assistant(&m.content);
            } else {
                self.conv.add_user(&m.content)?;
            }
        }
        self.fresh = true;
        Ok(())
    }

    /// Writes every message, the system prompt's included, to `path` as a JSON array of
    /// `{"role", "content"}` objects (OpenAI's shape); returns how many.
    fn save(&self, path: &str) -> Result<usize> {
        let messages: Vec<serde_json::Value> = self
            .conv
            .messages()
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect();
        let text = serde_json::to_string_pretty(&messages)? + "\n";
        std::fs::write(path, text).with_context(|| format!("writing {path}"))?;
        Ok(messages.len())
    }

    /// The messages after the system prompt.
    fn history(&self) -> Vec<Message> {
        let skip = usize::from(self.system.is_some());
        self.conv.messages()[skip..].to_vec()
    }

    /// Adds a user message; returns the ids to feed and whether the KV cache must be
    /// cleared first.
    fn add_user(&mut self, text: &str) -> Result<(Vec<u32>, bool)> {
        let (text, restart) = match self.conv.add_user(text)? {
            TurnText::Append(t) => (t, self.fresh),
            TurnText::Restart(t) => (t, true),
        };
        let bos = restart && self.tok.add_bos();
        self.fresh = false;
        Ok((self.tok.encode(&text, bos, true)?, restart))
    }

    /// Adds `text` after dropping the oldest turns until it and `headroom` reply tokens
    /// fit `n_ctx`; returns the ids of the whole rebuilt conversation and how many turns
    /// were dropped, or `None` when the message does not fit even alone.
    fn add_user_shifted(
        &mut self,
        text: &str,
        headroom: usize,
        n_ctx: usize,
    ) -> Result<Option<(Vec<u32>, usize)>> {
        let mut history = self.history();
        history.pop();
        let mut dropped = 0;
        while !history.is_empty() {
            // One turn: a user message and whatever follows it up to the next one.
            let end = (1..history.len())
                .find(|&i| history[i].role == "user")
                .unwrap_or(history.len());
            history.drain(..end);
            dropped += 1;
            self.rebuild(&history)?;
            self.conv.add_user(text)?;
            self.fresh = false;
            let ids = self
                .tok
                .encode(self.conv.fed_text(), self.tok.add_bos(), true)?;
            if ids.len() + headroom <= n_ctx {
                return Ok(Some((ids, dropped)));
            }
        }
        self.rebuild(&[])?;
        Ok(None)
    }
}

/// Runs `ternion chat`: reads user turns from stdin, streams replies. Ctrl-C while a
/// reply is generated stops that reply after the current token (the partial reply stays
/// in the conversation, as a reply cut by `-n` does) and returns to the prompt; Ctrl-C at
/// the prompt prints the totals and exits with status 130; end of input or `/exit` prints
/// them and exits normally.
pub fn chat(a: ChatArgs) -> Result<()> {
    let mut l = common::load(&a.model, true)?;
    let tok = &l.tokenizer;
    let template = ChatTemplate::from_metadata(l.file.get_str("tokenizer.chat_template")?);
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
            .unwrap_or_default()
    };
    let (bos, eos) = (piece(tok.bos_id()), piece(tok.eos_id()));
    let mut dialog = Dialog {
        conv: Conversation::new(
            template.clone(),
            (bos.clone(), eos.clone()),
            tok.add_bos(),
            a.system.clone(),
        ),
        template,
        bos,
        eos,
        system: a.system.clone(),
        tok,
        fresh: true,
    };
    let mut sampler = a.sample.sampler()?;
    let constrainer = a.constrain.constrainer(tok, l.model.config().n_vocab)?;
    let mut session = common::session(&l.model, &mut l.gpu, l.n_ctx);
    let opts = GenerateOptions {
        max_tokens: a.n_predict,
        ignore_eos: false,
    };
    // Room kept for a reply when old turns are dropped.
    let headroom = a.n_predict.clamp(1, (session.n_ctx() / 2).max(1));
    let interrupted = interrupt_flag()?;
    eprintln!(
        "Loaded in {:.2} s. Type a message (end a line with \\ to continue it, or put it \
         between \"\"\" lines); /reset clears the conversation; /save FILE writes it as JSON; \
         /exit, Ctrl-D or Ctrl-C ends the chat (Ctrl-C during a reply stops the reply).",
        l.load_time.as_secs_f64()
    );
    let lines = Lines::stdin();
    let mut totals = ChatTotals::default();
    loop {
        let text = match lines.next(&interrupted) {
            Input::Message(text) => text,
            Input::Reset => {
                dialog.rebuild(&[])?;
                session.reset();
                eprintln!("[conversation cleared]");
                continue;
            }
            Input::Save(path) if path.is_empty() => {
                eprintln!("[usage: /save FILE]");
                continue;
            }
            Input::Save(path) => {
                match dialog.save(&path) {
                    Ok(n) => eprintln!("[saved {n} messages to {path}]"),
                    Err(e) => eprintln!("[not saved: {e:#}]"),
                }
                continue;
            }
            Input::End => break,
            Input::Interrupted => {
                eprintln!();
                totals.print();
                std::process::exit(EXIT_INTERRUPTED);
            }
        };
        let (mut ids, restart) = dialog.add_user(&text)?;
        if restart {
            session.reset();
        }
        if ids.len() + headroom > session.room() {
            match dialog.add_user_shifted(&text, headroom, session.n_ctx())? {
                Some((all, dropped)) => {
                    session.reset();
                    ids = all;
                    eprintln!(
                        "[context full: dropped the {dropped} oldest turn(s); the system \
                         prompt is kept]"
                    );
                }
                None => {
                    session.reset();
                    eprintln!(
                        "[this message does not fit the context of {} tokens with room for \
                         a reply; the conversation was cleared: send a shorter message or \
                         raise --ctx]",
                        session.n_ctx()
                    );
                    continue;
                }
            }
        }
        if let Some(c) = &constrainer {
            c.apply(&mut session)?;
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
        dialog.conv.add_assistant(&reply);
    }
    totals.print();
    Ok(())
}
