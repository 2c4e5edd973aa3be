//! Structured output and log-probabilities in requests: OpenAI's `response_format`
//! (`json_object`, `json_schema`), the `regex` and `grammar` (Lark) extensions, and
//! `logprobs` / `top_logprobs`.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::Value;
use ternion::constrain::{GrammarSpec, Grammars};
use ternion::generate::Constraint;

use crate::api::ApiError;
use crate::engine::Shared;

/// Most `top_logprobs` served (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;

fn bad(message: String, param: &'static str) -> ApiError {
    ApiError::bad_request(message, Some(param)).with_code("invalid_value")
}

/// The grammar a request asks for: `response_format`, or the `regex` / `grammar`
/// extensions (at most one of them).
pub fn grammar(
    response_format: Option<&Value>,
    regex: Option<&str>,
    lark: Option<&str>,
) -> Result<Option<GrammarSpec>, ApiError> {
    let from_format = match response_format {
        None | Some(Value::Null) => None,
        Some(f) => response_format_grammar(f)?,
    };
    let given: Vec<GrammarSpec> = [
        from_format,
        regex.map(|r| GrammarSpec::Regex(r.to_owned())),
        lark.map(|g| GrammarSpec::Lark(g.to_owned())),
    ]
    .into_iter()
    .flatten()
    .collect();
    if given.len() > 1 {
        return Err(bad(
            "give at most one of response_format (json_object, json_schema), regex and grammar"
                .into(),
            "response_format",
        ));
    }
    Ok(given.into_iter().next())
}

/// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}`.
fn response_format_grammar(f: &Value) -> Result<Option<GrammarSpec>, ApiError> {
    let kind = f.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad(
            format!("response_format needs a string 'type', got {f}"),
            "response_format",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let schema = f
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| {
                    bad(
                        "response_format of type 'json_schema' needs json_schema.schema".into(),
                        "response_format",
                    )
                })?;
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(bad(
                    format!("json_schema.schema must be an object, got {schema}"),
                    "response_format",
                ));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        other => Err(bad(
            format!(
                "response_format type '{other}' is not supported; use text, json_object or \
                 json_schema"
            ),
            "response_format",
        )),
    }
}

/// Compiles `spec` for the served model (building the vocabulary's grammar compiler on
/// first use) off the async threads. A grammar llguidance rejects is a 400 saying why.
pub(crate) async fn compile(
    shared: Arc<Shared>,
    spec: GrammarSpec,
) -> Result<Box<dyn Constraint>, ApiError> {
    let work = move || {
        let ready = shared
            .ready
            .get()
            .ok_or_else(|| ApiError::unavailable("the model is still loading"))?;
        let grammars = ready
            .grammars
            .get_or_init(|| Grammars::new(&ready.tokenizer, ready.n_vocab));
        let grammars = grammars
            .as_ref()
            .map_err(|e| ApiError::bad_request(e.to_string(), Some("response_format")))?;
        match grammars.compile(&spec) {
            Ok(g) => Ok(Box::new(g) as Box<dyn Constraint>),
            Err(e) => Err(
                ApiError::bad_request(e.to_string(), Some("response_format"))
                    .with_code("invalid_grammar"),
            ),
        }
    };
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("compiling the grammar failed: {e}"),
        )
    })?
}

/// How many alternatives to report with each token's log-probability (`None`: no
/// log-probabilities): `logprobs: true` with `top_logprobs` (chat), or `logprobs: N`
/// (completions).
pub fn logprobs(logprobs: Option<&Value>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    let top = match top {
        None => None,
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(bad(
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
                "top_logprobs",
            ))
        }
    };
    match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0))),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k) if k <= MAX_TOP_LOGPROBS => Ok(Some(k as usize)),
            _ => Err(bad(
                format!("logprobs must be true, false or 0 to {MAX_TOP_LOGPROBS}, got {n}"),
                "logprobs",
            )),
        },
        Some(v) => Err(bad(
            format!("logprobs must be true, false or 0 to {MAX_TOP_LOGPROBS}, got {v}"),
            "logprobs",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn response_formats_and_extensions() {
        let f = |v: Value| grammar(Some(&v), None, None);
        assert_eq!(f(json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            f(json!({"type": "json_object"})).unwrap(),
            Some(GrammarSpec::JsonObject)
        );
        let s = json!({"type": "object"});
        assert_eq!(
            f(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}))
                .unwrap(),
            Some(GrammarSpec::JsonSchema(s))
        );
        assert!(f(json!({"type": "json_schema"})).is_err());
        assert!(f(json!({"type": "yaml"}))
            .unwrap_err()
            .message
            .contains("yaml"));
        assert_eq!(
            grammar(None, Some("a+"), None).unwrap(),
            Some(GrammarSpec::Regex("a+".into()))
        );
        assert!(grammar(Some(&json!({"type": "json_object"})), Some("a"), None).is_err());
    }

    #[test]
    fn logprobs_settings() {
        assert_eq!(logprobs(None, Some(3)).unwrap(), None);
        assert_eq!(logprobs(Some(&json!(true)), Some(3)).unwrap(), Some(3));
        assert_eq!(logprobs(Some(&json!(true)), None).unwrap(), Some(0));
        assert_eq!(logprobs(Some(&json!(2)), None).unwrap(), Some(2));
        assert!(logprobs(Some(&json!(true)), Some(21)).is_err());
        assert!(logprobs(Some(&json!("x")), None).is_err());
    }
}
