//! Ternion in the browser: a wasm-bindgen API over the core crate's WebGPU backend (the
//! same plan, kernels and model code as native), and the static chat page in `www/`.
//!
//! - [`loader`]: the GGUF header from a prefix of the file, then each tensor's byte range
//!   (HTTP range requests or `File` slices) straight into GPU buffers; memory holds one
//!   read-ahead window, never the whole file.
//! - [`mlc`]: MLC `q4f16_1` directories (WebLLM's Phi-3 shards), each tensor's records
//!   read by range and repacked as the native loader does, into the same GPU upload.
//! - [`engine`]: one sequence on a loaded model and its asynchronous generation loop.
//! - [`bench`]: prefill and decode speed, timed as `ternion bench` times native backends.
//! - `api` (wasm32 only): the JavaScript class `Ternion` — `loadUrl`, `loadFile`,
//!   `loadReader`, `loadMlc`, `generate` with a streaming callback, `stop`, `reset` — see `README.md`
//!   ("In the browser", "Node.js") for building, serving and the JavaScript side.
//! - `node/index.mjs`: the package's Node.js entry point (wasm from the package directory,
//!   models from file paths or URLs, WebGPU through a caller's `gpu` object or the CPU).
//!
//! The loader and engine are plain async Rust over small traits ([`loader::ByteSource`],
//! [`engine::Host`]), so native tests run them on lavapipe against the CPU backend.

pub mod bench;
pub mod engine;
pub mod loader;
pub mod mlc;

#[cfg(target_arch = "wasm32")]
mod api;
#[cfg(target_arch = "wasm32")]
mod browser;
#[cfg(target_arch = "wasm32")]
mod webfiles;
