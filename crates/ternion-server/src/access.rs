//! Who may call and what is recorded: the API key check, CORS, and one structured log
//! line per request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::api::ApiError;
use crate::error::StartError;

/// Access settings.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Requests must carry `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Also require the key for `/health` and `/metrics` (open by default, for probes and
    /// scrapers).
    pub api_key_all: bool,
    /// Origins a browser may call from (`*`: any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
}

/// Routes that stay open without `--api-key-all`.
const OPEN_ROUTES: [&str; 3] = ["/", "/health", "/metrics"];

/// Whether the `Authorization` header carries `key` as a bearer token, compared in
/// constant time (the time does not depend on how much of the key matches).
fn key_matches(req: &Request, key: &str) -> bool {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return false;
    };
    let Some(token) = value.as_bytes().strip_prefix(b"Bearer ") else {
        return false;
    };
    token.ct_eq(key.as_bytes()).into()
}

/// Refuses a request without the right key with 401 in OpenAI's error shape. CORS
/// preflights never reach this layer (the CORS layer outside it answers them).
pub async fn require_key(access: Arc<Access>, req: Request, next: Next) -> Response {
    let Some(key) = &access.api_key else {
        return next.run(req).await;
    };
    let open = !access.api_key_all && OPEN_ROUTES.contains(&req.uri().path());
    if open || key_matches(&req, key) {
        return next.run(req).await;
    }
    let has_header = req.headers().contains_key(header::AUTHORIZATION);
    let message = if has_header {
        "Incorrect API key provided."
    } else {
        "You didn't provide an API key. Send it as an `Authorization: Bearer KEY` header."
    };
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
        .with_code("invalid_api_key")
        .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The CORS layer for `origins` (`*` allows any), or `None` when there are none; an
/// origin that is not a valid header value is an error.
pub fn cors(origins: &[String]) -> Result<Option<CorsLayer>, StartError> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let mut list = Vec::new();
        for o in origins {
            match HeaderValue::from_str(o.trim_end_matches('/')) {
                Ok(v) if o.contains("://") => list.push(v),
                _ => {
                    return Err(StartError::Setting {
                        flag: "--cors-origin",
                        message: format!("'{o}': expected an origin like https://example.com or *"),
                    })
                }
            }
        }
        AllowOrigin::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([header::HeaderName::from_static(REQUEST_ID)])
            .max_age(Duration::from_secs(3600)),
    ))
}

/// Header that carries a request's id in the answer.
pub const REQUEST_ID: &str = "x-request-id";

/// What the log line of one request records; handlers fill in the tokens and the time to
/// first token. The line is written when the last holder drops it: after the whole
/// answer, streamed ones included (their stream holds it until it ends).
pub struct RequestLog {
    id: String,
    method: Method,
    route: String,
    start: Instant,
    fields: Mutex<Fields>,
}

#[derive(Default)]
struct Fields {
    status: u16,
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
    ttft: Option<Duration>,
}

impl RequestLog {
    fn fields(&self) -> std::sync::MutexGuard<'_, Fields> {
        self.fields.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the token counts of the answer.
    pub fn tokens(&self, prompt: usize, completion: usize) {
        let mut f = self.fields();
        f.prompt_tokens = Some(prompt);
        f.completion_tokens = Some(completion);
    }

    /// Records the time to the first token (the first call counts).
    pub fn first_token(&self) {
        let mut f = self.fields();
        if f.ttft.is_none() {
            f.ttft = Some(self.start.elapsed());
        }
    }
}

/// A number for the log line, or `-` when the request had none.
fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let f = self.fields();
        let ms = |d: Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
        tracing::info!(
            request_id = %self.id,
            method = %self.method,
            route = %self.route,
            status = f.status,
            prompt_tokens = %or_dash(f.prompt_tokens),
            completion_tokens = %or_dash(f.completion_tokens),
            ttft_ms = %or_dash(f.ttft.map(ms)),
            total_ms = %ms(self.start.elapsed()),
            "request"
        );
    }
}

/// Gives every request an id (sent back as `x-request-id`) and a [`RequestLog`] in its
/// extensions.
pub async fn log_requests(counter: Arc<AtomicU64>, mut req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("(no route)", MatchedPath::as_str)
        .to_owned();
    let log = Arc::new(RequestLog {
        id: format!("req-{:08x}", counter.fetch_add(1, Relaxed)),
        method: req.method().clone(),
        route,
        start: Instant::now(),
        fields: Mutex::default(),
    });
    req.extensions_mut().insert(log.clone());
    let mut r = next.run(req).await;
    log.fields().status = r.status().as_u16();
    if let Ok(v) = HeaderValue::from_str(&log.id) {
        r.headers_mut().insert(REQUEST_ID, v);
    }
    r
}
