//! Answers to generation requests: whole JSON bodies or server-sent event streams, in
//! OpenAI's shapes, from the engine's events.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use ternion::sample::TokenLogprobs;
use ternion::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::access::RequestLog;
use crate::api::ApiError;
use crate::engine::{Event, Shared};
use crate::logprobs;
use crate::tools::{tool_calls, Tools};

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

    /// One streamed chunk with one choice: a delta (chat) or text (completion).
    fn chunk(&self, delta: Value, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
            }),
        };
        let mut v = self.envelope(true, json!([choice]));
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn text_chunk(&self, text: &str) -> Value {
        self.chunk(json!({"content": text}), text, None)
    }

    /// The `tool_calls` array when tools were offered and `text` is a call to one.
    fn tool_calls(&self, text: &str) -> Option<Value> {
        let (name, args) = self.tools.as_ref()?.parse_call(text)?;
        let suffix = self.id.rsplit('-').next().unwrap_or_default();
        Some(tool_calls(&format!("call_{suffix}"), &name, &args))
    }

    /// The `logprobs` of a choice whose tokens are `lps` and whose text (completions)
    /// starts at byte `offset`.
    fn logprobs(&self, lps: &[TokenLogprobs], offset: usize) -> Value {
        match self.kind {
            Kind::Chat => logprobs::chat(&self.tok, lps),
            Kind::Completion => logprobs::completion(&self.tok, lps, offset),
        }
    }
}

fn sse_json(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// Streams the answer as server-sent events. When the client goes away the stream and with
/// it the receiver are dropped, and the engine cancels the sequence.
pub(crate) fn stream_response(
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    shared: Arc<Shared>,
) -> Response {
    struct St {
        meta: Meta,
        rx: UnboundedReceiver<Event>,
        shared: Arc<Shared>,
        queue: VecDeque<SseEvent>,
        done: bool,
        /// Bytes of text streamed so far (the completions' `text_offset`).
        sent: usize,
        /// Text and log-probabilities held back while tools are offered.
        held: String,
        held_lps: Vec<TokenLogprobs>,
    }
    let mut queue = VecDeque::new();
    if meta.kind == Kind::Chat {
        queue.push_back(sse_json(&meta.chunk(
            json!({"role": "assistant", "content": ""}),
            "",
            None,
        )));
    }
    let st = St {
        meta,
        rx,
        shared,
        queue,
        done: false,
        sent: 0,
        held: String::new(),
        held_lps: Vec::new(),
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Token { text, logprobs, .. }) if st.meta.tools.is_some() => {
                    st.meta.log.first_token();
                    st.held.push_str(&text);
                    st.held_lps.extend(logprobs);
                }
                Some(Event::Text(t)) if st.meta.tools.is_some() => st.held.push_str(&t),
                Some(Event::Token { id, text, logprobs }) => {
                    st.meta.log.first_token();
                    if st.meta.return_token_ids || logprobs.is_some() || !text.is_empty() {
                        let mut c = st.meta.text_chunk(&text);
                        if st.meta.return_token_ids {
                            c["choices"][0]["token_ids"] = json!([id]);
                        }
                        if let Some(lp) = logprobs {
                            c["choices"][0]["logprobs"] =
                                st.meta.logprobs(std::slice::from_ref(&lp), st.sent);
                        }
                        st.sent += text.len();
                        st.queue.push_back(sse_json(&c));
                    }
                }
                Some(Event::Text(t)) => {
                    st.sent += t.len();
                    st.queue.push_back(sse_json(&st.meta.text_chunk(&t)))
                }
                Some(Event::Done(d)) => {
                    st.meta.log.tokens(d.prompt_tokens, d.completion_tokens);
                    let mut finish = d.finish.as_str();
                    if let Some(calls) = st.meta.tool_calls(&st.held) {
                        let calls: Vec<Value> = calls
                            .as_array()
                            .into_iter()
                            .flatten()
                            .enumerate()
                            .map(|(i, c)| {
                                let mut c = c.clone();
                                c["index"] = json!(i);
                                c
                            })
                            .collect();
                        let delta = json!({"tool_calls": calls});
                        st.queue
                            .push_back(sse_json(&st.meta.chunk(delta, "", None)));
                        finish = "tool_calls";
                    } else if !st.held.is_empty() || !st.held_lps.is_empty() {
                        let mut c = st.meta.text_chunk(&st.held);
                        if !st.held_lps.is_empty() {
                            c["choices"][0]["logprobs"] = st.meta.logprobs(&st.held_lps, 0);
                        }
                        st.queue.push_back(sse_json(&c));
                    }
                    st.queue
                        .push_back(sse_json(&st.meta.chunk(json!({}), "", Some(finish))));
                    if st.meta.include_usage {
                        let mut v = st.meta.envelope(true, json!([]));
                        v["usage"] = usage(d.prompt_tokens, d.completion_tokens);
                        st.queue.push_back(sse_json(&v));
                    }
                    st.queue.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
                Some(Event::Error { status, message }) => {
                    let e = error_for(status, message);
                    st.queue.push_back(sse_json(&e.body()));
                    st.done = true;
                }
                None => {
                    let e = engine_gone(&st.shared);
                    st.queue.push_back(sse_json(&e.body()));
                    st.done = true;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The answer for a request the engine cannot take or dropped without a word (it has
/// stopped): 503, with the reason when the engine failed (a GPU fault).
pub(crate) fn engine_gone(shared: &Shared) -> ApiError {
    ApiError::unavailable(
        shared
            .failed
            .get()
            .map_or("the engine has stopped", String::as_str),
    )
}

fn error_for(status: u16, message: String) -> ApiError {
    if status == 503 {
        ApiError::unavailable(message)
    } else if status == 400 {
        ApiError::bad_request(message, None)
    } else {
        ApiError::new(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "server_error",
            message,
        )
    }
}

/// Waits for the whole answer. When the client goes away this future is dropped, and with
/// it the receiver: the engine cancels the sequence.
pub(crate) async fn whole_response(
    meta: Meta,
    mut rx: UnboundedReceiver<Event>,
    shared: &Shared,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps = Vec::new();
    let done = loop {
        match rx.recv().await {
            Some(Event::Token {
                text: t, logprobs, ..
            }) => {
                meta.log.first_token();
                text.push_str(&t);
                lps.extend(logprobs);
            }
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(d)) => {
                meta.log.tokens(d.prompt_tokens, d.completion_tokens);
                break d;
            }
            Some(Event::Error { status, message }) => return Err(error_for(status, message)),
            None => return Err(engine_gone(shared)),
        }
    };
    let mut finish = done.finish.as_str();
    let mut choice = match meta.kind {
        Kind::Chat if meta.tool_calls(&text).is_some() => {
            finish = "tool_calls";
            json!({
                "index": 0,
                "message": {"role": "assistant", "content": null, "refusal": null,
                            "tool_calls": meta.tool_calls(&text)},
                "logprobs": null,
                "finish_reason": finish,
            })
        }
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null},
            "logprobs": null,
            "finish_reason": finish,
        }),
        Kind::Completion => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
        }),
    };
    if !lps.is_empty() {
        choice["logprobs"] = meta.logprobs(&lps, 0);
    }
    let mut v = meta.envelope(false, json!([]));
    v["usage"] = usage(done.prompt_tokens, done.completion_tokens);
    if meta.return_token_ids {
        choice["token_ids"] = json!(done.tokens);
        v["prompt_token_ids"] = json!(meta.prompt_ids);
    }
    v["choices"] = json!([choice]);
    Ok(Json(v).into_response())
}
