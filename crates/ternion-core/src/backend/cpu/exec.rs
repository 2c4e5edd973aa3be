//! The CPU runs a model's [`Graph`] op by op with the kernels of this module: this file
//! binds the weights and admits the steps, `pass.rs` runs each op (a fused op as the
//! primitive ops it stands for).
//!
//! A forward pass takes the new tokens of one or several sequences ([`SeqStep`]s) and runs
//! them as one stack of rows: every row-wise op (norms, every [`Op::Linear`], activations)
//! sees all rows at once, so each weight is read once per pass; RoPE, position embeddings,
//! the KV-cache write and attention use each row's own sequence and position. A row's
//! numerics do not depend on the other rows of the pass: a sequence gives bit-identical
//! results alone or batched.

use std::sync::{Arc, Mutex, OnceLock};

use super::acts::Acts;
use super::op_profile;
use super::pass::Pass;
use super::{Linear, QuantInput, QueryRow, RopeAngles};
use crate::generate::{check_step, StepLimits};
use crate::gguf::GgufFile;
use crate::kv::{KvGeometry, KvPool, KvSeq, KvType, PAGE_POSITIONS};
use crate::model::graph::{Graph, Op, WeightKind};
use crate::model::{LmHead, LoadOptions, Logits};
use crate::quant;
use crate::{Error, Result};

/// A weight prepared for the CPU.
enum CpuWeight {
    /// A matrix left in its file format (boxed: a `Linear` is far larger than a vector).
    Matrix(Box<Linear>),
    /// A small vector, converted to f32 once.
    Vector(Vec<f32>),
}

/// A model's weights bound for the CPU.
pub struct CpuModel {
    weights: Vec<CpuWeight>,
    /// The opt-in LM head format, the head's weight and its requantized bytes, when asked
    /// for (checked at load).
    head_quant: Option<(quant::GgmlType, usize, u64)>,
    /// That head requantized at its first CPU product (GPU sessions never pay for it; the
    /// token table itself stays as stored), or why it could not be.
    lm_head: OnceLock<std::result::Result<Linear, String>>,
    /// Otherwise the stored LM head copied onto huge pages ([`Linear::resident`]) at its
    /// first CPU product (GPU sessions never pay for it), where it is streamed as stored;
    /// with the head's weight index, so that embedding lookups of a tied head read the
    /// copy too.
    resident_head: OnceLock<Option<(usize, Linear)>>,
    /// What the last private sequence given back left: its KV pool (with the pages it
    /// allocated, free again) and its workspace, for the next private sequence.
    spare: Mutex<Option<(Arc<KvPool>, Workspace)>>,
}

/// One sequence's part of a forward pass: its cache (page table) and its new tokens.
pub struct SeqStep<'a> {
    /// The sequence's KV cache; the step's positions follow the filled ones.
    pub kv: &'a mut KvSeq,
    /// New tokens: a chunk of a prompt, or the one token sampled last.
    pub tokens: &'a [u32],
    /// Which logits rows the step wants.
    pub logits: Logits,
}

/// The reusable buffers of forward passes: activations of the stacked rows, quantized
/// inputs, attention scratch and per-row bookkeeping. Sized on first use, then reused, so
/// steps of the same shape do not allocate.
#[derive(Default)]
pub struct Workspace {
    acts: Acts,
    qi: QuantInput,
    qi_of: Option<(usize, u64)>,
    tmp: Vec<f32>,
    attn_scratch: Vec<f32>,
    /// The RoPE angles of the last pass's rows.
    rope_angles: RopeAngles,
    /// Token ids of every row, steps one after the other.
    tokens: Vec<u32>,
    /// Sequence, position and decode flag of every row.
    rows: Vec<QueryRow>,
    /// Non-causal attention: `rows` with every position set to its step's last.
    att_rows: Vec<QueryRow>,
    /// Per step: first row and row count.
    spans: Vec<(usize, usize)>,
    /// The row each logits row comes from.
    sel_src: Vec<usize>,
    /// Per step: first logits row and logits row count.
    sel_spans: Vec<(usize, usize)>,
}

impl Workspace {
    /// The logits rows of step `i` of the last forward pass (empty if there is no such step).
    pub fn logits(&self, graph: &Graph, i: usize) -> &[f32] {
        let w = graph.acts[graph.logits.0].width;
        match (self.sel_spans.get(i), self.acts.bufs.get(graph.logits.0)) {
            (Some(&(start, n)), Some(buf)) => &buf[start * w..(start + n) * w],
            _ => &[],
        }
    }

    /// Every logits row of the last forward pass, steps one after the other.
    pub fn all_logits(&self, graph: &Graph) -> &[f32] {
        let l = graph.logits.0;
        match self.acts.rows.get(l) {
            Some(&rows) => &self.acts.bufs[l][..rows * graph.acts[l].width],
            None => &[],
        }
    }
}

/// The state of a single CPU sequence: its KV cache and its own workspace.
pub struct CpuState {
    kv: KvSeq,
    ws: Workspace,
}

impl CpuState {
    /// The logits rows written by the last forward pass of `graph`.
    pub fn logits(&self, graph: &Graph) -> &[f32] {
        self.ws.all_logits(graph)
    }

    /// The KV cache.
    pub fn kv(&self) -> &KvSeq {
        &self.kv
    }

    /// Forgets every position after the first `len` (freeing the pages past it).
    pub fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
    }
}

fn load_vector(file: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
    let info = file
        .tensor(name)
        .ok_or_else(|| Error::Model(format!("tensor '{name}' is missing")))?;
    if info.n_elements() != n as u64 {
        return Err(Error::Model(format!(
            "tensor '{name}': expected {n} elements, found shape {:?}",
            info.shape
        )));
    }
    let mut v = vec![0f32; n];
    quant::dequantize_row(info.ty, name, file.tensor_data(info), n, 0, &mut v)?;
    Ok(v)
}

impl CpuModel {
    /// Binds every weight of `graph` to the tensors of `file`, checking names and shapes.
    pub fn prepare(graph: &Graph, file: &Arc<GgufFile>, opts: &LoadOptions) -> Result<CpuModel> {
        let mut weights = Vec::with_capacity(graph.weights.len());
        for w in &graph.weights {
            weights.push(match &w.kind {
                WeightKind::Vector { n } => CpuWeight::Vector(load_vector(file, &w.name, *n)?),
                WeightKind::Matrix { k, m, scale } => {
                    let mut l = Linear::load(file, &w.name)?;
                    if l.in_features() != *k || l.out_features() != *m {
                        return Err(Error::Model(format!(
                            "tensor '{}': expected shape [{k}, {m}], found [{}, {}]",
                            w.name,
                            l.in_features(),
                            l.out_features()
                        )));
                    }
                    if let Some(s) = scale {
                        l = l.with_post_scale(load_vector(file, s, 1)?[0]);
                    }
                    CpuWeight::Matrix(Box::new(l))
                }
            });
        }
        let mut model = CpuModel {
            weights,
            head_quant: None,
            lm_head: OnceLock::new(),
            resident_head: OnceLock::new(),
            spare: Mutex::new(None),
        };
        let head_ty = match opts.lm_head {
            LmHead::AsStored => None,
            LmHead::Q8_0 => Some(quant::GgmlType::Q8_0),
            LmHead::Q6K => Some(quant::GgmlType::Q6_K),
        };
        if let Some(ty) = head_ty {
            let head = graph.ops.iter().find_map(|op| match op {
                Op::Linear { w, out, .. } if *out == graph.logits => Some(*w),
                _ => None,
            });
            if let Some(w) = head {
                let bytes = model.matrix(w.0)?.requantizable(ty)?;
                model.head_quant = Some((ty, w.0, bytes));
            }
        }
        Ok(model)
    }

    pub(super) fn matrix(&self, i: usize) -> Result<&Linear> {
        match &self.weights[i] {
            CpuWeight::Matrix(l) => Ok(l),
            CpuWeight::Vector(_) => Err(Error::Model("graph uses a vector as a matrix".into())),
        }
    }

    /// The matrix of the LM head product (weight `i`): the requantized head, else the
    /// resident copy of the stored one, else the stored one.
    pub(super) fn head(&self, i: usize) -> Result<&Linear> {
        if let Some((ty, w, _)) = self.head_quant {
            let head = self.lm_head.get_or_init(|| {
                self.matrix(w)
                    .and_then(|m| m.requantized(ty))
                    .map_err(|e| e.to_string())
            });
            return head.as_ref().map_err(|e| Error::Model(e.clone()));
        }
        let stored = self.matrix(i)?;
        self.resident_head
            .get_or_init(|| Some((i, stored.resident()?)));
        Ok(self.resident_copy(i).unwrap_or(stored))
    }

    /// The matrix of an embedding lookup (weight `i`): the LM head's resident copy where
    /// the head is that weight (tied embeddings) and has been copied, else the stored one.
    pub(super) fn embedding(&self, i: usize) -> Result<&Linear> {
        self.resident_copy(i).map_or_else(|| self.matrix(i), Ok)
    }

    /// The LM head's resident copy, if it has been made and is of weight `i`.
    fn resident_copy(&self, i: usize) -> Option<&Linear> {
        match self.resident_head.get() {
            Some(Some((w, copy))) if *w == i => Some(copy),
            _ => None,
        }
    }

    pub(super) fn vector(&self, i: usize) -> Result<&[f32]> {
        match &self.weights[i] {
            CpuWeight::Vector(v) => Ok(v),
            CpuWeight::Matrix(_) => Err(Error::Model("graph uses a matrix as a vector".into())),
        }
    }

    /// Bytes of weights read to decode one token: every matrix product once.
    pub fn weight_bytes_per_token(&self, graph: &Graph) -> u64 {
        graph
            .ops
            .iter()
            .map(|op| self.op_weight_bytes(graph, op))
            .sum()
    }

    /// Bytes of weights `op` reads in a decode step: each of its matrix products once (the
    /// LM head as the requantized copy when there is one).
    pub fn op_weight_bytes(&self, graph: &Graph, op: &Op) -> u64 {
        op.products()
            .into_iter()
            .map(|(w, out)| match (self.head_quant, out == graph.logits) {
                (Some((_, _, bytes)), true) => bytes,
                _ => self.matrix(w.0).map_or(0, Linear::weight_bytes),
            })
            .sum()
    }

    /// The shape of this model's KV pages, holding values of type `ty`.
    pub fn kv_geometry(graph: &Graph, ty: KvType) -> KvGeometry {
        KvGeometry {
            n_layer: graph.n_layer,
            n_head_kv: graph.attn.n_head_kv,
            head_dim: graph.attn.head_dim,
            page_size: PAGE_POSITIONS,
            ty,
        }
    }

    /// A fresh sequence state with room for `n_ctx` positions, drawing pages from `pool`.
    pub fn new_state_in(&self, pool: Arc<KvPool>, n_ctx: usize) -> CpuState {
        CpuState {
            kv: KvSeq::new(pool, n_ctx),
            ws: Workspace::default(),
        }
    }

    /// A fresh sequence state with room for `n_ctx` positions in a KV pool of its own. The
    /// pool and workspace of the last state given back to [`CpuModel::give_back`] are
    /// reused when the pool has this shape and capacity (the workspace whatever the pool):
    /// their memory is already mapped, where fresh buffers are first touched during the
    /// first prompt (~6,500 pages for 128 tokens of 2B-4T, ~20 ms on a 2-core VM).
    pub fn new_private_state(&self, geo: KvGeometry, n_ctx: usize) -> CpuState {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).take();
        let fits = |p: &KvPool| p.geometry() == geo && p.capacity() == geo.pages_for(n_ctx);
        let (pool, ws) = match spare {
            Some((pool, ws)) if fits(&pool) => (pool, ws),
            Some((_, ws)) => (KvPool::for_sequences(geo, n_ctx, 1), ws),
            None => (KvPool::for_sequences(geo, n_ctx, 1), Workspace::default()),
        };
        CpuState {
            kv: KvSeq::new(pool, n_ctx),
            ws,
        }
    }

    /// Takes the workspace of a state that is done (and its KV pool, emptied, where no
    /// other sequence draws from it) for the next [`CpuModel::new_private_state`]; the
    /// state keeps an empty cache and workspace.
    pub fn give_back(&self, state: &mut CpuState) {
        state.kv.truncate(0);
        let pool = state.kv.pool();
        let ws = std::mem::take(&mut state.ws);
        if Arc::strong_count(pool) == 1 {
            *self.spare.lock().unwrap_or_else(|p| p.into_inner()) = Some((Arc::clone(pool), ws));
        }
    }

    /// Runs `tokens` (at the positions after those already cached) as one batch, appends
    /// their keys and values to the cache, and returns the requested logits rows.
    ///
    /// A single token runs with the reference engine's decode numerics (probabilities and
    /// F16-weight inputs rounded to F16); a batch keeps them in f32.
    pub fn forward<'s>(
        &self,
        graph: &Graph,
        tokens: &[u32],
        which: Logits,
        st: &'s mut CpuState,
    ) -> Result<&'s [f32]> {
        let mut steps = [SeqStep {
            kv: &mut st.kv,
            tokens,
            logits: which,
        }];
        self.forward_batch(graph, &mut steps, &mut st.ws)?;
        Ok(st.ws.all_logits(graph))
    }

    /// Checks every step and reserves its KV pages, all or none: on an error no cache
    /// changes. Returns the largest context of the steps.
    fn admit(&self, graph: &Graph, steps: &mut [SeqStep<'_>]) -> Result<usize> {
        if steps.is_empty() {
            return Err(Error::Request("no sequences to evaluate".into()));
        }
        let mut vocab = None;
        let mut positions = None;
        for op in &graph.ops {
            match *op {
                Op::Embed { table, .. } => vocab = Some(self.matrix(table.0)?.out_features()),
                Op::AddPosEmbed { table, .. } => {
                    positions = Some(self.matrix(table.0)?.out_features())
                }
                _ => {}
            }
        }
        let mut capacity = 0;
        for s in steps.iter() {
            let limits = StepLimits {
                n_vocab: vocab,
                n_ctx: s.kv.n_ctx(),
                max_pos: positions,
            };
            check_step(s.kv.len(), s.tokens, &limits)?;
            capacity = capacity.max(s.kv.n_ctx());
        }
        for i in 0..steps.len() {
            let n = steps[i].tokens.len();
            if let Err(e) = steps[i].kv.reserve(n) {
                for s in steps[..i].iter_mut() {
                    let len = s.kv.len();
                    s.kv.truncate(len);
                }
                return Err(e);
            }
        }
        Ok(capacity)
    }

    /// Runs the new tokens of several sequences as one pass: every weight is read once for
    /// all rows; each row uses its own sequence's cache and positions. Appends every step's
    /// keys and values to its cache; the logits rows of step `i` are then
    /// [`Workspace::logits`]`(graph, i)`. A step of one token runs with decode numerics
    /// (see [`CpuModel::forward`]), a longer one with prefill numerics, whatever the other
    /// steps are, so results equal running each sequence alone.
    ///
    /// Checks every step (tokens present and in the vocabulary, room in its context, pages
    /// in the pool) before changing anything: an invalid step fails the whole call.
    pub fn forward_batch(
        &self,
        graph: &Graph,
        steps: &mut [SeqStep<'_>],
        ws: &mut Workspace,
    ) -> Result<()> {
        let capacity = self.admit(graph, steps)?;
        let Workspace {
            acts,
            qi,
            qi_of,
            tmp,
            attn_scratch,
            rope_angles,
            tokens,
            rows,
            att_rows,
            spans,
            sel_src,
            sel_spans,
        } = ws;
        acts.ensure(graph.acts.len());
        tokens.clear();
        rows.clear();
        att_rows.clear();
        spans.clear();
        sel_src.clear();
        sel_spans.clear();
        for (seq, s) in steps.iter().enumerate() {
            let (start, n, pos0) = (tokens.len(), s.tokens.len(), s.kv.len());
            tokens.extend_from_slice(s.tokens);
            rows.extend((0..n).map(|t| QueryRow {
                seq,
                pos: pos0 + t,
                round_probs: n == 1,
            }));
            spans.push((start, n));
            let sel = match s.logits {
                Logits::Last => start + n - 1..start + n,
                Logits::All => start..start + n,
            };
            sel_spans.push((sel_src.len(), sel.len()));
            sel_src.extend(sel);
        }
        *qi_of = None;
        rope_angles.clear();
        let mut pass = Pass {
            model: self,
            graph,
            steps,
            acts,
            qi,
            qi_of,
            tmp,
            attn_scratch,
            rope_angles,
            rows,
            att_rows,
            spans,
            sel_src,
            tokens,
            capacity,
        };
        for (i, op) in graph.ops.iter().enumerate() {
            let t = op_profile::clock();
            pass.run(op)?;
            op_profile::record(i, t);
        }
        for s in steps.iter_mut() {
            s.kv.advance(s.tokens.len());
        }
        Ok(())
    }
}
