//! The library's error type: every failure names what it was reading and what it expected.
//!
//! Variants say what happened (a lost device, an allocation over a device limit, a value
//! outside the supported list, …) so that callers can act on the kind without parsing the
//! message: [`Error::kind`] gives a stable name, [`Error::is_device_fault`] tells a device
//! that can no longer be used from a request that was merely refused.

use ternion_formats::error::hint_suffix;

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by the library. Each variant carries enough context (file, tensor,
/// field, expected versus found) to act on without a debugger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A named choice (architecture, KV cache type, pooling, weight type on a backend…)
    /// is not one this build can run; lists the ones it can.
    #[error("{what} '{found}' is not supported (supported: {}){}", .supported.join(", "), hint_suffix(.hint))]
    Unsupported {
        /// What was chosen, e.g. "KV cache type" or "tensor 'x': GPU weight type".
        what: String,
        /// The value found.
        found: String,
        /// The values this build supports there.
        supported: Vec<String>,
        /// What to do instead (may be empty).
        hint: &'static str,
    },
    /// Something the model or the caller asks for needs a capability that is missing here
    /// (an adapter feature, a kernel this backend does not have).
    #[error("{what} needs {needs}")]
    UnsupportedFeature {
        /// What was asked for, e.g. "profiling on llvmpipe".
        what: String,
        /// The capability it needs.
        needs: String,
    },
    /// The model's metadata or tensors do not fit the architecture.
    #[error("model: {0}")]
    Model(String),
    /// A request is invalid (bad token id, bad sampling settings, an API used out of turn).
    #[error("invalid request: {0}")]
    Request(String),
    /// A sequence would grow past its context.
    #[error("context full: {used} positions used + {new} new > context size {n_ctx}")]
    ContextFull {
        /// Positions the sequence already holds.
        used: usize,
        /// Positions asked for.
        new: usize,
        /// The context size.
        n_ctx: usize,
    },
    /// The shared KV-cache pool has fewer free pages than a sequence needs.
    #[error("KV cache pool exhausted: {need} more pages needed, {free} of {capacity} free")]
    KvPoolExhausted {
        /// Pages the sequence asked for.
        need: usize,
        /// Pages free in the pool.
        free: usize,
        /// Pages in the pool.
        capacity: usize,
    },
    /// No GPU adapter is available.
    #[error("no GPU adapter found for backends {backends} ({hint})")]
    NoAdapter {
        /// The backends searched (e.g. "VULKAN | METAL").
        backends: String,
        /// What to install or enable.
        hint: &'static str,
    },
    /// The adapter index asked for (`--device N`) is not in the list.
    #[error("device index {index} out of range: {found} adapter(s) found")]
    NoSuchAdapter {
        /// The index asked for.
        index: usize,
        /// Adapters found.
        found: usize,
    },
    /// The adapter refused to open a device with the requested features and limits.
    #[error("{adapter}: request_device failed: {message}")]
    DeviceRequest {
        /// Adapter name.
        adapter: String,
        /// The driver's reason.
        message: String,
    },
    /// The GPU device was lost (driver reset, `destroy`, the browser took it back); every
    /// buffer on it is gone.
    #[error("GPU device lost ({reason}): {message}")]
    DeviceLost {
        /// wgpu's reason ("Destroyed", "Unknown").
        reason: String,
        /// The driver's message.
        message: String,
    },
    /// The device ran out of memory.
    #[error("out of GPU memory {what}{}: {message}", size_suffix(.bytes))]
    OutOfMemory {
        /// What was being allocated, e.g. "creating buffer 'kv.k'".
        what: String,
        /// Its size, when known.
        bytes: Option<u64>,
        /// The driver's message.
        message: String,
    },
    /// An allocation or binding is larger than a device limit allows.
    #[error(
        "{what}: {bytes} bytes, more than the adapter's {limit} ({max} bytes on {adapter}){}",
        hint_suffix(.hint)
    )]
    ExceedsLimit {
        /// What was too large, e.g. "tensor 'output.weight' (one row)".
        what: String,
        /// Its size in bytes.
        bytes: u64,
        /// The wgpu limit, e.g. "max_storage_buffer_binding_size".
        limit: &'static str,
        /// The limit's value on this adapter.
        max: u64,
        /// Adapter name.
        adapter: String,
        /// What to do instead (may be empty).
        hint: &'static str,
    },
    /// A WGSL kernel failed to preprocess, compile or validate into a pipeline.
    #[error("shader {kernel}: {message}")]
    Shader {
        /// The kernel file and pipeline key.
        kernel: String,
        /// The compiler's or preprocessor's message.
        message: String,
    },
    /// The device reported a validation or internal error outside a shader (an
    /// uncaptured error, a refused buffer, a failed read-back).
    #[error("GPU error {what}: {message}")]
    DeviceFault {
        /// What was being done, e.g. "creating buffer 'x' of 64 bytes".
        what: String,
        /// The driver's message.
        message: String,
    },
    /// A GPU op was built with arguments its kernel cannot run (widths that disagree, a
    /// geometry out of range): a bug in the caller or a model shape the kernels do not
    /// cover. The message starts with the op or tensor.
    #[error("gpu: {0}")]
    KernelArgs(String),
    /// A GPU failure while a weight was being uploaded, with the upload's progress.
    #[error(
        "while uploading '{tensor}' ({:.1} of {:.1} MB of weights on the GPU): {error}",
        *.done as f64 / 1e6,
        *.total as f64 / 1e6
    )]
    Uploading {
        /// The tensor being uploaded.
        tensor: String,
        /// Bytes uploaded before it.
        done: u64,
        /// Bytes of every weight.
        total: u64,
        /// What failed (shown in the message, so not also a `source`).
        error: Box<Error>,
    },
    /// A model file failed to read or convert (GGUF, a quantized format, an MLC directory).
    #[error(transparent)]
    Formats(#[from] ternion_formats::Error),
    /// The tokenizer or the chat template failed.
    #[error(transparent)]
    Text(#[from] ternion_text::Error),
}

fn size_suffix(b: &Option<u64>) -> String {
    b.map(|b| format!(" ({b} bytes)")).unwrap_or_default()
}

impl Error {
    /// An [`Error::Unsupported`] with the supported values as strings.
    pub fn unsupported<S: ToString>(
        what: impl Into<String>,
        found: impl ToString,
        supported: impl IntoIterator<Item = S>,
        hint: &'static str,
    ) -> Self {
        Error::Unsupported {
            what: what.into(),
            found: found.to_string(),
            supported: supported.into_iter().map(|s| s.to_string()).collect(),
            hint,
        }
    }

    /// The error itself, or for [`Error::Uploading`] the failure it wraps.
    pub fn root(&self) -> &Error {
        match self {
            Error::Uploading { error, .. } => error.root(),
            e => e,
        }
    }

    /// True when the GPU device can no longer be trusted (lost, out of memory, or an
    /// uncaptured device error): nothing more should be submitted to it.
    pub fn is_device_fault(&self) -> bool {
        matches!(
            self.root(),
            Error::DeviceLost { .. } | Error::OutOfMemory { .. } | Error::DeviceFault { .. }
        )
    }

    /// A stable name for the variant (of [`Error::root`]), e.g. `"DeviceLost"`, for callers
    /// in other languages (the browser build's JavaScript errors).
    pub fn kind(&self) -> &'static str {
        match self.root() {
            Error::Unsupported { .. } => "Unsupported",
            Error::UnsupportedFeature { .. } => "UnsupportedFeature",
            Error::Model(_) => "Model",
            Error::Request(_) => "Request",
            Error::ContextFull { .. } => "ContextFull",
            Error::KvPoolExhausted { .. } => "KvPoolExhausted",
            Error::NoAdapter { .. } => "NoAdapter",
            Error::NoSuchAdapter { .. } => "NoSuchAdapter",
            Error::DeviceRequest { .. } => "DeviceRequest",
            Error::DeviceLost { .. } => "DeviceLost",
            Error::OutOfMemory { .. } => "OutOfMemory",
            Error::ExceedsLimit { .. } => "ExceedsLimit",
            Error::Shader { .. } => "Shader",
            Error::DeviceFault { .. } => "DeviceFault",
            Error::KernelArgs(_) => "KernelArgs",
            Error::Uploading { .. } => "Uploading",
            Error::Formats(e) => e.kind(),
            Error::Text(e) => e.kind(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_lists_what_is_supported() {
        let e = Error::unsupported("KV cache type", "q4", ["f16", "f32"], "");
        assert_eq!(
            e.to_string(),
            "KV cache type 'q4' is not supported (supported: f16, f32)"
        );
        assert_eq!(e.kind(), "Unsupported");
        let e = Error::unsupported("GPU weight type", "Q3_K", ["F16"], "use --backend cpu");
        assert!(
            e.to_string()
                .ends_with("(supported: F16); use --backend cpu"),
            "{e}"
        );
    }

    #[test]
    fn upload_failures_keep_their_kind() {
        let e = Error::Uploading {
            tensor: "output.weight".into(),
            done: 1_500_000,
            total: 3_000_000,
            error: Box::new(Error::OutOfMemory {
                what: "creating buffer 'x'".into(),
                bytes: Some(9),
                message: "driver".into(),
            }),
        };
        assert_eq!(
            e.to_string(),
            "while uploading 'output.weight' (1.5 of 3.0 MB of weights on the GPU): out of \
             GPU memory creating buffer 'x' (9 bytes): driver"
        );
        assert_eq!(e.kind(), "OutOfMemory");
        assert!(e.is_device_fault());
        assert!(!Error::Request("x".into()).is_device_fault());
    }
}
