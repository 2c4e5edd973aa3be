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
//!   (the LM head) multiplies the last row only, or every row, as the step asks.
//!
//! A graph op the GPU has no kernel for is an error naming the op, at load.

use std::collections::HashMap;

use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::ops::{
    Attention, AttnDims, Embed, F16Matvec, Glu, GpuKv, NormOut, QuantAct, RmsNorm, RopeKv,
    StepUniform, TernaryMatvec,
};
use super::pipelines::{Epilogue, GluAct as KernelGlu};
use super::upload::GpuWeight;
use crate::model::graph::{ActId, GluAct, Graph, Op, RopeMode, WeightId};
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
    Ternary(TernaryMatvec),
    RopeKv(RopeKv),
    Attention(Attention),
    Glu(Glu),
    /// The matvec over selected rows (the LM head), in its three row modes.
    Head {
        decode: F16Matvec,
        last: F16Matvec,
        all: F16Matvec,
    },
}

impl Launch {
    fn label(&self) -> &'static str {
        match self {
            Launch::Embed(_) => "embed",
            Launch::Norm(_) => "rmsnorm",
            Launch::Ternary(_) => "ternary",
            Launch::RopeKv(_) => "rope_kv",
            Launch::Attention(_) => "attention",
            Launch::Glu(_) => "glu",
            Launch::Head { .. } => "lm_head",
        }
    }

    fn record(&self, pass: &mut wgpu::ComputePass<'_>, n: u32, n_kv: u32, rows: Rows) {
        match self {
            Launch::Embed(e) => e.record(pass, n),
            Launch::Norm(o) => o.record(pass, n),
            Launch::Ternary(o) => o.record(pass, n, n > 1),
            Launch::RopeKv(o) => o.record(pass, n),
            Launch::Attention(o) => o.record(pass, n, n_kv),
            Launch::Glu(o) => o.record(pass, n),
            Launch::Head { decode, last, all } => match rows {
                Rows::Decode => decode.record(pass, n),
                Rows::Last => last.record(pass, n),
                Rows::All => all.record(pass, n),
            },
        }
    }

    fn dispatches(&self, n: u32) -> usize {
        match self {
            Launch::Embed(e) => e.dispatch_count(),
            Launch::Attention(_) => Attention::dispatches(n),
            Launch::Head { decode, .. } => decode.dispatch_count(),
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
    /// The logits activation (rows as [`Plan::logits_rows`] allows).
    pub logits: GpuBuffer,
    /// Logits rows the buffer holds.
    pub logits_rows: usize,
    _acts: Vec<GpuBuffer>,
    _quant: Vec<QuantAct>,
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
    /// Acts standing for the selected rows of another act (`SelectRows`).
    alias: HashMap<ActId, ActId>,
    /// Acts computed on selected rows.
    selected: Vec<ActId>,
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
        Op::Rope { q, k } => (vec![q, k], vec![q, k]),
        Op::KvStore { k, v, .. } => (vec![k, v], vec![]),
        Op::Attention { q, out, .. } => (vec![q], vec![out]),
        Op::Glu { gate, up, .. } => (vec![gate, up], vec![gate]),
        Op::AddBias { x, .. } | Op::Act { x, .. } | Op::AddPosEmbed { x, .. } => (vec![x], vec![x]),
        Op::Slice { x, out, .. } | Op::SelectRows { x, out } => (vec![x], vec![out]),
    }
}

fn unsupported(op: &Op) -> Error {
    Error::Gpu(format!(
        "the GPU backend has no kernel for {op:?} in this build (use --backend cpu)"
    ))
}

impl Plan {
    /// Compiles `graph` over the uploaded `weights`.
    pub(crate) fn compile(
        ctx: &GpuContext,
        graph: &Graph,
        weights: Vec<GpuWeight>,
        max_batch: usize,
        n_ctx: usize,
        n_vocab: usize,
    ) -> Result<Plan> {
        let g = ctx;
        let geo = &graph.attn;
        if geo.rope_mode != RopeMode::Neox || geo.rope_freqs.is_some() {
            return Err(Error::Gpu(format!(
                "the GPU backend rotates NEOX pairs without frequency factors only in this \
                 build (model: {:?}, rope_freqs: {})",
                geo.rope_mode,
                geo.rope_freqs.is_some()
            )));
        }
        let dims = AttnDims {
            n_head: geo.n_head,
            n_head_kv: geo.n_head_kv,
            head_dim: geo.head_dim,
            n_rot: geo.n_rot,
            rope_base: geo.rope_base,
        };
        let row_bytes = (n_vocab * 4) as u64;
        let logits_rows = (max_batch as u64)
            .min(g.caps().max_binding / row_bytes)
            .max(1) as usize;
        let step = StepUniform::new(g)?;
        let ids = GpuBuffer::zeroed(g, "ids", (max_batch * 4) as u64)?;
        let kv = (0..graph.n_layer)
            .map(|_| GpuKv::new(g, n_ctx, dims.kv_dim()))
            .collect::<Result<Vec<_>>>()?;
        let mut acts = Acts {
            graph,
            ctx: g,
            max_batch,
            logits_rows,
            f32s: HashMap::new(),
            quant: HashMap::new(),
            alias: HashMap::new(),
            selected: Vec::new(),
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
        let mut launches = Vec::new();
        let mut i = 0;
        while i < graph.ops.len() {
            let op = &graph.ops[i];
            match *op {
                Op::Embed { table, out } => {
                    let GpuWeight::F16Rows(t) = &weights[table.0] else {
                        return Err(unsupported(op));
                    };
                    let out = acts.f32(out)?;
                    launches.push(Launch::Embed(Embed::new(g, variant, t, &ids, &out)?));
                }
                Op::RmsNorm { x, w, out } => {
                    let width = graph.acts[x.0].width;
                    let (xb, wb) = (acts.f32(x)?, vector(w)?);
                    let eps = graph.rms_eps;
                    if acts.is_selected(x) {
                        acts.selected.push(out);
                    }
                    let norm = if only_ternary_readers(graph, &weights, i, out) {
                        let q = acts.quant(out)?;
                        RmsNorm::new(g, norm_variant, &xb, &wb, width, eps, NormOut::Quant(&q))?
                    } else {
                        let ob = acts.f32(out)?;
                        RmsNorm::new(g, norm_variant, &xb, &wb, width, eps, NormOut::F32(&ob))?
                    };
                    launches.push(Launch::Norm(norm));
                }
                Op::Linear { w, x, out, add } => {
                    let epilogue = if add { Epilogue::Add } else { Epilogue::Store };
                    let ob = acts.f32(out)?;
                    match &weights[w.0] {
                        GpuWeight::Ternary(tw) => {
                            let Some(q) = acts.quant.get(&acts.resolve(x)).cloned() else {
                                return Err(Error::Gpu(format!(
                                    "GPU plan: the input of ternary '{}' is not an RMSNorm \
                                     output",
                                    graph.weights[w.0].name
                                )));
                            };
                            launches.push(Launch::Ternary(TernaryMatvec::new(
                                g,
                                variant,
                                TPR,
                                tw,
                                &q,
                                &ob,
                                epilogue,
                                Some(&step),
                            )?));
                        }
                        GpuWeight::F16Rows(m) if acts.is_selected(x) && !add => {
                            let xb = acts.f32(x)?;
                            launches.push(Launch::Head {
                                decode: F16Matvec::new(g, variant, TPR, m, &xb, &ob, true)?,
                                last: F16Matvec::last_row(
                                    g, variant, TPR, m, &xb, &ob, false, &step,
                                )?,
                                all: F16Matvec::new(g, variant, TPR, m, &xb, &ob, false)?,
                            });
                        }
                        _ => return Err(unsupported(op)),
                    }
                }
                Op::Rope { q, k } => {
                    let Some(&Op::KvStore { layer, k: k2, v }) = graph.ops.get(i + 1) else {
                        return Err(unsupported(op));
                    };
                    if k2 != k {
                        return Err(unsupported(op));
                    }
                    let (qb, kb, vb) = (acts.f32(q)?, acts.f32(k)?, acts.f32(v)?);
                    launches.push(Launch::RopeKv(RopeKv::new(
                        g, dims, &step, &qb, &kb, &vb, &kv[layer],
                    )?));
                    i += 1;
                }
                Op::Attention { layer, q, out } => {
                    let (qb, ob) = (acts.f32(q)?, acts.f32(out)?);
                    launches.push(Launch::Attention(Attention::new(
                        g, dims, &step, &qb, &kv[layer], &ob, true,
                    )?));
                }
                Op::Glu { act, gate, up } => {
                    let act = match act {
                        GluAct::Relu2 => KernelGlu::ReluSqr,
                        GluAct::Silu => KernelGlu::Silu,
                    };
                    let width = graph.acts[gate.0].width;
                    let (gb, ub) = (acts.f32(gate)?, acts.f32(up)?);
                    launches.push(Launch::Glu(Glu::new(g, act, &gb, &ub, width)?));
                }
                Op::SelectRows { x, out } => {
                    let src = acts.resolve(x);
                    acts.alias.insert(out, src);
                    acts.selected.push(out);
                }
                _ => return Err(unsupported(op)),
            }
            i += 1;
        }
        let logits = acts.f32(graph.logits)?;
        let Acts { f32s, quant, .. } = acts;
        Ok(Plan {
            launches,
            ids,
            step,
            logits,
            logits_rows,
            _acts: f32s.into_values().collect(),
            _quant: quant.into_values().collect(),
            _kv: kv,
            _weights: weights,
        })
    }

    /// Records every launch of a step of `n` tokens ending at position `n_kv − 1`.
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
