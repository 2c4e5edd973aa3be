//! Answers to generation requests: whole JSON bodies or server-sent event streams
//! ([`stream`]), in OpenAI's shapes, from the engine's events (tagged with their choice:
//! a request with `n` choices runs `n` sequences).

mod stream;

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use ternion::sample::TokenLogprobs;
use ternion::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::access::RequestLog;
use crate::api::ApiError;
use crate::engine::{Done, Event, Shared};
use crate::logprobs;
use crate::tools::{tool_calls, Tools};

pub(crate) use stream::stream_response;

/// Which endpoint an answer is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What an answer is labelled with.
pub(crate) struct Meta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub return_token_ids: bool,
    pub prompt_ids: Vec<u32>,
    /// The tokenizer (renders the tokens of log-probabilities).
    pub tok: Arc<Tokenizer>,
    /// The tools offered (chat): the answer is held to the end and read as a call or text.
    pub tools: Option<Tools>,
    /// Number of choices.
    pub n: usize,
    /// The request's log line, written once the answer is complete.
    pub log: Arc<RequestLog>,
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// One choice's answer as it arrives.
#[derive(Default)]
struct Choice {
    /// Its text (streams: held back while tools are offered).
    text: String,
    /// Its tokens' log-probabilities (streams: held back with the text).
    lps: Vec<TokenLogprobs>,
    /// Bytes of text streamed so far (the completions' `text_offset`).
    sent: usize,
    /// Its end.
    done: Option<Done>,
}

/// Usage over all choices: the prompt once, the completions added up.
fn total_usage(choices: &[Choice]) -> (usize, usize) {
    let prompt = choices
        .iter()
        .filter_map(|c| c.done.as_ref())
        .map(|d| d.prompt_tokens)
        .max()
        .unwrap_or(0);
    let completion = choices
        .iter()
        .filter_map(|c| c.done.as_ref())
        .map(|d| d.completion_tokens)
        .sum();
    (prompt, completion)
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    /// An answer or chunk (`chunk`) with `choices`, labelled with the request's id.
    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }

    /// One streamed chunk for choice `index`: a delta (chat) or text (completion).
    fn chunk(&self, index: usize, delta: Value, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": index, "delta": delta, "logprobs": null, "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": index, "text": text, "logprobs": null, "finish_reason": finish,
            }),
        };
        let mut v = self.envelope(true, json!([choice]));
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn text_chunk(&self, index: usize, text: &str) -> Value {
        self.chunk(index, json!({"content": text}), text, None)
    }

    /// The `tool_calls` array when tools were offered and `text` is a call to one.
    fn tool_calls(&self, index: usize, text: &str) -> Option<Value> {
        let (name, args) = self.tools.as_ref()?.parse_call(text)?;
        let suffix = self.id.rsplit('-').next().unwrap_or_default();
        Some(tool_calls(&format!("call_{suffix}_{index}"), &name, &args))
    }

    /// The `logprobs` of a choice whose tokens are `lps` and whose text (completions)
    /// starts at byte `offset`.
    fn logprobs(&self, lps: &[TokenLogprobs], offset: usize) -> Value {
        match self.kind {
            Kind::Chat => logprobs::chat(&self.tok, lps),
            Kind::Completion => logprobs::completion(&self.tok, lps, offset),
        }
    }

    /// A whole answer's choice `index`.
    fn whole_choice(&self, index: usize, c: &Choice, done: &Done) -> Value {
        let mut finish = done.finish.as_str();
        let mut choice = match self.kind {
            Kind::Chat => match self.tool_calls(index, &c.text) {
                Some(calls) => {
                    finish = "tool_calls";
                    json!({"role": "assistant", "content": null, "refusal": null,
                           "tool_calls": calls})
                }
                None => json!({"role": "assistant", "content": c.text, "refusal": null}),
            },
            Kind::Completion => json!(c.text),
        };
        let key = match self.kind {
            Kind::Chat => "message",
            Kind::Completion => "text",
        };
        let logprobs = match c.lps.is_empty() {
            true => Value::Null,
            false => self.logprobs(&c.lps, 0),
        };
        choice =
            json!({"index": index, key: choice, "logprobs": logprobs, "finish_reason": finish});
        if self.return_token_ids {
            choice["token_ids"] = json!(done.tokens);
        }
        choice
    }
}

/// The answer for a request the engine cannot take or dropped without a word (it has
/// stopped): 503, with the reason when the engine failed (a GPU fault).
pub(crate) fn engine_gone(shared: &Shared) -> ApiError {
    match shared.failed.get() {
        Some(e) => ApiError::from(e),
        None => ApiError::unavailable("the engine has stopped"),
    }
}

/// Waits for the whole answer. When the client goes away this future is dropped, and with
/// it the receiver: the engine cancels the sequences.
pub(crate) async fn whole_response(
    meta: Meta,
    mut rx: UnboundedReceiver<(usize, Event)>,
    shared: &Shared,
) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = (0..meta.n).map(|_| Choice::default()).collect();
    let mut left = meta.n;
    while left > 0 {
        let Some((i, ev)) = rx.recv().await else {
            return Err(engine_gone(shared));
        };
        let c = &mut choices[i];
        match ev {
            Event::Token { text, logprobs, .. } => {
                meta.log.first_token();
                c.text.push_str(&text);
                c.lps.extend(logprobs);
            }
            Event::Text(t) => c.text.push_str(&t),
            Event::Done(d) => {
                c.done = Some(d);
                left -= 1;
            }
            Event::Error(e) => return Err(ApiError::from(&e)),
        }
    }
    let (prompt, completion) = total_usage(&choices);
    meta.log.tokens(prompt, completion);
    let list: Vec<Value> = choices
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some(meta.whole_choice(i, c, c.done.as_ref()?)))
        .collect();
    let mut v = meta.envelope(false, json!(list));
    v["usage"] = usage(prompt, completion);
    if meta.return_token_ids {
        v["prompt_token_ids"] = json!(meta.prompt_ids);
    }
    Ok(Json(v).into_response())
}
