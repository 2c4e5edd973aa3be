//! The model's [`Graph`] compiled once into GPU kernel launches.
//!
//! One builder per graph op, in graph order, each deciding its launches from the op and
//! the formats of its weights alone (no look at the ops around it); its bind groups are
//! made here, at load. The fused ops of the graph map onto the fused kernels:
//! - [`Op::NormLinear`], [`Op::NormQkv`], [`Op::NormGlu`] over I2_S weights → the norm
//!   kernel writes the int8 activations and per-token scales directly (`NormOut::Quant`;
//!   under the fast numerics single-token steps recompute the norm in the matvec's
//!   prologue), then one matvec launch for q/k/v (`Ternary3`) or gate/up/GLU
//!   (`TernaryGlu`) when every matrix is I2_S; other formats normalise into the op's
//!   scratch and run each matrix product on its own (`linear.rs`).
//! - [`Op::SelfAttention`] → one `rope_kv` launch (rotation + F16 cache store; n_rot = 0
//!   without RoPE), then attention, whose single-token split may take the rotation over.
//! - `Linear { add: true }` → the matvec's `Add` epilogue (the residual add).
//! - `SelectRows` → no copy: the ops after it run on the step's rows and the final matvec
//!   (the LM head) multiplies the last row only, every row, or the rows a step picks (the
//!   last token of each sequence of a multi-sequence step: gathered first), as the step asks.
//!
//! A graph op the GPU has no kernel for is an error naming the op, at load.
//!
//! [`Op::NormLinear`]: crate::model::graph::Op::NormLinear
//! [`Op::NormQkv`]: crate::model::graph::Op::NormQkv
//! [`Op::NormGlu`]: crate::model::graph::Op::NormGlu
//! [`Op::SelfAttention`]: crate::model::graph::Op::SelfAttention

mod acts;
mod attention;
mod build;
mod launch;
mod linear;
mod project;

use self::acts::Acts;
use self::build::{Compiler, Steps};
use self::launch::Launch;
use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::ops::{AttnDims, GpuKv, KvIndex, QAct, QuantAct, StepUniform};
use super::upload::GpuWeight;
use crate::kv::KvType;
use crate::model::graph::{Graph, Op};
use crate::model::Logits;
use crate::Result;

/// Lanes per weight row of the ternary and F16 matvecs.
pub(crate) const TPR: u32 = 32;

/// Which rows of the last matvec a step computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rows {
    /// One token, with the reference's decode numerics (F16-rounded input).
    Decode,
    /// The last row of a batch.
    Last,
    /// Every row of a batch.
    All,
    /// None: the step only fills the KV cache (earlier chunks of a prompt).
    Skip,
    /// The rows listed in [`Plan::picks`], in that order: `rows` of them, and whether
    /// every one is a decode row (the one token its sequence brings to the step).
    Picked { rows: u32, decode: bool },
    /// No LM head: the launches before it only, which leave every row of the final hidden
    /// state in [`Plan::hidden`] (embeddings).
    Hidden,
}

impl Rows {
    /// Whether every token of the step is the one its sequence brings (picked decode rows).
    pub(crate) fn all_decode(self) -> bool {
        matches!(self, Rows::Picked { decode: true, .. })
    }

    /// The rows a step of `n` tokens wanting `which` logits computes.
    pub(crate) fn of(n: usize, which: Logits) -> Rows {
        match (n, which) {
            (1, _) => Rows::Decode,
            (_, Logits::All) => Rows::All,
            _ => Rows::Last,
        }
    }
}

/// The compiled forward pass and the buffers it owns.
pub(crate) struct Plan {
    launches: Vec<Launch>,
    /// Token ids of the step (u32 each).
    pub ids: GpuBuffer,
    /// `{ n_tokens, pos }` of the step.
    pub step: StepUniform,
    /// `{ picked rows, 0 }` of the step (read by the GGUF-format head over picked rows).
    pub pick_step: StepUniform,
    /// Rows whose logits a [`Rows::Picked`] step computes (u32 each, `max_batch`).
    pub picks: GpuBuffer,
    /// Positions and sequence slots of the step's tokens, and the page tables.
    pub index: KvIndex,
    /// The logits activation (rows as [`Plan::logits_rows`] allows).
    pub logits: GpuBuffer,
    /// Logits rows the buffer holds.
    pub logits_rows: usize,
    /// Positions a learned position table covers (GPT-2), if the model has one.
    pub max_pos: Option<usize>,
    /// The input of the LM head (the normed final hidden state), if the graph has a head.
    pub hidden: Option<Hidden>,
    _acts: Vec<GpuBuffer>,
    _quant: Vec<QuantAct>,
    _qacts: Vec<QAct>,
    /// Every layer's KV cache.
    kv: Vec<GpuKv>,
    /// One page of a layer's keys (or values), the way of a page copied within a cache.
    kv_scratch: GpuBuffer,
    _weights: Vec<GpuWeight>,
}

/// The final hidden state: what a [`Rows::Hidden`] step leaves for embeddings.
pub(crate) struct Hidden {
    /// Launches before the LM head's (a hidden step records these only).
    pub launches: usize,
    /// Its buffer (`max_batch` rows).
    pub buf: GpuBuffer,
    /// Values per row.
    pub width: usize,
}

/// Fewest logits rows a plan holds (when the batch allows): all-rows requests run in
/// steps of at most this many tokens.
const LOGITS_ROWS: usize = 64;

/// The numerics policy of a GPU plan (docs/ARCHITECTURE.md, "Numerics").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// The fast kernels: RMSNorm + int8 quantization in one f32 pass (fused into the
    /// single-token ternary matvecs), one-launch decode attention with unrounded
    /// probabilities. Within the golden manifests' tolerances of the CPU, not bit-exact.
    #[default]
    Fast,
    /// The CPU reference's arithmetic bit for bit where the kernels can reproduce it
    /// (double-f32 norm sums, exact scale division, F16 probabilities): for validation.
    Exact,
}

/// What a plan is compiled for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanOpts {
    /// Most tokens of one step.
    pub max_batch: usize,
    /// Most positions of one sequence.
    pub n_ctx: usize,
    /// Vocabulary size (logits row width).
    pub n_vocab: usize,
    /// KV cache sizes.
    pub kv: KvSizes,
    /// Numerics policy.
    pub numerics: Numerics,
}

/// Sizes and element type of the paged KV caches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvSizes {
    /// Pages per layer (shared by all sequences).
    pub pages: usize,
    /// Sequence slots (page tables).
    pub slots: usize,
    /// Element type.
    pub ty: KvType,
}

impl Plan {
    /// Compiles `graph` over the uploaded `weights`, with KV caches of `kv.pages` pages
    /// for `kv.slots` sequences of up to `n_ctx` positions.
    pub(crate) fn compile(
        ctx: &GpuContext,
        graph: &Graph,
        weights: Vec<GpuWeight>,
        opts: &PlanOpts,
    ) -> Result<Plan> {
        let PlanOpts {
            max_batch,
            n_ctx,
            n_vocab,
            kv,
            numerics,
        } = *opts;
        let geo = &graph.attn;
        let dims = AttnDims {
            n_head: geo.n_head,
            n_head_kv: geo.n_head_kv,
            head_dim: geo.head_dim,
            n_rot: geo.n_rot,
            rope_base: geo.rope_base,
        };
        let row_bytes = (n_vocab * 4) as u64;
        // Logits rows: enough for one per sequence and for all-rows requests in chunks of
        // LOGITS_ROWS (a vocabulary row is 513 KB for Llama-3: not one per batch token).
        let logits_rows = (max_batch.min(kv.slots.max(LOGITS_ROWS)) as u64)
            .min(ctx.caps().max_binding / row_bytes)
            .max(1) as usize;
        let steps = Steps {
            step: StepUniform::new(ctx)?,
            pick_step: StepUniform::new(ctx)?,
            ids: GpuBuffer::zeroed(ctx, "ids", (max_batch * 4) as u64)?,
            picks: GpuBuffer::zeroed(ctx, "picks", (max_batch * 4) as u64)?,
            index: KvIndex::new(ctx, max_batch, kv.slots, n_ctx, graph.attn.causal)?,
        };
        let kv = (0..graph.n_layer)
            .map(|_| GpuKv::new(ctx, kv.pages, dims.kv_dim(), kv.ty))
            .collect::<Result<Vec<_>>>()?;
        let mut c = Compiler {
            g: ctx,
            graph,
            weights: &weights,
            acts: Acts::new(graph, ctx, max_batch, logits_rows),
            launches: Vec::new(),
            steps: &steps,
            kv: &kv,
            variant: ctx.variant(TPR),
            // Norms reduce with whole subgroups of any size.
            norm_variant: ctx.variant(1),
            fast: numerics == Numerics::Fast,
            dims,
            max_pos: None,
            rope_tables: Vec::new(),
        };
        let mut head = None;
        for op in &graph.ops {
            if let Op::Linear { x, out, .. } = *op {
                if out == graph.logits {
                    head = Some((c.launches.len(), x));
                }
            }
            c.op(op)?;
        }
        let logits = c.acts.f32(graph.logits)?;
        let hidden = match head {
            Some((launches, x)) => Some(Hidden {
                launches,
                buf: c.acts.f32(x)?,
                width: graph.acts[x.0].width,
            }),
            None => None,
        };
        let Compiler {
            launches,
            acts,
            max_pos,
            ..
        } = c;
        let Acts {
            f32s,
            quant,
            qact_bufs,
            keep,
            ..
        } = acts;
        let Steps {
            step,
            pick_step,
            ids,
            picks,
            index,
        } = steps;
        Ok(Plan {
            launches,
            ids,
            step,
            pick_step,
            picks,
            index,
            logits,
            logits_rows,
            max_pos,
            hidden,
            _acts: f32s.into_values().chain(keep).collect(),
            _quant: quant.into_values().collect(),
            _qacts: qact_bufs,
            kv_scratch: GpuBuffer::zeroed(
                ctx,
                "kv.scratch",
                kv.first().map_or(4, GpuKv::page_bytes),
            )?,
            kv,
            _weights: weights,
        })
    }

    /// The launches a step of `rows` records: all of them, or those up to the hidden
    /// state's for a hidden step.
    pub(crate) fn launches_of(&self, rows: Rows) -> usize {
        match (rows, &self.hidden) {
            (Rows::Hidden, Some(h)) => h.launches,
            _ => self.launches.len(),
        }
    }

    /// Records launches `range` (of [`Plan::launches_of`]) of a step of `n` tokens whose
    /// longest context is `n_kv` keys. With `profile`, a timestamp is written after each
    /// launch into query `i + 1` (query 0 before the first).
    pub(crate) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        range: std::ops::Range<usize>,
        (n, n_kv, rows): (u32, u32, Rows),
        profile: Option<&wgpu::QuerySet>,
    ) {
        if let Some(qs) = profile.filter(|_| range.start == 0) {
            pass.write_timestamp(qs, 0);
        }
        for i in range {
            self.launches[i].record(pass, n, n_kv, rows);
            if let Some(qs) = profile {
                pass.write_timestamp(qs, i as u32 + 1);
            }
        }
    }

    /// Records copies of whole KV pages `(from, to)` in every layer's keys and values.
    pub(crate) fn copy_kv_pages(&self, enc: &mut wgpu::CommandEncoder, copies: &[(u32, u32)]) {
        for kv in &self.kv {
            kv.copy_pages(enc, copies, &self.kv_scratch);
        }
    }

    /// Launch groups (timestamps per profiled step: this + 1).
    pub(crate) fn len(&self) -> usize {
        self.launches.len()
    }

    /// Label of launch group `i` (for profiles).
    pub(crate) fn label(&self, i: usize) -> &'static str {
        self.launches[i].label()
    }

    /// Dispatches of launch group `i` in a step of `n` tokens.
    pub(crate) fn dispatches_of(&self, i: usize, n: u32) -> usize {
        self.launches[i].dispatches(n)
    }

    /// Dispatches of one step of `n` tokens.
    pub(crate) fn dispatches(&self, n: u32) -> usize {
        self.launches.iter().map(|l| l.dispatches(n)).sum()
    }
}
