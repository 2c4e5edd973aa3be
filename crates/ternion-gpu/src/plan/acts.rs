//! The buffers of a plan's activations while it is compiled.

use std::collections::HashMap;

use super::launch::Launch;
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::context::PrefillKernel;
use crate::model::graph::{ActId, Graph, Op};
use crate::ops::{prompt_kind, ActQuant, GluTail, MatmulKind, QAct, QuantAct, QuantizeAct, SplitK};
use crate::Result;

/// Where the activations live while compiling.
pub(super) struct Acts<'g> {
    pub(super) graph: &'g Graph,
    pub(super) ctx: &'g GpuContext,
    pub(super) max_batch: usize,
    pub(super) logits_rows: usize,
    pub(super) f32s: HashMap<ActId, GpuBuffer>,
    /// Int8 activations of acts (I2_S matvec inputs), one buffer per act.
    pub(super) quant: HashMap<ActId, QuantAct>,
    /// Q8_0 / Q8_K copies of acts, valid until the act is written again.
    pub(super) qacts: HashMap<(ActId, ActQuant), QAct>,
    /// Every Q8 buffer made (kept alive with the plan).
    pub(super) qact_bufs: Vec<QAct>,
    /// Other buffers the launches bind (picked-row copies).
    pub(super) keep: Vec<GpuBuffer>,
    /// Acts standing for the selected rows of another act (`SelectRows`).
    pub(super) alias: HashMap<ActId, ActId>,
    /// Acts computed on selected rows.
    pub(super) selected: Vec<ActId>,
    /// The scratch of the split coop tiles ([`SplitK`]) by output rows, shared by every
    /// linear of that many rows (they run one after another).
    split: HashMap<usize, GpuBuffer>,
    /// The scratch of the coop gate/up launches' split last wave ([`GluTail`]), shared by
    /// all of them.
    glu_tail: Option<GluTail>,
}

impl<'g> Acts<'g> {
    /// No buffers yet: each is made the first time an op binds it.
    pub(super) fn new(
        graph: &'g Graph,
        ctx: &'g GpuContext,
        max_batch: usize,
        logits_rows: usize,
    ) -> Acts<'g> {
        Acts {
            graph,
            ctx,
            max_batch,
            logits_rows,
            f32s: HashMap::new(),
            quant: HashMap::new(),
            qacts: HashMap::new(),
            qact_bufs: Vec::new(),
            keep: Vec::new(),
            alias: HashMap::new(),
            selected: Vec::new(),
            split: HashMap::new(),
            glu_tail: None,
        }
    }

    /// The act whose buffer `a` uses (the source of a `SelectRows`, or `a`).
    pub(super) fn resolve(&self, a: ActId) -> ActId {
        self.alias.get(&a).copied().unwrap_or(a)
    }

    /// The scratch an I2_S linear of `rows × k` splits its coop tiles' K in, where the
    /// adapter runs coop tiles and the split can run for it (see [`SplitK`]).
    pub(super) fn split_scratch(&mut self, rows: usize, k: usize) -> Result<Option<GpuBuffer>> {
        if prompt_kind(self.ctx.caps().prefill, k) != Some(MatmulKind::Coop) {
            return Ok(None);
        }
        let sms = self.ctx.caps().sms;
        let Some(bytes) = SplitK::scratch_bytes(rows, k, self.max_batch, sms) else {
            return Ok(None);
        };
        // The size depends on the rows and the step size only (SplitK::scratch_bytes).
        if let Some(b) = self.split.get(&rows) {
            return Ok(Some(b.clone()));
        }
        let b = GpuBuffer::zeroed(self.ctx, "split_k", bytes)?;
        self.split.insert(rows, b.clone());
        Ok(Some(b))
    }

    /// The scratch of the coop gate/up launches' split last wave: for the adapter's SMs
    /// where it runs coop tiles, placeholders elsewhere.
    pub(super) fn glu_tail(&mut self) -> Result<GluTail> {
        if let Some(t) = &self.glu_tail {
            return Ok(t.clone());
        }
        let caps = self.ctx.caps();
        let sms = caps.sms.filter(|_| caps.prefill == PrefillKernel::Coop);
        let t = GluTail::new(self.ctx, sms)?;
        self.glu_tail = Some(t.clone());
        Ok(t)
    }

    /// The f32 buffer of `a` (`max_batch` rows; the logits: `logits_rows`).
    pub(super) fn f32(&mut self, a: ActId) -> Result<GpuBuffer> {
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

    /// The int8 activations of `a` (the input of I2_S matvecs).
    pub(super) fn quant(&mut self, a: ActId) -> Result<QuantAct> {
        let a = self.resolve(a);
        if let Some(q) = self.quant.get(&a) {
            return Ok(q.clone());
        }
        let q = QuantAct::new(self.ctx, self.graph.acts[a.0].width, self.max_batch)?;
        self.quant.insert(a, q.clone());
        Ok(q)
    }

    /// Whether `a` holds selected rows only (computed after a `SelectRows`).
    pub(super) fn is_selected(&self, a: ActId) -> bool {
        self.selected.contains(&a)
    }

    /// Forgets the quantized copies of an act that an op is about to overwrite.
    pub(super) fn written(&mut self, a: ActId) {
        let a = self.resolve(a);
        self.qacts.retain(|(b, _), _| *b != a);
    }

    /// The `kind` quantization of act `x` (`rows` rows), emitting the quantize launch the
    /// first time after `x` was written.
    pub(super) fn qact(
        &mut self,
        x: ActId,
        kind: ActQuant,
        launches: &mut Vec<Launch>,
    ) -> Result<QAct> {
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

/// Activations `op` writes (the scratch of a fused op's input norm included).
pub(super) fn writes(op: &Op) -> Vec<ActId> {
    match *op {
        Op::Embed { out, .. }
        | Op::RmsNorm { out, .. }
        | Op::LayerNorm { out, .. }
        | Op::Linear { out, .. }
        | Op::SelfAttention { out, .. }
        | Op::Slice { out, .. }
        | Op::SelectRows { out, .. }
        | Op::HeadRmsNorm { out, .. } => vec![out],
        Op::NormLinear { norm, out, .. } => vec![norm.scratch, out],
        Op::NormQkv { norm, out, .. } => vec![norm.scratch, out[0], out[1], out[2]],
        Op::NormGlu { norm, gate, up, .. } => vec![norm.scratch, gate, up],
        Op::Glu { gate: x, .. }
        | Op::AddBias { x, .. }
        | Op::Act { x, .. }
        | Op::AddPosEmbed { x, .. }
        | Op::Scale { x, .. }
        | Op::SoftCap { x, .. }
        | Op::Add { x, .. } => vec![x],
    }
}
