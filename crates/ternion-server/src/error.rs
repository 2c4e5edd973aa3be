//! The server's errors: why it could not start ([`StartError`]), why the engine ended a
//! sequence ([`EngineError`]), and how a library error becomes an OpenAI-shaped answer
//! with the right status ([`status_of`]). Each error shows its cause in its message (none
//! is also a `source`, so `{:#}` chains do not repeat it).

use std::sync::Arc;

use axum::http::StatusCode;

use crate::api::ApiError;

/// Why the server could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting is out of range or malformed.
    #[error("{flag}: {message}")]
    Setting {
        /// The command-line flag, e.g. `--queue`.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model, its tokenizer or its chat template could not be read.
    #[error("{what} {path}: {error}")]
    Load {
        /// What was being read, e.g. "reading the tokenizer of".
        what: &'static str,
        /// The model file.
        path: String,
        /// The library's error.
        error: Box<ternion::Error>,
    },
    /// The GPU could not be opened or the model not put on it.
    #[error("{what}: {error}")]
    Gpu {
        /// What was being done, e.g. "loading the model onto the GPU".
        what: &'static str,
        /// The library's error.
        error: Box<ternion::Error>,
    },
    /// `--backend gpu` on a server built without the GPU backend.
    #[error("this server was built without the GPU backend")]
    NoGpuBackend,
    /// The engine was started twice on the same shared state.
    #[error("the engine was started twice")]
    StartedTwice,
    /// The engine thread ended before it reported the model loaded.
    #[error("the engine thread ended while loading the model")]
    EngineEnded,
    /// The engine thread panicked.
    #[error("the engine thread panicked")]
    EnginePanicked,
    /// An operating-system failure (starting the engine thread, serving HTTP).
    #[error("{what}: {error}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        error: std::io::Error,
    },
}

/// Why the engine ended one sequence before its natural end; sent to the request's
/// handler, which answers with [`ApiError::from`].
#[derive(Clone, Debug, thiserror::Error)]
pub enum EngineError {
    /// The request's sampler settings were refused.
    #[error("invalid sampler settings: {0}")]
    Sampler(Arc<ternion::Error>),
    /// No KV cache was left for a new sequence.
    #[error("no KV cache for the sequence: {0}")]
    NoCache(Arc<ternion::Error>),
    /// The forward pass of this sequence failed.
    #[error("generation failed: {0}")]
    Generation(Arc<ternion::Error>),
    /// The engine stopped (a GPU fault): every sequence ends with this.
    #[error("the engine stopped: {0}")]
    Stopped(Arc<ternion::Error>),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The sequence's output constraint (a grammar or JSON schema) could not go on.
    #[error("generation failed: the output constraint stopped: {0}")]
    Constraint(String),
}

impl EngineError {
    /// The HTTP status, OpenAI error type and code of the answer.
    pub fn status(&self) -> (StatusCode, &'static str, Option<&'static str>) {
        match self {
            EngineError::Sampler(e) | EngineError::Generation(e) => status_of(e),
            EngineError::NoCache(_) | EngineError::Stopped(_) | EngineError::ShuttingDown => {
                UNAVAILABLE
            }
            EngineError::Constraint(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None),
        }
    }
}

const UNAVAILABLE: (StatusCode, &str, Option<&str>) = (
    StatusCode::SERVICE_UNAVAILABLE,
    "server_error",
    Some("service_unavailable"),
);

/// The HTTP status, OpenAI error type and code for a library error: the caller's fault
/// is 400 (an overlong prompt with code `context_length_exceeded`), a full cache or a
/// lost or failing device is 503 (retry later or elsewhere), anything else is 500.
pub fn status_of(e: &ternion::Error) -> (StatusCode, &'static str, Option<&'static str>) {
    use ternion::{Error as E, TextError as T};
    let bad = (StatusCode::BAD_REQUEST, "invalid_request_error");
    match e.root() {
        E::ContextFull { .. } => (bad.0, bad.1, Some("context_length_exceeded")),
        E::Request(_) | E::Unsupported { .. } | E::Text(T::Tokenizer(_) | T::Template(_)) => {
            (bad.0, bad.1, None)
        }
        E::Text(T::Formats(f)) | E::Formats(f) if is_request_error(f) => (bad.0, bad.1, None),
        E::KvPoolExhausted { .. } => UNAVAILABLE,
        e if e.is_device_fault() => UNAVAILABLE,
        E::NoAdapter { .. } | E::NoSuchAdapter { .. } | E::DeviceRequest { .. } => UNAVAILABLE,
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", None),
    }
}

/// Whether a formats error is the caller's fault: a value this build does not support, a
/// tokenizer file it cannot use, or a KV cache (sized by the caller's context length) that
/// does not fit the memory there is.
fn is_request_error(e: &ternion::FormatError) -> bool {
    use ternion::limits::MemoryUse;
    use ternion::FormatError as F;
    matches!(
        e,
        F::Request(_)
            | F::Unsupported { .. }
            | F::Tokenizer(_)
            | F::KvCacheOverflow { .. }
            | F::InsufficientMemory {
                what: MemoryUse::KvCache { .. },
                ..
            }
    )
}

impl From<&EngineError> for ApiError {
    fn from(e: &EngineError) -> ApiError {
        let (status, kind, code) = e.status();
        ApiError {
            status,
            message: e.to_string(),
            kind,
            param: None,
            code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ternion::gguf::{GgufPlace, GgufProblem};
    use ternion::limits::MemoryUse;
    use ternion::tokenizer::TokenizerError;
    use ternion::{Error as E, FormatError as F, TextError as T};

    #[test]
    fn engine_errors_map_to_openai_statuses() {
        let lost = E::DeviceLost {
            reason: "Destroyed".into(),
            message: "gone".into(),
        };
        let oom = E::OutOfMemory {
            what: "creating buffer 'kv.k'".into(),
            bytes: Some(1 << 30),
            message: "driver".into(),
        };
        let (need, free, capacity) = (3, 1, 8);
        let full = E::ContextFull {
            used: 7,
            new: 2,
            n_ctx: 8,
        };
        let cases = [
            (
                EngineError::Generation(full.into()),
                400,
                Some("context_length_exceeded"),
            ),
            (
                EngineError::Sampler(E::Request("top_p".into()).into()),
                400,
                None,
            ),
            (
                EngineError::Stopped(lost.into()),
                503,
                Some("service_unavailable"),
            ),
            (
                EngineError::Generation(oom.into()),
                503,
                Some("service_unavailable"),
            ),
            (
                EngineError::Generation(
                    E::KvPoolExhausted {
                        need,
                        free,
                        capacity,
                    }
                    .into(),
                ),
                503,
                Some("service_unavailable"),
            ),
            (
                EngineError::Generation(E::Model("bad".into()).into()),
                500,
                None,
            ),
            // The formats and text errors the library wraps keep their statuses.
            (
                EngineError::Generation(
                    E::from(T::Tokenizer(TokenizerError::NoByteToken {
                        byte: 0xE2,
                        piece: "bad text".into(),
                    }))
                    .into(),
                ),
                400,
                None,
            ),
            (
                EngineError::Generation(
                    E::from(T::unsupported("tokenizer.ggml.pre", "x", ["llama3"], "")).into(),
                ),
                400,
                None,
            ),
            (
                EngineError::Generation(
                    E::from(F::Gguf {
                        file: "m.gguf".into(),
                        at: Box::new(GgufPlace::Header),
                        problem: GgufProblem::DataSectionPastEnd {
                            data_offset: 64,
                            file_len: 32,
                        },
                    })
                    .into(),
                ),
                500,
                None,
            ),
            (
                EngineError::Generation(
                    E::from(F::InsufficientMemory {
                        what: MemoryUse::KvCache {
                            n_ctx: 1 << 20,
                            n_layer: 30,
                            kv_dim: 640,
                            weights: 1 << 30,
                        },
                        need: 1 << 40,
                        available: 1 << 33,
                    })
                    .into(),
                ),
                400,
                None,
            ),
            (
                EngineError::Generation(
                    E::from(F::InsufficientMemory {
                        what: MemoryUse::ModelData {
                            file: "m.gguf".into(),
                        },
                        need: 1 << 40,
                        available: 1 << 33,
                    })
                    .into(),
                ),
                500,
                None,
            ),
            (EngineError::ShuttingDown, 503, Some("service_unavailable")),
            (
                EngineError::Constraint("no token allowed".into()),
                500,
                None,
            ),
        ];
        for (e, status, code) in cases {
            let api = ApiError::from(&e);
            assert_eq!((api.status.as_u16(), api.code), (status, code), "{e}");
            assert_eq!(api.message, e.to_string());
            let kind = if status == 400 {
                "invalid_request_error"
            } else {
                "server_error"
            };
            assert_eq!(api.kind, kind, "{e}");
        }
        let stopped = EngineError::Stopped(
            E::DeviceLost {
                reason: "Destroyed".into(),
                message: "gone".into(),
            }
            .into(),
        );
        assert_eq!(
            stopped.to_string(),
            "the engine stopped: GPU device lost (Destroyed): gone"
        );
    }
}
