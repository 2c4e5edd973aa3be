//! The model's [`Graph`] compiled once into GPU kernel launches.
//!
//! Every graph op becomes one op struct of `ops/` (its bind groups made here, at load),
//! in graph order. Fusions, all decided from the graph alone:
//! - `RmsNorm` whose output only feeds I2_S linears → the norm kernel writes the int8
//!   activations and per-token scales directly (`NormOut::Quant`); the f32 output is
//!   never materialised.
//! - `Rope` followed by `KvStore` → one `rope_kv` launch (rotation + F16 cache store).
//! - `Linear { add: true }` → the matvec's `Add` epilogue (the residual add).
//! - `SelectRows` → no copy: the ops after it run on the step's rows and the final matvec
//!   (the LM head) multiplies the last row only, every row, or the rows a step picks (the
//!   last token of each sequence of a multi-sequence step: gathered first), as the step asks.
//!
//! A graph op the GPU has no kernel for is an error naming the op, at load.

use std::collections::HashMap;

use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::ops::{kernel_glu, Elementwise, WindowAttention};
use super::ops::{
    ActQuant, Attention, AttnDims, AttnOpts, Embed, F16Matvec, Glu, GpuKv, KvIndex, MatIn, NormIn,
    NormMatvec, NormMatvecKind, NormOut, NormQuant, PosTable, QAct, QEmbed, QMatvec, QMatvecOpts,
    QWeights, QuantAct, QuantizeAct, RmsNorm, RopeKv, RopeOpts, RowOp, StepUniform, Ternary3,
    TernaryGlu, TernaryLinear,
};
use super::pipelines::Epilogue;
use super::upload::GpuWeight;
use crate::model::graph::{ActId, GluAct, Graph, Op, UnaryAct, WeightId};
use crate::model::Logits;
use crate::{Error, Result};

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
    /// The rows listed in [`Plan::picks`] (this many), in that order.
    Picked(u32),
}

impl Rows {
    /// The rows a step of `n` tokens wanting `which` logits computes.
    pub(crate) fn of(n: usize, which: Logits) -> Rows {
        match (n, which) {
            (1, _) => Rows::Decode,
            (_, Logits::All) => Rows::All,
            _ => Rows::Last,
        }
    }
}

/// One compiled launch group.
enum Launch {
    Embed(Embed),
    Norm(RmsNorm),
    Ternary(TernaryLinear),
    /// Gate and up I2_S matvecs and the GLU: fused for one token, three launches (the
    /// prefill kernels and `glu.wgsl`) for a batch.
    TernaryGlu(Box<FusedGlu>),
    /// Three I2_S matvecs sharing their input (q, k, v): one launch for one token, the
    /// three prefill kernels for a batch.
    Ternary3(Box<(Ternary3, [TernaryLinear; 3])>),
    RopeKv(RopeKv),
    Attention(Attention),
    Glu(Glu),
    /// The F16 matvec over selected rows (the LM head), in its row modes.
    Head(Box<Head>),
    /// Activation quantization (Q8_0 / Q8_K) for the GGUF-format matvecs.
    Quantize(QuantizeAct),
    /// A GGUF-format matvec.
    QLinear(QMatvec),
    /// A GGUF-format embedding gather.
    QEmbed(QEmbed),
    /// LayerNorm, bias, GELU, position embedding, slice.
    Row(RowOp),
    /// Per-head RMSNorm, scale, residual add.
    Elem(Elementwise),
    /// Logit soft-capping over the rows the head computed.
    SoftCap(Elementwise),
    /// Attention of a sliding-window layer.
    WindowAttention(WindowAttention),
    /// A GGUF-format matvec over selected rows: decode and last-row modes copy the step's
    /// last row out first (`select`), then quantize it when the format asks.
    QHead(Box<QHead>),
    /// The fast norm + int8 quantization, written out (steps of several tokens).
    NormQuant(NormQuant),
    /// A launch that single-token steps skip (its consumers recompute it).
    BatchOnly(Box<Launch>),
    /// A single-token launch with its norm in the prologue, and the launch steps of several
    /// tokens run instead.
    Decode(Box<(NormMatvec, Launch)>),
}

/// The parts of [`Launch::TernaryGlu`].
struct FusedGlu {
    fused: TernaryGlu,
    gate: TernaryLinear,
    up: TernaryLinear,
    glu: Glu,
}

/// The parts of [`Launch::Head`]: one matvec per row mode; picked rows are gathered into
/// a compact buffer first.
struct Head {
    decode: F16Matvec,
    last: F16Matvec,
    all: F16Matvec,
    gather: RowOp,
    picked: F16Matvec,
}

/// The parts of [`Launch::QHead`].
struct QHead {
    select: RowOp,
    quant_one: Option<QuantizeAct>,
    decode: QMatvec,
    last: QMatvec,
    quant_all: Option<QuantizeAct>,
    all: QMatvec,
    gather: RowOp,
    quant_picked: Option<QuantizeAct>,
    picked: QMatvec,
}

impl Launch {
    /// `batch`, with `single` (when there is one) for single-token steps.
    fn decode(single: Option<NormMatvec>, batch: Launch) -> Launch {
        match single {
            Some(s) => Launch::Decode(Box::new((s, batch))),
            None => batch,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Launch::NormQuant(_) => "rmsnorm",
            Launch::BatchOnly(l) => l.label(),
            Launch::Decode(b) => match &b.1 {
                Launch::Ternary3(_) => "norm+ternary_qkv",
                Launch::TernaryGlu(_) => "norm+ternary_glu",
                _ => "norm+ternary",
            },
            Launch::Embed(_) => "embed",
            Launch::Norm(_) => "rmsnorm",
            Launch::Ternary(_) => "ternary",
            Launch::TernaryGlu(_) => "ternary_glu",
            Launch::Ternary3(_) => "ternary_qkv",
            Launch::RopeKv(_) => "rope_kv",
            Launch::Attention(_) => "attention",
            Launch::Glu(_) => "glu",
            Launch::Head(_) | Launch::QHead(_) => "lm_head",
            Launch::Quantize(_) => "quantize",
            Launch::QLinear(_) => "qmatvec",
            Launch::QEmbed(_) => "embed",
            Launch::Row(_) => "rowop",
            Launch::Elem(_) => "elementwise",
            Launch::SoftCap(_) => "softcap",
            Launch::WindowAttention(_) => "window_attention",
        }
    }

    fn record(&self, pass: &mut wgpu::ComputePass<'_>, n: u32, n_kv: u32, rows: Rows) {
        match self {
            Launch::NormQuant(o) => o.record(pass, n),
            Launch::BatchOnly(l) => {
                if n > 1 {
                    l.record(pass, n, n_kv, rows);
                }
            }
            Launch::Decode(b) => {
                if n == 1 {
                    b.0.record(pass);
                } else {
                    b.1.record(pass, n, n_kv, rows);
                }
            }
            Launch::Embed(e) => e.record(pass, n),
            Launch::Norm(o) => o.record(pass, n),
            Launch::Ternary(o) => o.record(pass, n),
            Launch::Ternary3(b) => {
                if n == 1 {
                    b.0.record(pass, 1);
                } else {
                    for mv in &b.1 {
                        mv.record(pass, n);
                    }
                }
            }
            Launch::TernaryGlu(f) => {
                let FusedGlu {
                    fused,
                    gate,
                    up,
                    glu,
                } = &**f;
                if n == 1 {
                    fused.record(pass, 1);
                } else {
                    gate.record(pass, n);
                    up.record(pass, n);
                    glu.record(pass, n);
                }
            }
            Launch::RopeKv(o) => o.record_step(pass, n, n_kv),
            Launch::Attention(o) => o.record(pass, n, n_kv, matches!(rows, Rows::Picked(_))),
            Launch::Glu(o) => o.record(pass, n),
            Launch::Head(h) => match rows {
                Rows::Decode => h.decode.record(pass, n),
                Rows::Last => h.last.record(pass, n),
                Rows::All => h.all.record(pass, n),
                Rows::Picked(m) => {
                    h.gather.record(pass, m);
                    h.picked.record(pass, m);
                }
                Rows::Skip => {}
            },
            Launch::Quantize(o) => o.record(pass, n),
            Launch::QLinear(o) => o.record(pass, n, n > 1),
            Launch::QEmbed(o) => o.record(pass, n),
            Launch::Row(o) => o.record(pass, n),
            Launch::Elem(o) => o.record(pass, n),
            Launch::SoftCap(o) => match rows {
                Rows::Decode | Rows::Last => o.record(pass, 1),
                Rows::All => o.record(pass, n),
                Rows::Picked(m) => o.record(pass, m),
                Rows::Skip => {}
            },
            Launch::WindowAttention(o) => o.record(pass, n),
            Launch::QHead(h) => {
                let QHead {
                    select,
                    quant_one,
                    decode,
                    last,
                    quant_all,
                    all,
                    gather,
                    quant_picked,
                    picked,
                } = &**h;
                if rows == Rows::Skip {
                    return;
                }
                if let Rows::Picked(m) = rows {
                    gather.record(pass, m);
                    if let Some(q) = quant_picked {
                        q.record(pass, m);
                    }
                    picked.record(pass, m, m > 1);
                } else if rows == Rows::All {
                    if let Some(q) = quant_all {
                        q.record(pass, n);
                    }
                    all.record(pass, n, n > 1);
                } else {
                    select.record(pass, n);
                    if let Some(q) = quant_one {
                        q.record(pass, 1);
                    }
                    let mv = if rows == Rows::Decode { decode } else { last };
                    mv.record(pass, 1, false);
                }
            }
        }
    }

    fn dispatches(&self, n: u32) -> usize {
        match self {
            Launch::BatchOnly(l) if n > 1 => l.dispatches(n),
            Launch::BatchOnly(_) => 0,
            Launch::Decode(_) if n == 1 => 1,
            Launch::Decode(b) => b.1.dispatches(n),
            Launch::Embed(e) => e.dispatch_count(),
            Launch::Attention(a) => a.dispatches(n, 1, false),
            Launch::RopeKv(r) if r.skips(n, 1) => 0,
            Launch::TernaryGlu(_) | Launch::Ternary3(_) if n > 1 => 3,
            Launch::Head(h) => h.decode.dispatch_count(),
            Launch::QLinear(o) => o.dispatch_count(),
            Launch::QHead(h) => 1 + usize::from(h.quant_one.is_some()) + h.decode.dispatch_count(),
            _ => 1,
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
    _acts: Vec<GpuBuffer>,
    _quant: Vec<QuantAct>,
    _qacts: Vec<QAct>,
    _kv: Vec<GpuKv>,
    _weights: Vec<GpuWeight>,
}

/// Where the activations live while compiling.
struct Acts<'g> {
    graph: &'g Graph,
    ctx: &'g GpuContext,
    max_batch: usize,
    logits_rows: usize,
    f32s: HashMap<ActId, GpuBuffer>,
    /// Acts whose current value exists only as int8 activations.
    quant: HashMap<ActId, QuantAct>,
    /// Q8_0 / Q8_K copies of acts, valid until the act is written again.
    qacts: HashMap<(ActId, ActQuant), QAct>,
    /// Every Q8 buffer made (kept alive with the plan).
    qact_bufs: Vec<QAct>,
    /// Other buffers the launches bind (picked-row copies).
    keep: Vec<GpuBuffer>,
    /// Acts standing for the selected rows of another act (`SelectRows`).
    alias: HashMap<ActId, ActId>,
    /// Acts computed on selected rows.
    selected: Vec<ActId>,
    /// Under the fast numerics: int8 acts whose norm single-token consumers recompute in
    /// their prologue (the norm launch itself runs only for steps of several tokens).
    norm_in: HashMap<ActId, NormIn>,
}

impl Acts<'_> {
    fn resolve(&self, a: ActId) -> ActId {
        self.alias.get(&a).copied().unwrap_or(a)
    }

    fn f32(&mut self, a: ActId) -> Result<GpuBuffer> {
        let a = self.resolve(a);
        if let Some(b) = self.f32s.get(&a) {
            return Ok(b.clone());
        }
        let d = &self.graph.acts[a.0];
        let rows = if a == self.graph.logits {
            self.logits_rows
        } else {
            self.max_batch
        };
        let b = GpuBuffer::zeroed(self.ctx, d.name, (rows * d.width * 4) as u64)?;
        self.f32s.insert(a, b.clone());
        Ok(b)
    }

    fn quant(&mut self, a: ActId) -> Result<QuantAct> {
        let a = self.resolve(a);
        if let Some(q) = self.quant.get(&a) {
            return Ok(q.clone());
        }
        let q = QuantAct::new(self.ctx, self.graph.acts[a.0].width, self.max_batch)?;
        self.quant.insert(a, q.clone());
        Ok(q)
    }

    fn is_selected(&self, a: ActId) -> bool {
        self.selected.contains(&a)
    }

    /// Forgets the quantized copies of an act that an op is about to overwrite.
    fn written(&mut self, a: ActId) {
        let a = self.resolve(a);
        self.qacts.retain(|(b, _), _| *b != a);
    }

    /// The `kind` quantization of act `x` (`rows` rows), emitting the quantize launch the
    /// first time after `x` was written.
    fn qact(&mut self, x: ActId, kind: ActQuant, launches: &mut Vec<Launch>) -> Result<QAct> {
        let x = self.resolve(x);
        if let Some(q) = self.qacts.get(&(x, kind)) {
            return Ok(q.clone());
        }
        let width = self.graph.acts[x.0].width;
        let q = QAct::new(self.ctx, kind, width, self.max_batch)?;
        let xb = self.f32(x)?;
        launches.push(Launch::Quantize(QuantizeAct::new(self.ctx, &xb, &q)?));
        self.qacts.insert((x, kind), q.clone());
        self.qact_bufs.push(q.clone());
        Ok(q)
    }
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

/// Sizes of the paged KV caches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvSizes {
    /// Pages per layer (shared by all sequences).
    pub pages: usize,
    /// Sequence slots (page tables).
    pub slots: usize,
}

/// The compact copy of the picked rows of an act of `width` (the head's input).
fn picked_rows(ctx: &GpuContext, width: usize, max_batch: usize) -> Result<GpuBuffer> {
    GpuBuffer::zeroed(ctx, "picked", (max_batch * width * 4) as u64)
}

/// A weight uploaded as a GGUF-format matrix, with its output scale.
fn quant_weight(weights: &[GpuWeight], w: WeightId) -> Option<(&QWeights, f32)> {
    match &weights[w.0] {
        GpuWeight::Quant { w: Some(q), scale } => Some((q, *scale)),
        _ => None,
    }
}

/// True when every read of `act` after op `i`, until it is next written, is the input of
/// an I2_S linear (so it can live as int8 activations only).
fn only_ternary_readers(graph: &Graph, weights: &[GpuWeight], i: usize, act: ActId) -> bool {
    let mut read = false;
    for op in &graph.ops[i + 1..] {
        let (reads, writes) = op_io(op);
        if reads.contains(&act) {
            match op {
                Op::Linear { w, x, .. }
                    if *x == act && matches!(weights[w.0], GpuWeight::Ternary(_)) =>
                {
                    read = true
                }
                _ => return false,
            }
        }
        if writes.contains(&act) {
            break;
        }
    }
    read
}

/// Activations an op reads and writes.
fn op_io(op: &Op) -> (Vec<ActId>, Vec<ActId>) {
    match *op {
        Op::Embed { out, .. } => (vec![], vec![out]),
        Op::RmsNorm { x, out, .. } | Op::LayerNorm { x, out, .. } => (vec![x], vec![out]),
        Op::Linear { x, out, add, .. } => {
            let reads = if add { vec![x, out] } else { vec![x] };
            (reads, vec![out])
        }
        Op::Rope { q, k, .. } => (vec![q, k], vec![q, k]),
        Op::KvStore { k, v, .. } => (vec![k, v], vec![]),
        Op::Attention { q, out, .. } => (vec![q], vec![out]),
        Op::Glu { gate, up, .. } => (vec![gate, up], vec![gate]),
        Op::AddBias { x, .. } | Op::Act { x, .. } | Op::AddPosEmbed { x, .. } => (vec![x], vec![x]),
        Op::Slice { x, out, .. } | Op::SelectRows { x, out } => (vec![x], vec![out]),
        Op::HeadRmsNorm { x, out, .. } => (vec![x], vec![out]),
        Op::Scale { x, .. } | Op::SoftCap { x, .. } => (vec![x], vec![x]),
        Op::Add { x, y } => (vec![x, y], vec![x]),
    }
}

fn unsupported(op: &Op) -> Error {
    Error::Gpu(format!(
        "the GPU backend has no kernel for {op:?} in this build (use --backend cpu)"
    ))
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
        let fast = numerics == Numerics::Fast;
        let g = ctx;
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
            .min(g.caps().max_binding / row_bytes)
            .max(1) as usize;
        let step = StepUniform::new(g)?;
        let pick_step = StepUniform::new(g)?;
        let ids = GpuBuffer::zeroed(g, "ids", (max_batch * 4) as u64)?;
        let picks = GpuBuffer::zeroed(g, "picks", (max_batch * 4) as u64)?;
        let index = KvIndex::new(g, max_batch, kv.slots, n_ctx)?;
        let kv = (0..graph.n_layer)
            .map(|_| GpuKv::new(g, kv.pages, dims.kv_dim()))
            .collect::<Result<Vec<_>>>()?;
        let mut acts = Acts {
            graph,
            ctx: g,
            max_batch,
            logits_rows,
            f32s: HashMap::new(),
            quant: HashMap::new(),
            qacts: HashMap::new(),
            qact_bufs: Vec::new(),
            keep: Vec::new(),
            alias: HashMap::new(),
            selected: Vec::new(),
            norm_in: HashMap::new(),
        };
        let variant = g.variant(TPR);
        // Norms reduce with whole subgroups of any size.
        let norm_variant = g.variant(1);
        let vector = |w: WeightId| match &weights[w.0] {
            GpuWeight::Vector(Some(b)) => Ok(b.clone()),
            _ => Err(Error::Gpu(format!(
                "weight '{}' is not an uploaded vector",
                graph.weights[w.0].name
            ))),
        };
        let width = |a: ActId| graph.acts[a.0].width;
        let mut launches = Vec::new();
        // Layer → index of its rope_kv launch.
        let mut ropes: HashMap<usize, usize> = HashMap::new();
        let mut max_pos = None;
        let mut i = 0;
        while i < graph.ops.len() {
            let op = &graph.ops[i];
            for w in op_io(op).1 {
                acts.written(w);
            }
            match *op {
                Op::Embed { table, out } => {
                    let out = acts.f32(out)?;
                    launches.push(match (&weights[table.0], quant_weight(&weights, table)) {
                        (GpuWeight::F16Rows(t), _) => {
                            Launch::Embed(Embed::new(g, variant, t, &ids, &out)?)
                        }
                        (_, Some((q, _))) => Launch::QEmbed(QEmbed::new(g, q, &ids, &out)?),
                        _ => return Err(unsupported(op)),
                    });
                }
                Op::RmsNorm { x, w, out } => {
                    let (xb, wb) = (acts.f32(x)?, vector(w)?);
                    let eps = graph.rms_eps;
                    if acts.is_selected(x) {
                        acts.selected.push(out);
                    }
                    let n = width(x);
                    let quant = only_ternary_readers(graph, &weights, i, out);
                    if quant && fast && NormIn::fits(n) {
                        let q = acts.quant(out)?;
                        let norm = NormIn {
                            x: xb,
                            w: wb,
                            k: n,
                            eps,
                        };
                        let nq = NormQuant::new(g, &norm, &q)?;
                        acts.norm_in.insert(acts.resolve(out), norm);
                        launches.push(Launch::BatchOnly(Box::new(Launch::NormQuant(nq))));
                    } else {
                        let norm = if quant {
                            let q = acts.quant(out)?;
                            RmsNorm::new(g, norm_variant, &xb, &wb, n, eps, NormOut::Quant(&q))?
                        } else {
                            let ob = acts.f32(out)?;
                            RmsNorm::new(g, norm_variant, &xb, &wb, n, eps, NormOut::F32(&ob))?
                        };
                        launches.push(Launch::Norm(norm));
                    }
                }
                Op::LayerNorm { x, w, b, eps, out } => {
                    if acts.is_selected(x) {
                        acts.selected.push(out);
                    }
                    let (xb, wb, bb, ob) = (acts.f32(x)?, vector(w)?, vector(b)?, acts.f32(out)?);
                    launches.push(Launch::Row(RowOp::layer_norm(
                        g,
                        &xb,
                        &wb,
                        &bb,
                        width(x),
                        eps,
                        &ob,
                    )?));
                }
                Op::Linear { w, x, out, add } => {
                    let epilogue = if add { Epilogue::Add } else { Epilogue::Store };
                    let ob = acts.f32(out)?;
                    match (&weights[w.0], quant_weight(&weights, w)) {
                        (GpuWeight::Ternary(tw), _) => {
                            // The int8 copy an RMSNorm wrote, when the last writer of x
                            // is one; otherwise (llama + I2_S) quantize x here.
                            let normed = graph.ops[..i]
                                .iter()
                                .rev()
                                .find(|o| op_io(o).1.contains(&x))
                                .is_some_and(|o| matches!(o, Op::RmsNorm { .. }));
                            let q = match acts.quant.get(&acts.resolve(x)).cloned() {
                                Some(q) if normed => q,
                                _ => {
                                    let (xb, q) = (acts.f32(x)?, acts.quant(x)?);
                                    launches.push(Launch::Elem(Elementwise::quant_i8(g, &xb, &q)?));
                                    q
                                }
                            };
                            let mv = |w, out: &GpuBuffer| {
                                TernaryLinear::new(g, variant, TPR, w, &q, out, epilogue, &step)
                            };
                            // Under the fast numerics: the single-token launch with the norm
                            // in its prologue.
                            let norm_in = acts.norm_in.get(&acts.resolve(x)).cloned();
                            let single = |kind| -> Result<Option<NormMatvec>> {
                                norm_in
                                    .as_ref()
                                    .map(|n| NormMatvec::new(g, n, kind))
                                    .transpose()
                            };
                            // gate = W_g·x; up = W_u·x; gate = act(gate)·up → one launch.
                            let glu = match (graph.ops.get(i + 1), graph.ops.get(i + 2)) {
                                (
                                    Some(&Op::Linear {
                                        w: wu,
                                        x: xu,
                                        out: up,
                                        add: false,
                                    }),
                                    Some(&Op::Glu { act, gate, up: up2 }),
                                ) if !add
                                    && xu == x
                                    && gate == out
                                    && up2 == up
                                    && act != GluAct::GeluTanh =>
                                {
                                    match &weights[wu.0] {
                                        GpuWeight::Ternary(uw) => Some((uw, up, act)),
                                        _ => None,
                                    }
                                }
                                _ => None,
                            };
                            // Three linears of the same input, stored (q, k, v) → one launch.
                            let three = |j: usize| match graph.ops.get(i + j) {
                                Some(&Op::Linear {
                                    w,
                                    x: xj,
                                    out,
                                    add: false,
                                }) if xj == x && !add => match &weights[w.0] {
                                    GpuWeight::Ternary(tw) => Some((tw, out)),
                                    _ => None,
                                },
                                _ => None,
                            };
                            let qkv = match (three(1), three(2)) {
                                (Some(b), Some(c))
                                    if glu.is_none()
                                        && ![out, b.1, c.1].contains(&x)
                                        && out != b.1
                                        && out != c.1
                                        && b.1 != c.1 =>
                                {
                                    Some((b, c))
                                }
                                _ => None,
                            };
                            if let Some(((w1, o1), (w2, o2))) = qkv {
                                let (b1, b2) = (acts.f32(o1)?, acts.f32(o2)?);
                                let fused = Ternary3::new(
                                    g,
                                    variant,
                                    TPR,
                                    [tw, w1, w2],
                                    &q,
                                    [&ob, &b1, &b2],
                                )?;
                                let each = [mv(tw, &ob)?, mv(w1, &b1)?, mv(w2, &b2)?];
                                let one = single(NormMatvecKind::Three {
                                    w: [tw, w1, w2],
                                    out: [&ob, &b1, &b2],
                                })?;
                                launches.push(Launch::decode(
                                    one,
                                    Launch::Ternary3(Box::new((fused, each))),
                                ));
                                i += 2;
                            } else if let Some((uw, up, act)) = glu {
                                let act = kernel_glu(act);
                                let ub = acts.f32(up)?;
                                let one = single(NormMatvecKind::Glu {
                                    gate: tw,
                                    up: uw,
                                    out: &ob,
                                    act,
                                })?;
                                let fused = Launch::TernaryGlu(Box::new(FusedGlu {
                                    fused: TernaryGlu::new(g, variant, TPR, tw, uw, &q, &ob, act)?,
                                    gate: mv(tw, &ob)?,
                                    up: mv(uw, &ub)?,
                                    glu: Glu::new(g, act, &ob, &ub, width(out))?,
                                }));
                                launches.push(Launch::decode(one, fused));
                                i += 2;
                            } else {
                                let one = single(NormMatvecKind::One {
                                    w: tw,
                                    out: &ob,
                                    epilogue,
                                })?;
                                launches.push(Launch::decode(one, Launch::Ternary(mv(tw, &ob)?)));
                            }
                        }
                        (GpuWeight::F16Rows(m), _) if acts.is_selected(x) && !add => {
                            let xb = acts.f32(x)?;
                            let pb = picked_rows(g, width(x), max_batch)?;
                            launches.push(Launch::Head(Box::new(Head {
                                decode: F16Matvec::one_token(g, variant, TPR, m, &xb, &ob, true)?,
                                last: F16Matvec::last_row(
                                    g, variant, TPR, m, &xb, &ob, false, &step,
                                )?,
                                all: F16Matvec::rows8(g, variant, TPR, m, &xb, &ob, &step)?,
                                gather: RowOp::gather(g, &xb, width(x), &picks, &pb, true)?,
                                picked: F16Matvec::rows8(g, variant, TPR, m, &pb, &ob, &pick_step)?,
                            })));
                            acts.keep.push(pb);
                        }
                        (_, Some((qw, post_scale))) => {
                            let opts = |round_x| QMatvecOpts {
                                epilogue,
                                round_x,
                                post_scale,
                            };
                            let mv = |input: MatIn<'_>, round_x| {
                                QMatvec::new(
                                    g,
                                    variant,
                                    TPR,
                                    qw,
                                    input,
                                    &ob,
                                    opts(round_x),
                                    Some(&step),
                                )
                            };
                            let kind = qw.fmt.act();
                            if acts.is_selected(x) {
                                let sel = GpuBuffer::zeroed(g, "selected", (width(x) * 4) as u64)?;
                                let select =
                                    RowOp::select_last(g, &step, &acts.f32(x)?, width(x), &sel)?;
                                let (quant_one, one) = match kind {
                                    Some(k) => {
                                        let q = QAct::new(g, k, width(x), 1)?;
                                        acts.qact_bufs.push(q.clone());
                                        (Some(QuantizeAct::new(g, &sel, &q)?), Some(q))
                                    }
                                    None => (None, None),
                                };
                                let in_one = || match &one {
                                    Some(q) => MatIn::Quant(q),
                                    None => MatIn::F32(&sel),
                                };
                                let (decode, last) = (mv(in_one(), true)?, mv(in_one(), false)?);
                                let (quant_all, all) = match kind {
                                    Some(k) => {
                                        let q = QAct::new(g, k, width(x), max_batch)?;
                                        acts.qact_bufs.push(q.clone());
                                        let qa = QuantizeAct::new(g, &acts.f32(x)?, &q)?;
                                        (Some(qa), mv(MatIn::Quant(&q), false)?)
                                    }
                                    None => (None, mv(MatIn::F32(&acts.f32(x)?), true)?),
                                };
                                let pb = picked_rows(g, width(x), max_batch)?;
                                // F32-input formats round a decode row's input like
                                // `decode` (round_x); Q8 inputs are quantized unrounded.
                                let xb = acts.f32(x)?;
                                let round = kind.is_none();
                                let gather = RowOp::gather(g, &xb, width(x), &picks, &pb, round)?;
                                let pick_mv = |input: MatIn<'_>| {
                                    QMatvec::new(
                                        g,
                                        variant,
                                        TPR,
                                        qw,
                                        input,
                                        &ob,
                                        opts(false),
                                        Some(&pick_step),
                                    )
                                };
                                let (quant_picked, picked) = match kind {
                                    Some(k) => {
                                        let q = QAct::new(g, k, width(x), max_batch)?;
                                        acts.qact_bufs.push(q.clone());
                                        let qa = QuantizeAct::new(g, &pb, &q)?;
                                        (Some(qa), pick_mv(MatIn::Quant(&q))?)
                                    }
                                    None => (None, pick_mv(MatIn::F32(&pb))?),
                                };
                                acts.keep.push(pb);
                                launches.push(Launch::QHead(Box::new(QHead {
                                    select,
                                    quant_one,
                                    decode,
                                    last,
                                    quant_all,
                                    all,
                                    gather,
                                    quant_picked,
                                    picked,
                                })));
                            } else {
                                let linear = match kind {
                                    Some(k) => {
                                        let q = acts.qact(x, k, &mut launches)?;
                                        mv(MatIn::Quant(&q), true)?
                                    }
                                    None => mv(MatIn::F32(&acts.f32(x)?), true)?,
                                };
                                launches.push(Launch::QLinear(linear));
                            }
                        }
                        _ => return Err(unsupported(op)),
                    }
                }
                Op::Rope { .. } | Op::KvStore { .. } => {
                    // RoPE then the KV store → one rope_kv launch; a KV store alone (GPT-2)
                    // is the same kernel with n_rot = 0, which binds the layer's queries and
                    // leaves them as they are.
                    let (q, layer, k, v, d, freqs) = match (op, graph.ops.get(i + 1)) {
                        (&Op::Rope { q, k, .. }, Some(&Op::KvStore { layer, k: k2, v }))
                            if k2 == k =>
                        {
                            i += 1;
                            let freqs = geo.rope_freqs.map(vector).transpose()?;
                            let base = geo.rope_base_of(layer);
                            (
                                q,
                                layer,
                                k,
                                v,
                                AttnDims {
                                    rope_base: base,
                                    ..dims
                                },
                                freqs,
                            )
                        }
                        (&Op::KvStore { layer, k, v }, _) => {
                            let q = graph.ops[i..].iter().find_map(|o| match *o {
                                Op::Attention { layer: l, q, .. } if l == layer => Some(q),
                                _ => None,
                            });
                            let q = q.ok_or_else(|| unsupported(op))?;
                            (q, layer, k, v, AttnDims { n_rot: 0, ..dims }, None)
                        }
                        _ => return Err(unsupported(op)),
                    };
                    let rope = RopeOpts {
                        mode: geo.rope_mode,
                        freqs: freqs.as_ref(),
                    };
                    let (qb, kb, vb) = (acts.f32(q)?, acts.f32(k)?, acts.f32(v)?);
                    ropes.insert(layer, launches.len());
                    launches.push(Launch::RopeKv(RopeKv::with_rope(
                        g,
                        d,
                        rope,
                        &step,
                        &qb,
                        &kb,
                        &vb,
                        (&kv[layer], &index),
                    )?));
                }
                Op::Attention { layer, q, out } if geo.window_of(layer).is_some() => {
                    let (qb, ob) = (acts.f32(q)?, acts.f32(out)?);
                    let w = geo.window_of(layer).unwrap_or(n_ctx);
                    let cache = (&kv[layer], &index);
                    let a = WindowAttention::new(g, dims, w, &step, &qb, cache, &ob)?;
                    launches.push(Launch::WindowAttention(a));
                }
                Op::Attention { layer, q, out } => {
                    let (qb, ob) = (acts.f32(q)?, acts.f32(out)?);
                    // The layer's rope_kv launch, whose single-token work the split takes.
                    let rope = ropes.get(&layer).and_then(|&at| match &launches[at] {
                        Launch::RopeKv(r) => Some((at, r.fused_inputs().clone())),
                        _ => None,
                    });
                    let attn = Attention::new(
                        g,
                        dims,
                        &qb,
                        (&kv[layer], &index),
                        &ob,
                        AttnOpts {
                            round_p: true,
                            fast: fast.then_some(&step),
                            rope: rope.as_ref().map(|r| &r.1),
                        },
                    )?;
                    if let (Some((at, _)), true) = (rope, attn.fuses_rope()) {
                        if let Launch::RopeKv(r) = &mut launches[at] {
                            r.set_fused();
                        }
                    }
                    launches.push(Launch::Attention(attn));
                }
                Op::Glu { act, gate, up } => {
                    let act = kernel_glu(act);
                    let (gb, ub) = (acts.f32(gate)?, acts.f32(up)?);
                    launches.push(Launch::Glu(Glu::new(g, act, &gb, &ub, width(gate))?));
                }
                Op::AddBias { x, b } => {
                    let (xb, bb) = (acts.f32(x)?, vector(b)?);
                    launches.push(Launch::Row(RowOp::add_bias(g, &xb, &bb, width(x))?));
                }
                Op::Act {
                    act: UnaryAct::GeluTanh,
                    x,
                } => {
                    let xb = acts.f32(x)?;
                    launches.push(Launch::Row(RowOp::gelu(g, &xb, width(x))?));
                }
                Op::AddPosEmbed { table, x } => {
                    let xb = acts.f32(x)?;
                    let (tb, n_pos) = match (&weights[table.0], quant_weight(&weights, table)) {
                        (GpuWeight::F16Rows(t), _) if t.shards.len() == 1 => {
                            (PosTable::F16(&t.shards[0]), t.rows)
                        }
                        (_, Some((q, _))) if q.data.shards.len() == 1 && q.fmt.act().is_none() => {
                            (PosTable::F32(&q.data.shards[0]), q.rows)
                        }
                        _ => return Err(unsupported(op)),
                    };
                    max_pos = Some(n_pos);
                    launches.push(Launch::Row(RowOp::add_pos(
                        g,
                        &step,
                        &index.toks,
                        &xb,
                        tb,
                        width(x),
                        n_pos,
                    )?));
                }
                Op::Slice { x, start, out } => {
                    let (xb, ob) = (acts.f32(x)?, acts.f32(out)?);
                    launches.push(Launch::Row(RowOp::slice(
                        g,
                        &xb,
                        width(x),
                        start,
                        width(out),
                        &ob,
                    )?));
                }
                Op::HeadRmsNorm { x, w, out } => {
                    let (xb, wb, ob) = (acts.f32(x)?, vector(w)?, acts.f32(out)?);
                    let (n, hd) = (width(x), geo.head_dim);
                    let eps = graph.rms_eps;
                    let e = Elementwise::head_rms_norm(g, &xb, &wb, n, hd, eps, &ob)?;
                    launches.push(Launch::Elem(e));
                }
                Op::Scale { x, s } => {
                    let xb = acts.f32(x)?;
                    launches.push(Launch::Elem(Elementwise::scale(g, &xb, width(x), s)?));
                }
                Op::Add { x, y } => {
                    let (xb, yb) = (acts.f32(x)?, acts.f32(y)?);
                    launches.push(Launch::Elem(Elementwise::add(g, &xb, &yb, width(x))?));
                }
                Op::SoftCap { x, cap } => {
                    let xb = acts.f32(x)?;
                    launches.push(Launch::SoftCap(Elementwise::softcap(
                        g,
                        &xb,
                        width(x),
                        cap,
                    )?));
                }
                Op::SelectRows { x, out } => {
                    let src = acts.resolve(x);
                    acts.alias.insert(out, src);
                    acts.selected.push(out);
                }
            }
            i += 1;
        }
        let logits = acts.f32(graph.logits)?;
        let Acts {
            f32s,
            quant,
            qact_bufs,
            keep,
            ..
        } = acts;
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
            _acts: f32s.into_values().chain(keep).collect(),
            _quant: quant.into_values().collect(),
            _qacts: qact_bufs,
            _kv: kv,
            _weights: weights,
        })
    }

    /// Records every launch of a step of `n` tokens whose longest context is `n_kv` keys.
    /// With `profile`, a timestamp is written after each launch into query `i + 1`
    /// (query 0 before the first).
    pub(crate) fn record(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n: u32,
        n_kv: u32,
        rows: Rows,
        profile: Option<&wgpu::QuerySet>,
    ) {
        if let Some(qs) = profile {
            pass.write_timestamp(qs, 0);
        }
        for (i, l) in self.launches.iter().enumerate() {
            l.record(pass, n, n_kv, rows);
            if let Some(qs) = profile {
                pass.write_timestamp(qs, i as u32 + 1);
            }
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

    /// Dispatches of one step of `n` tokens.
    pub(crate) fn dispatches(&self, n: u32) -> usize {
        self.launches.iter().map(|l| l.dispatches(n)).sum()
    }
}
