//! `POST /v1/embeddings` in OpenAI's shape.
//!
//! `input` is a string, a list of strings, a list of token ids, or a list of such lists;
//! `encoding_format` is `float` (the default) or `base64` (little-endian f32, what the
//! official Python client asks for unless told otherwise). Each input is pooled as the
//! model file says and L2-normalised (`ternion::embed`); a model whose file asks for no
//! pooling (`pooling_type` 0) gets a 400, as in llama.cpp. On a CPU server embeddings run
//! on a blocking thread beside the engine; on a GPU server (`--backend gpu`) the engine
//! thread runs them on the GPU plan between two steps ([`Work::Embed`]), queued as
//! generation requests are.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use ternion::embed::{Embedder, Pooling};

use crate::api::{parse_body, ApiError};
use crate::engine::{EmbedJob, Work};
use crate::http::{body_bytes, queue, AppState};

/// A request's inputs after checking: embedded already (a CPU server), or token ids for the
/// engine's device (a GPU server).
enum Checked {
    Embedded(Vec<Vec<f32>>),
    ForEngine(Vec<Vec<u32>>),
}

/// The body of an embeddings request.
#[derive(Debug, Deserialize)]
pub struct EmbeddingRequest {
    /// What to embed.
    pub input: Input,
    /// `float` or `base64`.
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Requested vector length: accepted only when it is the model's.
    #[serde(default)]
    pub dimensions: Option<usize>,
}

/// `input`: text or token ids, one or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One input as token ids.
    Tokens(Vec<u32>),
    /// Several inputs as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// One input, before tokenization.
enum Item {
    Text(String),
    Tokens(Vec<u32>),
}

impl Input {
    fn items(self) -> Vec<Item> {
        match self {
            Input::Text(t) => vec![Item::Text(t)],
            Input::Texts(ts) => ts.into_iter().map(Item::Text).collect(),
            Input::Tokens(ids) => vec![Item::Tokens(ids)],
            Input::TokenLists(ls) => ls.into_iter().map(Item::Tokens).collect(),
        }
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message, Some("input"))
}

/// The handler of `POST /v1/embeddings`.
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match answer(&st, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn answer(st: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let req: EmbeddingRequest = parse_body(&body_bytes(body)?)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("encoding_format '{other}' is not supported (float, base64)"),
                Some("encoding_format"),
            ))
        }
    };
    let items = req.input.items();
    if items.is_empty() {
        return Err(bad("input is empty"));
    }
    let ready = st.ready()?;
    let (model, tok, n_ctx, n_vocab) = (
        ready.model.clone(),
        ready.tokenizer.clone(),
        ready.n_ctx,
        ready.n_vocab,
    );
    let dimensions = req.dimensions;
    let on_gpu = ready.gpu_embeddings;
    // Checked and tokenized on a blocking thread, and embedded there on a CPU server.
    let (checked, n_tokens) = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let mut emb = Embedder::new(&model, None, true).map_err(internal)?;
        if emb.pooling() == Pooling::None {
            return Err(bad(
                "the model's pooling_type is 'none' (one vector per token), which is not \
                 OpenAI-compatible; use `ternion embed --pooling none` for token vectors",
            ));
        }
        if let Some(d) = dimensions.filter(|&d| d != emb.dim()) {
            return Err(ApiError::bad_request(
                format!(
                    "dimensions {d} is not supported: this model's vectors have {} values",
                    emb.dim()
                ),
                Some("dimensions"),
            ));
        }
        let mut inputs = Vec::new();
        let mut n_tokens = 0;
        for (i, item) in items.into_iter().enumerate() {
            let ids = match item {
                Item::Text(t) if t.is_empty() => {
                    return Err(bad(format!("input {i} is an empty string")))
                }
                Item::Text(t) => emb
                    .tokenize(&tok, &t)
                    .map_err(|e| bad(format!("cannot tokenize input {i}: {e}")))?,
                Item::Tokens(ids) => ids,
            };
            if ids.is_empty() {
                return Err(bad(format!("input {i} is empty")));
            }
            if let Some(b) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(bad(format!(
                    "input {i}: token id {b} is out of range (the vocabulary has {n_vocab} tokens)"
                )));
            }
            if ids.len() > n_ctx {
                return Err(bad(format!(
                    "input {i} has {} tokens; this server's context is {n_ctx}",
                    ids.len()
                ))
                .with_code("context_length_exceeded"));
            }
            n_tokens += ids.len();
            inputs.push(ids);
        }
        if on_gpu {
            return Ok((Checked::ForEngine(inputs), n_tokens));
        }
        let vectors = inputs
            .iter()
            .map(|ids| emb.embed(ids).map(|mut v| v.swap_remove(0)))
            .collect::<ternion::Result<Vec<_>>>()
            .map_err(internal)?;
        Ok((Checked::Embedded(vectors), n_tokens))
    })
    .await
    .map_err(|e| internal(format!("the embedding task failed: {e}")))??;
    let vectors = match checked {
        Checked::Embedded(v) => v,
        Checked::ForEngine(inputs) => {
            let (reply, answer) = tokio::sync::oneshot::channel();
            queue(st, ready, Work::Embed(EmbedJob { inputs, reply }))?;
            answer
                .await
                .map_err(|_| internal("the engine dropped the embeddings request"))?
                .map_err(|e| ApiError::from(&e))?
        }
    };
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": st.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        e.to_string(),
    )
}
