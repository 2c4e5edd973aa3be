//! OpenAI request bodies, their validation, and the error shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use ternion::constrain::GrammarSpec;
use ternion::sample::SamplerConfig;

use crate::structured;
use crate::tools::Tools;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<&'static str>,
    /// Machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// An error of any status.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 503: the model is not loaded (yet, or any more).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            .with_code("service_unavailable")
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// One stop sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and `"usage": null` on the others).
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Fields shared by chat completions and completions.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    /// Model id; must name the served model when given.
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<i64>,
    /// Newer name of `max_tokens` (chat); wins when both are given.
    pub max_completion_tokens: Option<i64>,
    /// Temperature (0: greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Top-k truncation (0: off). An extension, as in llama.cpp and vLLM.
    pub top_k: Option<i64>,
    /// Min-p truncation. An extension.
    pub min_p: Option<f32>,
    /// Random seed.
    pub seed: Option<i64>,
    /// Stop sequences.
    pub stop: Option<StopField>,
    /// Stream the answer as server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// OpenAI presence penalty, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty, in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// Multiplicative repetition penalty (> 0, 1: off). An extension.
    pub repetition_penalty: Option<f32>,
    /// Window of the penalties in tokens. An extension.
    pub repeat_last_n: Option<i64>,
    /// Number of choices (1 to [`MAX_CHOICES`]), each its own sequence (sharing the
    /// prompt's KV pages).
    pub n: Option<i64>,
    /// Keep generating past end-of-generation tokens. An extension.
    pub ignore_eos: Option<bool>,
    /// Add `prompt_token_ids` and per-choice `token_ids` to a non-streamed answer, and
    /// stream one chunk per generated token with its `token_ids` (vLLM's extension).
    pub return_token_ids: Option<bool>,
    /// Log-probabilities: `true` (chat) or how many alternatives (completions).
    pub logprobs: Option<Value>,
    /// How many alternatives to report with each token's log-probability (chat).
    pub top_logprobs: Option<i64>,
    /// `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"schema"}}`.
    pub response_format: Option<Value>,
    /// The output must fully match this regular expression. An extension.
    pub regex: Option<String>,
    /// The output must be in the language of this Lark grammar (llguidance's dialect).
    /// An extension.
    pub grammar: Option<String>,
}

/// A chat message's content: text, or a list of parts of which only text is served.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Deserialize)]
pub struct Part {
    /// Part type; only "text" is served.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    /// Role: system, developer (treated as system), user, assistant.
    pub role: String,
    /// Content (may be null for an assistant message).
    pub content: Option<Content>,
    /// An assistant message's tool calls.
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Functions the model may call.
    pub tools: Option<Value>,
    /// "none", "auto", "required", or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    /// Everything else.
    #[serde(flatten)]
    pub common: Common,
}

/// `prompt` of a completion: text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    /// One text prompt.
    Text(String),
    /// A list of text prompts (one is served).
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// A list of token-id prompts (one is served).
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Option<PromptField>,
    /// Echoing the prompt is not served.
    pub echo: Option<bool>,
    /// Suffixes are not served.
    pub suffix: Option<String>,
    /// best_of > 1 is not served.
    pub best_of: Option<i64>,
    /// Everything else.
    #[serde(flatten)]
    pub common: Common,
}

/// A prompt after parsing: text to tokenize, or ids as given.
#[derive(Debug)]
pub enum Prompt {
    /// Text (tokenized with BOS per the model and special tokens parsed).
    Text(String),
    /// Ids used as given.
    Tokens(Vec<u32>),
}

/// Parses a JSON body; syntax and type errors are 400s.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let message = if e.is_syntax() || e.is_eof() {
            format!("We could not parse the JSON body of your request: {e}")
        } else {
            format!("Invalid request body: {e}")
        };
        ApiError::bad_request(message, None).with_code("invalid_json")
    })
}

/// The settings of one generation, after validation.
#[derive(Debug)]
pub struct Settings {
    /// Sampler settings.
    pub sampler: SamplerConfig,
    /// Requested `max_tokens`, if any.
    pub max_tokens: Option<usize>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Stream the answer.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Return token ids.
    pub return_token_ids: bool,
    /// What the output must match.
    pub grammar: Option<GrammarSpec>,
    /// Report log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// The tools offered (chat), set by the chat handler.
    pub tools: Option<Tools>,
    /// Number of choices.
    pub n: usize,
}

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 8;

fn range(name: &'static str, v: Option<f32>, lo: f32, hi: f32) -> Result<(), ApiError> {
    match v {
        Some(x) if !(x >= lo && x <= hi) => Err(ApiError::bad_request(
            format!("{name} must be between {lo} and {hi}, got {x}"),
            Some(name),
        )
        .with_code("invalid_value")),
        _ => Ok(()),
    }
}

impl Common {
    /// Checks the model name and every generation setting.
    pub fn settings(&self, served_model: &str, random_seed: u64) -> Result<Settings, ApiError> {
        if let Some(m) = &self.model {
            if m != served_model {
                return Err(ApiError {
                    status: StatusCode::NOT_FOUND,
                    message: format!(
                        "The model `{m}` does not exist; this server serves `{served_model}`."
                    ),
                    kind: "invalid_request_error",
                    param: Some("model"),
                    code: Some("model_not_found"),
                });
            }
        }
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ApiError::bad_request(
                    format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
                    Some("n"),
                )
                .with_code("invalid_value"))
            }
        };
        let logprobs = structured::logprobs(self.logprobs.as_ref(), self.top_logprobs)?;
        let grammar = structured::grammar(
            self.response_format.as_ref(),
            self.regex.as_deref(),
            self.grammar.as_deref(),
        )?;
        range("temperature", self.temperature, 0.0, 2.0)?;
        range("top_p", self.top_p, f32::MIN_POSITIVE, 1.0)?;
        range("min_p", self.min_p, 0.0, 1.0)?;
        range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        range("repetition_penalty", self.repetition_penalty, 1e-3, 100.0)?;
        let top_k = match self.top_k {
            None => None,
            Some(k) if k < 0 => Some(0), // llama.cpp: a negative top_k means "off"
            Some(k) => Some(k as usize),
        };
        let repeat_last_n = match self.repeat_last_n {
            Some(n) if n < 0 => {
                return Err(ApiError::bad_request(
                    format!("repeat_last_n must be >= 0, got {n}"),
                    Some("repeat_last_n"),
                )
                .with_code("invalid_value"))
            }
            n => n.map(|n| n as usize),
        };
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(n) if n < 1 => {
                return Err(ApiError::bad_request(
                    format!("max_tokens must be at least 1, got {n}"),
                    Some("max_tokens"),
                )
                .with_code("invalid_value"))
            }
            n => n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        };
        let mut sampler = SamplerConfig::default();
        if let Some(t) = self.temperature {
            sampler.temperature = t;
        }
        if let Some(p) = self.top_p {
            sampler.top_p = p;
        }
        if let Some(k) = top_k {
            sampler.top_k = k;
        }
        if let Some(p) = self.min_p {
            sampler.min_p = p;
        }
        if let Some(p) = self.presence_penalty {
            sampler.presence_penalty = p;
        }
        if let Some(p) = self.frequency_penalty {
            sampler.frequency_penalty = p;
        }
        if let Some(p) = self.repetition_penalty {
            sampler.repeat_penalty = p;
        }
        if let Some(n) = repeat_last_n {
            sampler.repeat_last_n = n;
        }
        sampler.seed = self.seed.map_or(random_seed, |s| s as u64);
        sampler
            .validate()
            .map_err(|e| ApiError::bad_request(e.to_string(), None).with_code("invalid_value"))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stop.len() > 16 {
            return Err(ApiError::bad_request(
                format!("at most 16 stop sequences are allowed, got {}", stop.len()),
                Some("stop"),
            ));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(Settings {
            sampler,
            max_tokens,
            stop,
            stream,
            include_usage: stream
                && self
                    .stream_options
                    .as_ref()
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            return_token_ids: self.return_token_ids.unwrap_or(false),
            grammar,
            logprobs,
            tools: None,
            n,
        })
    }
}

impl ChatRequest {
    /// The messages as the template wants them.
    pub fn messages(&self) -> Result<Vec<ternion::chat::Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        self.messages
            .iter()
            .map(|m| {
                let role = match m.role.as_str() {
                    "developer" => "system",
                    r => r,
                };
                let content = match &m.content {
                    // Only an assistant turn may come without content (as in OpenAI's API).
                    None if role == "assistant" => String::new(),
                    None => {
                        return Err(ApiError::bad_request(
                            format!("a '{role}' message needs a 'content'"),
                            Some("messages"),
                        ))
                    }
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut s = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => s.push_str(t),
                                (kind, _) => {
                                    return Err(ApiError::bad_request(
                                        format!(
                                            "content parts of type '{kind}' are not supported; \
                                             only text"
                                        ),
                                        Some("messages"),
                                    ))
                                }
                            }
                        }
                        s
                    }
                };
                let mut msg = ternion::chat::Message::new(role, content);
                msg.tool_calls = m.tool_calls.clone().filter(|c| !c.is_null());
                msg.tool_call_id = m.tool_call_id.clone();
                Ok(msg)
            })
            .collect()
    }
}

impl CompletionRequest {
    /// The one prompt of the request.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::bad_request("echo is not supported", Some("echo")));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_request(
                "suffix is not supported",
                Some("suffix"),
            ));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::bad_request("best_of must be 1", Some("best_of"))
                .with_code("invalid_value"));
        }
        let one = |n: usize| {
            if n == 1 {
                Ok(())
            } else {
                Err(ApiError::bad_request(
                    format!("exactly one prompt per request is served, got {n}"),
                    Some("prompt"),
                ))
            }
        };
        match &self.prompt {
            None => Err(ApiError::bad_request("prompt is required", Some("prompt"))),
            Some(PromptField::Text(t)) => Ok(Prompt::Text(t.clone())),
            Some(PromptField::Texts(v)) => {
                one(v.len())?;
                Ok(Prompt::Text(v[0].clone()))
            }
            Some(PromptField::Tokens(v)) => Ok(Prompt::Tokens(v.clone())),
            Some(PromptField::TokenLists(v)) => {
                one(v.len())?;
                Ok(Prompt::Tokens(v[0].clone()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request_parses_openai_shapes() {
        let r: ChatRequest = parse_body(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}],
                "stop":"x","stream":true,"stream_options":{"include_usage":true},
                "max_completion_tokens":5,"max_tokens":7,"user":"ignored"}"#,
        )
        .unwrap();
        let msgs = r.messages().unwrap();
        assert_eq!(msgs[1].content, "ab");
        assert_eq!(msgs[2].content, "");
        let s = r.common.settings("m", 1).unwrap();
        assert_eq!(s.max_tokens, Some(5));
        assert_eq!(s.stop, vec!["x".to_string()]);
        assert!(s.stream && s.include_usage);
    }

    #[test]
    fn bad_values_are_400() {
        let c = |j: &str| parse_body::<Common>(j.as_bytes()).unwrap().settings("m", 0);
        assert_eq!(c(r#"{"n":9}"#).unwrap_err().status, 400);
        assert_eq!(c(r#"{"n":0}"#).unwrap_err().status, 400);
        assert_eq!(c(r#"{"n":2}"#).unwrap().n, 2);
        assert_eq!(c(r#"{"temperature":-1}"#).unwrap_err().status, 400);
        assert_eq!(c(r#"{"top_p":0}"#).unwrap_err().status, 400);
        assert_eq!(c(r#"{"max_tokens":0}"#).unwrap_err().status, 400);
        assert_eq!(c(r#"{"model":"other"}"#).unwrap_err().status, 404);
        assert!(c(r#"{"temperature":0,"seed":3,"top_k":5}"#).is_ok());
        assert_eq!(parse_body::<Common>(b"{").unwrap_err().status, 400);
        assert_eq!(
            parse_body::<Common>(br#"{"temperature":"hot"}"#)
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn completion_prompts() {
        let p = |j: &str| {
            parse_body::<CompletionRequest>(j.as_bytes())
                .unwrap()
                .prompt()
        };
        assert!(matches!(p(r#"{"prompt":"a"}"#).unwrap(), Prompt::Text(_)));
        assert!(matches!(p(r#"{"prompt":["a"]}"#).unwrap(), Prompt::Text(_)));
        assert!(matches!(
            p(r#"{"prompt":[1,2]}"#).unwrap(),
            Prompt::Tokens(_)
        ));
        assert!(matches!(
            p(r#"{"prompt":[[1,2]]}"#).unwrap(),
            Prompt::Tokens(_)
        ));
        assert!(p(r#"{"prompt":["a","b"]}"#).is_err());
        assert!(p(r#"{}"#).is_err());
    }
}
