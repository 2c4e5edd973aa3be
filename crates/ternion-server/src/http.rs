//! Routes and handlers: OpenAI-shaped answers, streamed as server-sent events or whole.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::TrySendError;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use crate::access::{self, Access, RequestLog};
use crate::api::{parse_body, ApiError, ChatRequest, CompletionRequest, Prompt, Settings};
use crate::engine::{Fork, Job, Ready, Reply, Shared, Work};
use crate::error::StartError;
use crate::respond::{engine_gone, stream_response, whole_response, Kind, Meta};
use crate::structured;
use crate::tools::{self, Tools};

/// What every handler sees.
pub struct AppState {
    /// Shared with the engine.
    pub shared: Arc<Shared>,
    /// The id the model is served under.
    pub model_id: String,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
    /// Makes ids and default seeds unique.
    pub counter: AtomicU64,
}

/// The router with every endpoint, the request body limit in bytes, and the access
/// rules (API key, CORS; an invalid CORS origin is an error). Every request gets an id
/// and one log line.
pub fn router(state: Arc<AppState>, max_body: usize, access: Access) -> Result<Router, StartError> {
    let cors = access::cors(&access.cors_origins)?;
    let access = Arc::new(access);
    let counter = Arc::new(AtomicU64::new(1));
    let mut app = Router::new()
        .route("/", get(chat_page))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            early_length_check(req, next, max_body)
        }))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            access::require_key(access.clone(), req, next)
        }));
    if let Some(cors) = cors {
        app = app.layer(cors);
    }
    Ok(app
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            access::log_requests(counter.clone(), req, next)
        }))
        .with_state(state))
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    fn unique(&self) -> u64 {
        let n = self.counter.fetch_add(1, Relaxed);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // SplitMix64 of time and counter: distinct and well spread.
        let mut z = t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn ready(&self) -> Result<&Ready, ApiError> {
        if self.shared.shutdown.load(Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        self.shared
            .ready
            .get()
            .ok_or_else(|| ApiError::unavailable("the model is still loading"))
    }
}

/// A small chat page that talks to this server (streamed chat completions).
async fn chat_page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("chat_page.html"))
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "Unknown endpoint",
    )
    .with_code("not_found")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "Method not allowed for this endpoint",
    )
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let m = &st.shared.metrics;
    if let Some(reason) = st.shared.failed.get() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unhealthy", "error": reason.to_string()})),
        )
            .into_response();
    }
    if st.shared.ready.get().is_some() && m.model_loaded.load(Relaxed) {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.shared.metrics.render(),
    )
        .into_response()
}

/// The model object; `context_length` (and vLLM's name for it, `max_model_len`) is the
/// context of each sequence, prompt and completion together.
fn model_object(st: &AppState) -> Value {
    let n_ctx = st.shared.ready.get().map(|r| r.n_ctx);
    json!({
        "id": st.model_id,
        "object": "model",
        "created": st.created,
        "owned_by": "ternion",
        "context_length": n_ctx,
        "max_model_len": n_ctx,
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_object(&st)]}))
}

async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if id == st.model_id {
        Json(model_object(&st)).into_response()
    } else {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{id}` does not exist"),
        )
        .with_code("model_not_found");
        e.param = Some("model");
        e.into_response()
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "The request body is too large",
    )
    .with_code("request_too_large")
}

/// Refuses a request whose declared `Content-Length` is over the limit before any of its
/// body is read (so a client that sent `Expect: 100-continue` never has to send it).
async fn early_length_check(req: Request, next: Next, max_body: usize) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large().into_response();
    }
    next.run(req).await
}

/// The body, or 413 when it is over the limit (other read failures keep their status).
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::new(status, "invalid_request_error", r.body_text())
        }
    })
}

async fn chat(
    State(st): State<Arc<AppState>>,
    Extension(log): Extension<Arc<RequestLog>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    let result = async {
        let bytes = body_bytes(body)?;
        let req: ChatRequest = parse_body(&bytes)?;
        let mut settings = req.common.settings(&st.model_id, st.unique())?;
        let mut messages = req.messages()?;
        let ready = st.ready()?;
        let tools = Tools::parse(req.tools.as_ref(), req.tool_choice.as_ref())?;
        let tools_json = tools.as_ref().map(Tools::as_json);
        if let Some(t) = &tools {
            if let Some(g) = t.grammar() {
                if settings.grammar.is_some() {
                    return Err(ApiError::bad_request(
                        "a forced tool call (tool_choice required or named) cannot be combined \
                         with response_format, regex or grammar",
                        Some("tool_choice"),
                    ));
                }
                settings.grammar = Some(g);
            }
            t.describe(&ready.template, &mut messages);
        }
        tools::adapt(&ready.template, &mut messages);
        settings.tools = tools;
        let text = ready
            .template
            .render_with_tools(
                &messages,
                tools_json.as_ref(),
                true,
                (&ready.bos_text, &ready.eos_text),
                ready.tokenizer.add_bos(),
            )
            .map_err(|e| {
                ApiError::bad_request(
                    format!("cannot render the chat template: {e}"),
                    Some("messages"),
                )
            })?;
        Ok::<_, ApiError>((settings, Prompt::Text(text)))
    }
    .await;
    match result {
        Ok((settings, prompt)) => generate(st, Kind::Chat, settings, prompt, (arrived, log)).await,
        Err(e) => e.into_response(),
    }
}

async fn completions(
    State(st): State<Arc<AppState>>,
    Extension(log): Extension<Arc<RequestLog>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    let result = (|| {
        let bytes = body_bytes(body)?;
        let req: CompletionRequest = parse_body(&bytes)?;
        let settings = req.common.settings(&st.model_id, st.unique())?;
        let prompt = req.prompt()?;
        Ok::<_, ApiError>((settings, prompt))
    })();
    match result {
        Ok((settings, prompt)) => {
            generate(st, Kind::Completion, settings, prompt, (arrived, log)).await
        }
        Err(e) => e.into_response(),
    }
}

/// Tokenizes, checks the context, queues the job and answers.
async fn generate(
    st: Arc<AppState>,
    kind: Kind,
    settings: Settings,
    prompt: Prompt,
    arrived: (Instant, Arc<RequestLog>),
) -> Response {
    match start(&st, kind, settings, prompt, arrived).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn start(
    st: &Arc<AppState>,
    kind: Kind,
    mut settings: Settings,
    prompt: Prompt,
    (arrived, log): (Instant, Arc<RequestLog>),
) -> Result<Response, ApiError> {
    let ready = st.ready()?;
    let param = if kind == Kind::Chat {
        "messages"
    } else {
        "prompt"
    };
    let ids = match prompt {
        Prompt::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= ready.n_vocab) {
                return Err(ApiError::bad_request(
                    format!(
                        "token id {bad} is out of range (the vocabulary has {} tokens)",
                        ready.n_vocab
                    ),
                    Some("prompt"),
                ));
            }
            ids
        }
        Prompt::Text(text) => {
            let tok = ready.tokenizer.clone();
            tokio::task::spawn_blocking(move || tok.encode(&text, tok.add_bos(), true))
                .await
                .map_err(|e| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        format!("tokenizing failed: {e}"),
                    )
                })?
                .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {e}"), Some(param)))?
        }
    };
    let n_ctx = ready.n_ctx;
    let p = ids.len();
    if p == 0 {
        return Err(ApiError::bad_request("the prompt is empty", Some(param)));
    }
    let overflow = |completion: usize| {
        ApiError::bad_request(
            format!(
                "This model's maximum context length is {n_ctx} tokens. However, you requested \
                 {} tokens ({p} in the {param}, {completion} in the completion). Please reduce \
                 the length of the {param} or completion.",
                p.saturating_add(completion)
            ),
            Some(param),
        )
        .with_code("context_length_exceeded")
    };
    if p >= n_ctx {
        return Err(overflow(settings.max_tokens.unwrap_or(1)));
    }
    let max_tokens = match settings.max_tokens {
        Some(n) if p.saturating_add(n) > n_ctx => return Err(overflow(n)),
        Some(n) => n,
        None => n_ctx - p,
    };
    let grammar = settings.grammar.take();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let m = &st.shared.metrics;
    // One job: the first choice, and the others (forks) seeded one apart, which share
    // the prompt's evaluation where the backend allows it.
    let own = |choice: usize| {
        let (st, grammar, tx) = (st.shared.clone(), grammar.clone(), tx.clone());
        let mut sampler = settings.sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(choice as u64);
        async move {
            let constraint = match grammar {
                Some(spec) => Some(structured::compile(st, spec).await?),
                None => None,
            };
            let events = Reply { choice, tx };
            Ok::<_, ApiError>(Fork {
                sampler,
                constraint,
                events,
            })
        }
    };
    let first = own(0).await?;
    let mut forks = Vec::with_capacity(settings.n - 1);
    for choice in 1..settings.n {
        forks.push(own(choice).await?);
    }
    let job = Job {
        prompt: ids.clone(),
        sampler: first.sampler,
        max_tokens,
        stop: settings.stop.clone(),
        ignore_eos: settings.ignore_eos,
        constraint: first.constraint,
        logprobs: settings.logprobs,
        arrived,
        events: first.events,
        forks,
    };
    queue(st, ready, Work::Generate(job))?;
    drop(tx);
    m.requests_total.fetch_add(1, Relaxed);
    let meta = Meta {
        kind,
        id: format!(
            "{}-{:016x}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            st.unique()
        ),
        created: now_unix(),
        model: st.model_id.clone(),
        include_usage: settings.include_usage,
        return_token_ids: settings.return_token_ids,
        prompt_ids: ids,
        tok: ready.tokenizer.clone(),
        tools: settings.tools.take(),
        n: settings.n,
        log,
    };
    if settings.stream {
        Ok(stream_response(meta, rx, st.shared.clone()))
    } else {
        whole_response(meta, rx, &st.shared).await
    }
}

/// Queues `work` for the engine: 429 when the queue is full, 503 when the engine is gone.
pub(crate) fn queue(st: &AppState, ready: &Ready, work: Work) -> Result<(), ApiError> {
    let m = &st.shared.metrics;
    let full = || {
        m.rejected_queue_full_total.fetch_add(1, Relaxed);
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "The server is busy: the request queue is full. Retry later.",
        )
        .with_code("queue_full")
    };
    // The count includes a request the scheduler holds off the channel (engine::Ready).
    if m.queue_length.fetch_add(1, Relaxed) >= ready.queue_capacity as u64 {
        m.queue_length.fetch_sub(1, Relaxed);
        return Err(full());
    }
    if let Err(e) = ready.jobs.try_send(work) {
        m.queue_length.fetch_sub(1, Relaxed);
        return Err(match e {
            TrySendError::Full(_) => full(),
            TrySendError::Disconnected(_) => engine_gone(&st.shared),
        });
    }
    Ok(())
}
