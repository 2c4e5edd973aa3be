//! Streamed answers: server-sent events, one chunk per piece of a choice's text (or per
//! token with `return_token_ids` or log-probabilities), each choice's finish chunk, then
//! the usage chunk when asked for and `[DONE]`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use super::{engine_gone, total_usage, usage, Choice, Kind, Meta};
use crate::api::ApiError;
use crate::engine::{Event, Shared};

fn sse_json(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// A stream's state between events.
struct St {
    meta: Meta,
    rx: UnboundedReceiver<(usize, Event)>,
    shared: Arc<Shared>,
    queue: VecDeque<SseEvent>,
    choices: Vec<Choice>,
    /// Choices not finished yet.
    left: usize,
    done: bool,
}

impl St {
    fn push(&mut self, v: &Value) {
        self.queue.push_back(sse_json(v));
    }

    /// Queues what `ev` for choice `i` sends.
    fn on(&mut self, i: usize, ev: Event) {
        let held = self.meta.tools.is_some();
        match ev {
            Event::Token { text, logprobs, .. } if held => {
                self.meta.log.first_token();
                self.choices[i].text.push_str(&text);
                self.choices[i].lps.extend(logprobs);
            }
            Event::Text(t) if held => self.choices[i].text.push_str(&t),
            Event::Token { id, text, logprobs } => {
                self.meta.log.first_token();
                if self.meta.return_token_ids || logprobs.is_some() || !text.is_empty() {
                    let mut c = self.meta.text_chunk(i, &text);
                    if self.meta.return_token_ids {
                        c["choices"][0]["token_ids"] = json!([id]);
                    }
                    if let Some(lp) = logprobs {
                        let sent = self.choices[i].sent;
                        c["choices"][0]["logprobs"] =
                            self.meta.logprobs(std::slice::from_ref(&lp), sent);
                    }
                    self.choices[i].sent += text.len();
                    self.push(&c);
                }
            }
            Event::Text(t) => {
                self.choices[i].sent += t.len();
                let c = self.meta.text_chunk(i, &t);
                self.push(&c);
            }
            Event::Done(d) => {
                let finish = self.release(i, d.finish.as_str());
                let c = self.meta.chunk(i, json!({}), "", Some(finish));
                self.push(&c);
                self.choices[i].done = Some(d);
                self.left -= 1;
                if self.left == 0 {
                    self.close();
                }
            }
            Event::Error(e) => {
                let e = ApiError::from(&e);
                self.push(&e.body());
                self.done = true;
            }
        }
    }

    /// Sends choice `i`'s held answer (tools offered): a call, or its text. Returns the
    /// finish reason.
    fn release(&mut self, i: usize, finish: &'static str) -> &'static str {
        if self.meta.tools.is_none() {
            return finish;
        }
        let c = &self.choices[i];
        if let Some(calls) = self.meta.tool_calls(i, &c.text) {
            let calls: Vec<Value> = calls
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(k, call)| {
                    let mut call = call.clone();
                    call["index"] = json!(k);
                    call
                })
                .collect();
            let v = self.meta.chunk(i, json!({"tool_calls": calls}), "", None);
            self.push(&v);
            return "tool_calls";
        }
        if !c.text.is_empty() || !c.lps.is_empty() {
            let mut v = self.meta.text_chunk(i, &c.text);
            if !c.lps.is_empty() {
                v["choices"][0]["logprobs"] = self.meta.logprobs(&c.lps, 0);
            }
            self.push(&v);
        }
        finish
    }

    /// Every choice is done: the usage chunk when asked for, then `[DONE]`.
    fn close(&mut self) {
        let (prompt, completion) = total_usage(&self.choices);
        self.meta.log.tokens(prompt, completion);
        if self.meta.include_usage {
            let mut v = self.meta.envelope(true, json!([]));
            v["usage"] = usage(prompt, completion);
            self.push(&v);
        }
        self.queue.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}

/// Streams the answer as server-sent events. When the client goes away the stream and with
/// it the receiver are dropped, and the engine cancels the sequences.
pub(crate) fn stream_response(
    meta: Meta,
    rx: UnboundedReceiver<(usize, Event)>,
    shared: Arc<Shared>,
) -> Response {
    let mut st = St {
        choices: (0..meta.n).map(|_| Choice::default()).collect(),
        left: meta.n,
        meta,
        rx,
        shared,
        queue: VecDeque::new(),
        done: false,
    };
    if st.meta.kind == Kind::Chat {
        for i in 0..st.meta.n {
            let c = st
                .meta
                .chunk(i, json!({"role": "assistant", "content": ""}), "", None);
            st.push(&c);
        }
    }
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok::<_, Infallible>(ev), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some((i, ev)) => st.on(i, ev),
                None => {
                    let e = engine_gone(&st.shared);
                    st.push(&e.body());
                    st.done = true;
                }
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
