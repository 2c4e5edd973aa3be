//! The compiler's state, the op dispatch, and the builders of the row-wise ops (norms,
//! biases, activations, slices, element-wise ops, the row selection).

use super::acts::{writes, Acts};
use super::launch::Launch;
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::model::graph::{ActId, Graph, Op, UnaryAct, WeightId};
use crate::ops::{
    AttnDims, Elementwise, Embed, GpuKv, KvIndex, NormOut, PosTable, QEmbed, QWeights, RmsNorm,
    RopeTable, RowOp, StepUniform,
};
use crate::pipelines::Variant;
use crate::upload::GpuWeight;
use crate::{Error, Result};

/// The per-step buffers of a plan that launches bind.
pub(super) struct Steps {
    /// `{ n_tokens, pos }` of the step.
    pub(super) step: StepUniform,
    /// `{ picked rows, 0 }` of the step.
    pub(super) pick_step: StepUniform,
    /// Token ids of the step.
    pub(super) ids: GpuBuffer,
    /// Rows whose logits a picked-rows step computes.
    pub(super) picks: GpuBuffer,
    /// Positions and sequence slots of the step's tokens, and the page tables.
    pub(super) index: KvIndex,
}

/// A plan being compiled: the launches so far and what the builders bind.
pub(super) struct Compiler<'g> {
    pub(super) g: &'g GpuContext,
    pub(super) graph: &'g Graph,
    pub(super) weights: &'g [GpuWeight],
    pub(super) acts: Acts<'g>,
    pub(super) launches: Vec<Launch>,
    pub(super) steps: &'g Steps,
    /// The KV cache of each layer.
    pub(super) kv: &'g [GpuKv],
    /// Kernel variant of the matvecs (`TPR` lanes per row).
    pub(super) variant: Variant,
    /// Kernel variant of the norms.
    pub(super) norm_variant: Variant,
    /// Whether the plan takes the fast numerics.
    pub(super) fast: bool,
    pub(super) dims: AttnDims,
    /// Positions a learned position table covers, once an op binds one.
    pub(super) max_pos: Option<usize>,
    /// The RoPE angle tables filled so far (one per distinct base; layers share them).
    pub(super) rope_tables: Vec<RopeTable>,
}

/// Weight `w` uploaded as a GGUF-format matrix, with its output scale.
pub(super) fn quant_weight(weights: &[GpuWeight], w: WeightId) -> Option<(&QWeights, f32)> {
    match &weights[w.0] {
        GpuWeight::Quant { w: Some(q), scale } => Some((q, *scale)),
        _ => None,
    }
}

/// The error of an op (or an op over weights) the GPU has no kernel for.
pub(super) fn unsupported(op: &Op) -> Error {
    Error::UnsupportedFeature {
        what: format!("{op:?}"),
        needs: "the CPU backend (--backend cpu): the GPU has no kernel for it".into(),
    }
}

impl Compiler<'_> {
    /// Appends the launches of `op`.
    pub(super) fn op(&mut self, op: &Op) -> Result<()> {
        for w in writes(op) {
            self.acts.written(w);
        }
        match *op {
            Op::Embed { table, out } => self.embed(op, table, out),
            Op::RmsNorm { x, w, out } => self.rms_norm(x, w, out),
            Op::Linear { w, x, out, add } => self.linear(op, w, x, out, add),
            Op::NormLinear {
                x,
                norm,
                w,
                out,
                add,
            } => self.norm_linear(op, (x, norm), w, out, add),
            Op::NormQkv { x, norm, w, out } => self.norm_qkv(op, (x, norm), w, out),
            Op::NormGlu {
                x,
                norm,
                act,
                w,
                gate,
                up,
            } => self.norm_glu(op, (x, norm), act, w, (gate, up)),
            Op::SelfAttention {
                layer,
                rope,
                q,
                k,
                v,
                out,
            } => self.self_attention((layer, rope), [q, k, v], out),
            Op::Glu { act, gate, up } => self.glu(act, gate, up),
            Op::LayerNorm { x, w, b, eps, out } => {
                if self.acts.is_selected(x) {
                    self.acts.selected.push(out);
                }
                let (xb, wb, bb) = (self.acts.f32(x)?, self.vector(w)?, self.vector(b)?);
                let ob = self.acts.f32(out)?;
                let ln = RowOp::layer_norm(self.g, &xb, &wb, &bb, self.width(x), eps, &ob)?;
                self.push(Launch::Row(ln))
            }
            Op::AddBias { x, b } => {
                let (xb, bb) = (self.acts.f32(x)?, self.vector(b)?);
                let row = RowOp::add_bias(self.g, &xb, &bb, self.width(x))?;
                self.push(Launch::Row(row))
            }
            Op::Act {
                act: UnaryAct::GeluTanh,
                x,
            } => {
                let xb = self.acts.f32(x)?;
                let row = RowOp::gelu(self.g, &xb, self.width(x))?;
                self.push(Launch::Row(row))
            }
            Op::AddPosEmbed { table, x } => self.add_pos(op, table, x),
            Op::Slice { x, start, out } => {
                let (xb, ob) = (self.acts.f32(x)?, self.acts.f32(out)?);
                let (wx, wo) = (self.width(x), self.width(out));
                let row = RowOp::slice(self.g, &xb, wx, start, wo, &ob)?;
                self.push(Launch::Row(row))
            }
            Op::HeadRmsNorm { x, w, out } => {
                let (xb, wb, ob) = (self.acts.f32(x)?, self.vector(w)?, self.acts.f32(out)?);
                let (n, hd, eps) = (self.width(x), self.dims.head_dim, self.graph.rms_eps);
                let e = Elementwise::head_rms_norm(self.g, &xb, &wb, n, hd, eps, &ob)?;
                self.push(Launch::Elem(e))
            }
            Op::Scale { x, s } => {
                let xb = self.acts.f32(x)?;
                let e = Elementwise::scale(self.g, &xb, self.width(x), s)?;
                self.push(Launch::Elem(e))
            }
            Op::Add { x, y } => {
                let (xb, yb) = (self.acts.f32(x)?, self.acts.f32(y)?);
                let e = Elementwise::add(self.g, &xb, &yb, self.width(x))?;
                self.push(Launch::Elem(e))
            }
            Op::SoftCap { x, cap } => {
                let xb = self.acts.f32(x)?;
                let e = Elementwise::softcap(self.g, &xb, self.width(x), cap)?;
                self.push(Launch::SoftCap(e))
            }
            Op::SelectRows { x, out } => {
                let src = self.acts.resolve(x);
                self.acts.alias.insert(out, src);
                self.acts.selected.push(out);
                Ok(())
            }
        }
    }

    pub(super) fn push(&mut self, launch: Launch) -> Result<()> {
        self.launches.push(launch);
        Ok(())
    }

    /// The width of activation `a`.
    pub(super) fn width(&self, a: ActId) -> usize {
        self.graph.acts[a.0].width
    }

    /// The uploaded buffer of vector weight `w`.
    pub(super) fn vector(&self, w: WeightId) -> Result<GpuBuffer> {
        match &self.weights[w.0] {
            GpuWeight::Vector(Some(b)) => Ok(b.clone()),
            _ => Err(Error::KernelArgs(format!(
                "weight '{}' is not an uploaded vector",
                self.graph.weights[w.0].name
            ))),
        }
    }

    fn embed(&mut self, op: &Op, table: WeightId, out: ActId) -> Result<()> {
        let out = self.acts.f32(out)?;
        let (weights, steps) = (self.weights, self.steps);
        let ids = &steps.ids;
        let launch = match (&weights[table.0], quant_weight(weights, table)) {
            (GpuWeight::F16Rows(t), _) => {
                Launch::Embed(Embed::new(self.g, self.variant, t, ids, &out)?)
            }
            (_, Some((q, _))) => Launch::QEmbed(QEmbed::new(self.g, q, ids, &out)?),
            _ => return Err(unsupported(op)),
        };
        self.push(launch)
    }

    /// `out = rmsnorm(x) · w` in f32.
    pub(super) fn rms_norm(&mut self, x: ActId, w: WeightId, out: ActId) -> Result<()> {
        if self.acts.is_selected(x) {
            self.acts.selected.push(out);
        }
        let (xb, wb, ob) = (self.acts.f32(x)?, self.vector(w)?, self.acts.f32(out)?);
        let (n, eps) = (self.width(x), self.graph.rms_eps);
        let v = self.norm_variant;
        let norm = RmsNorm::new(self.g, v, &xb, &wb, n, eps, NormOut::F32(&ob))?;
        self.push(Launch::Norm(norm))
    }

    fn add_pos(&mut self, op: &Op, table: WeightId, x: ActId) -> Result<()> {
        let xb = self.acts.f32(x)?;
        let weights = self.weights;
        let (tb, n_pos) = match (&weights[table.0], quant_weight(weights, table)) {
            (GpuWeight::F16Rows(t), _) if t.shards.len() == 1 => {
                (PosTable::F16(&t.shards[0]), t.rows)
            }
            (_, Some((q, _))) if q.data.shards.len() == 1 && q.fmt.act().is_none() => {
                (PosTable::F32(&q.data.shards[0]), q.rows)
            }
            _ => return Err(unsupported(op)),
        };
        self.max_pos = Some(n_pos);
        let s = self.steps;
        let row = RowOp::add_pos(
            self.g,
            &s.step,
            &s.index.toks,
            &xb,
            tb,
            self.width(x),
            n_pos,
        )?;
        self.push(Launch::Row(row))
    }
}
