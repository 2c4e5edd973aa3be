//! The GPU backend: wgpu with hand-written WGSL kernels (Vulkan, Metal, DX12; tested on
//! Mesa's lavapipe).
//!
//! # Shape
//! - [`GpuContext`] (`context.rs`) opens an adapter ([`GpuOptions`], [`list_adapters`] for
//!   `--device N`) with the adapter's own limits and the optional features the kernels use
//!   (SHADER_F16, SUBGROUP, TIMESTAMP_QUERY), reports them as [`Caps`], turns uncaptured
//!   errors and device loss into [`crate::Error::DeviceLost`], [`crate::Error::OutOfMemory`] or
//!   [`crate::Error::DeviceFault`] ([`GpuContext::check`]), and counts
//!   every pipeline, bind group and buffer it creates ([`Counters`]).
//! - `pipelines.rs`: a cache of compute pipelines keyed by [`PipelineKey`] = [`Kernel`]
//!   (an enum with each kernel's small integer specialisations, passed to WGSL as
//!   `override` constants) × [`Variant`] (f16, subgroups). Feature-gated code in a kernel
//!   sits between `#if NAME` / `#else` / `#endif` lines (one small preprocessor, see
//!   [`preprocess`]); nothing else rewrites shader text but, in a browser, the
//!   `enable subgroups;` put in front of subgroup variants (`web.rs`). Pipelines use
//!   automatic layouts.
//! - `buffers.rs`: [`GpuBuffer`] (typed upload, read-back for tests) and [`Sharded`], a
//!   row-major matrix split into shards of whole rows that each fit one binding (the
//!   657 MB F16 embedding / LM head against lavapipe's 128 MiB limit). Kernels over a
//!   sharded matrix launch one dispatch per shard.
//! - `ops/`: one struct per kernel, a file per kernel family ([`Embed`], [`RmsNorm`], [`TernaryMatvec`],
//!   [`TernaryMatmul`] (tiled prompt batches: `dot4I8Packed`, or f16 cooperative matrices
//!   where the adapter has them, [`PrefillKernel`]) and [`TernaryLinear`] (picks one per step),
//!   [`F16Matvec`], [`RopeKv`] (NEOX or NORM RoPE from a [`RopeTable`] of angles, + KV-cache store
//!   into a [`GpuKv`]), [`Attention`] (flash-decoding for one token, a workgroup per
//!   (head, token) for a batch), [`Glu`], [`TopK`]; for the other families and formats
//!   [`QMatvec`] over [`QWeights`] in their GGUF format (F32, F16, BF16, Q8_0, Q4_0, Q4_K,
//!   Q6_K, TQ2_0) fed by [`QuantizeAct`], [`QEmbed`] (row gather from such a table) (ggml's Q8_0 / Q8_K activations), and [`RowOp`]
//!   (LayerNorm, bias, GELU, position embeddings, column slice, last-row select)). `new` fetches the pipeline, creates the parameter
//!   uniforms and the bind groups once; `record(&mut ComputePass, n_tokens)` only sets
//!   the pipeline and bind group and dispatches, so recording creates nothing
//!   (docs/ARCHITECTURE.md#gpu-principles; a test checks the counters).
//! - `kernels/*.wgsl`: each file's header documents role, bindings, dispatch and layout.
//! - `upload.rs`: [`GpuUpload`] reads the header, builds the model's graph, checks and
//!   allocates every weight, then takes tensors one at a time in file order (the browser
//!   streams them); `plan/` compiles the graph into launches, one builder per op (fusions
//!   listed there);
//!   `exec.rs`: [`GpuModel`], the step loop, async read-backs, timestamp profiling;
//!   `hidden.rs`: steps without the LM head that read back the final hidden rows
//!   (embeddings: [`GpuModel`] is a `ternion_core::embed::HiddenStates`).
//! - `kernel_checks.rs` (tests, and feature `test-bodies`): kernel test bodies as async
//!   functions of a [`GpuContext`], run natively (`tests.rs`) and in the browser
//!   (`ternion-web/tests/kernels.rs`).
//!
//! # A step
//! The plan builds the ops at load time against persistent buffers (hidden state, quantized
//! activations, logits, a [`StepUniform`] for batched kernels). Per step: write the token
//! ids (and the step uniform), then
//! ```text
//! let mut enc = ctx.encoder();
//! {
//!     let mut pass = enc.begin_compute_pass(&Default::default());
//!     embed.record(&mut pass, n);
//!     norm.record(&mut pass, n);            // rmsnorm + int8 quantization
//!     wq.record(&mut pass, n, n > 1);       // ternary matvec / batched matmul
//!     ...
//!     topk.record(&mut pass);
//! }
//! topk.record_download(&mut enc);
//! ctx.submit(enc);                           // one submit per step
//! let best = topk.read(&ctx)?;               // k values, not the whole vocabulary
//! ```
//! Dispatches inside one pass are ordered by wgpu's usage tracking (a read-after-write on
//! a storage buffer gets a barrier), which costs far less than a pass per kernel.
//!
//! # Numerics (see each kernel's header)
//! - Ternary products are exact integer dots (`dot4I8Packed` on the I2_S codes as stored,
//!   minus Σq), scaled in f32 in the reference's order.
//! - RMSNorm sums squares in f32 by a tree (the reference uses f64); int8 quantization
//!   reproduces `quantize_per_token` exactly given the same normalised values, including
//!   the f64-then-f32 scale (exact integer division) and round-half-to-even.
//! - F16 products accumulate in f32 in a different order than the CPU.
//! - RoPE angles are the reference's f32 products bit for bit; sin/cos are computed by the
//!   kernel (Cody–Waite reduction + polynomials), not by the vendor's builtins.
//! - Every f32→F16 rounding (KV cache, Q for QKᵀ, decode probabilities) is round to nearest
//!   even in integer arithmetic, as `half::f16::from_f32`.

mod bandwidth;
mod batch;
mod buffers;
mod context;
mod engine;
mod exec;
#[cfg(test)]
mod exec_tests;
mod greedy;
mod hidden;
#[cfg(any(test, feature = "test-bodies"))]
pub mod kernel_checks;
mod ops;
mod pipelines;
mod plan;
mod preprocess;
mod profile;
mod seqs;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_arch;
#[cfg(test)]
mod tests_decode;
#[cfg(test)]
mod tests_errors;
#[cfg(test)]
mod tests_fam;
#[cfg(test)]
mod tests_mm;
#[cfg(test)]
mod tests_plan;
mod topk;
mod upload;
#[cfg(target_arch = "wasm32")]
mod web;
mod workgroup_mem;

pub use bandwidth::{measure_dispatch_latency, measure_read_bandwidth};
pub use batch::GpuBatch;
pub use buffers::{GpuBuffer, Sharded, STORAGE, UNIFORM};
#[cfg(not(target_arch = "wasm32"))]
pub use context::list_adapters;
pub use context::{AdapterListing, Caps, Counters, GpuContext, GpuOptions, PrefillKernel};
pub use engine::GpuEngine;
pub use exec::{GpuModel, GpuModelOptions};
pub use greedy::GreedyChain;
pub use ops::{
    ActQuant, Attention, AttnDims, AttnOpts, CoopFused, Dispatch, Embed, F16Matvec, Glu, GpuKv,
    KvIndex, MatIn, MatmulKind, NarrowFused, NormOut, PosTable, QAct, QEmbed, QFormat, QMatvec,
    QMatvecOpts, QWeights, QuantAct, QuantizeAct, RmsNorm, RopeKv, RopeOpts, RopeTable, RowOp,
    RowOpKind, StepUniform, Ternary3, TernaryGlu, TernaryLinear, TernaryMatmul, TernaryMatvec,
    TernaryWeights, TopK, ATTN_CHUNK, MAX_TOPK, MM_TILE_TOKENS, SELECT_CHUNK, WG,
};
pub use pipelines::{
    AttnStage, Epilogue, F16Rows, GluAct, Kernel, PipelineCache, PipelineKey, Variant,
};
pub use plan::Numerics;
pub use preprocess::preprocess;
pub use profile::KernelTime;
pub use seqs::{GpuSeq, GpuSeqStep};
pub use upload::{GpuUpload, TensorRequest};

use ternion_core::{backend, embed, generate, gguf, kv, model, quant, session, Error, Result};
#[cfg(test)]
use ternion_core::{sample, tokenizer};
/// The shared test data beside the repository, for the unit tests.
#[cfg(test)]
use ternion_testkit::shared as test_shared;
/// Synthetic models for the unit tests.
#[cfg(test)]
use ternion_testkit::synth;
