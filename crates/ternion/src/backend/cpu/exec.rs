//! The CPU runs a model's [`Graph`] op by op with the kernels of this module.
//!
//! A forward pass takes the new tokens of one or several sequences ([`SeqStep`]s) and runs
//! them as one stack of rows: every row-wise op (norms, every [`Op::Linear`], activations)
//! sees all rows at once, so each weight is read once per pass; RoPE, position embeddings,
//! the KV-cache write and attention use each row's own sequence and position. A row's
//! numerics do not depend on the other rows of the pass: a sequence gives bit-identical
//! results alone or batched.

use std::sync::Arc;

use super::acts::Acts;
use super::{
    add_rows, attention_rows, gelu_ggml, layer_norm, pool, rms_norm, rope, scratch_per_thread,
    Heads, Linear, QuantInput, QueryRow,
};
use crate::generate::{check_step, StepLimits};
use crate::gguf::GgufFile;
use crate::kv::{KvGeometry, KvPool, KvSeq, KvType, PAGE_POSITIONS};
use crate::model::graph::{GluAct, Graph, Op, UnaryAct, WeightKind};
use crate::model::{LmHead, LoadOptions, Logits};
use crate::quant;
use crate::{Error, Result};

/// A weight prepared for the CPU.
enum CpuWeight {
    /// A matrix left in its file format.
    Matrix(Linear),
    /// A small vector, converted to f32 once.
    Vector(Vec<f32>),
}

/// A model's weights bound for the CPU.
pub struct CpuModel {
    weights: Vec<CpuWeight>,
    /// A requantized LM head, when asked for (the token table itself stays as stored).
    lm_head: Option<Linear>,
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

/// The attention rows of a non-causal pass: each row of a step sees every position of the
/// step (and the cached ones before it).
fn whole_step_rows<'a>(
    rows: &'a [QueryRow],
    spans: &'a [(usize, usize)],
) -> impl Iterator<Item = QueryRow> + 'a {
    spans.iter().flat_map(move |&(start, len)| {
        let last = rows[start + len - 1].pos;
        rows[start..start + len]
            .iter()
            .map(move |r| QueryRow { pos: last, ..*r })
    })
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
                    CpuWeight::Matrix(l)
                }
            });
        }
        let mut model = CpuModel {
            weights,
            lm_head: None,
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
                model.lm_head = Some(model.matrix(w.0)?.requantized(ty)?);
            }
        }
        Ok(model)
    }

    fn matrix(&self, i: usize) -> Result<&Linear> {
        match &self.weights[i] {
            CpuWeight::Matrix(l) => Ok(l),
            CpuWeight::Vector(_) => Err(Error::Model("graph uses a vector as a matrix".into())),
        }
    }

    fn vector(&self, i: usize) -> Result<&[f32]> {
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
            .filter_map(|op| match op {
                Op::Linear { w, out, .. } => Some(match (&self.lm_head, *out == graph.logits) {
                    (Some(h), true) => h.weight_bytes(),
                    _ => self.matrix(w.0).map_or(0, Linear::weight_bytes),
                }),
                _ => None,
            })
            .sum()
    }

    /// The shape of this model's KV pages, holding values of type `ty`.
    pub fn kv_geometry(graph: &Graph, ty: KvType) -> KvGeometry {
        KvGeometry {
            n_layer: graph.n_layer,
            kv_dim: graph.attn.n_head_kv * graph.attn.head_dim,
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
        let n = tokens.len();
        *qi_of = None;
        let g = &graph.attn;
        let kv_dim = g.n_head_kv * g.head_dim;
        for op in &graph.ops {
            match *op {
                Op::Embed { table, out } => {
                    let t = self.matrix(table.0)?;
                    let d = t.in_features();
                    let o = acts.write(out, n, d);
                    for (&id, row) in tokens.iter().zip(o.chunks_exact_mut(d)) {
                        t.dequantize_row(id as usize, row)?;
                    }
                }
                Op::RmsNorm { x, w, out } => {
                    let wv = self.vector(w.0)?;
                    let r = acts.rows[x.0];
                    let xs = std::mem::take(&mut acts.bufs[x.0]);
                    let o = acts.write(out, r, wv.len());
                    rms_norm(&xs[..r * wv.len()], wv, graph.rms_eps, o);
                    acts.bufs[x.0] = xs;
                }
                Op::Linear { w, x, out, add } => {
                    let l = match (&self.lm_head, out == graph.logits) {
                        (Some(h), true) => h,
                        _ => self.matrix(w.0)?,
                    };
                    let r = acts.rows[x.0];
                    let key = (x.0, acts.version[x.0]);
                    if *qi_of != Some(key) {
                        qi.reset();
                        // Decode rows round F16 inputs. The rows of `x` are either one per
                        // token or one per logits row; the two counts are equal only when
                        // every token is a logits row, and then the flags agree.
                        if r == n {
                            qi.set_round_f16(rows.iter().map(|q| q.round_probs));
                        } else {
                            qi.set_round_f16(sel_src.iter().map(|&t| rows[t].round_probs));
                        }
                        *qi_of = Some(key);
                    }
                    let xs = std::mem::take(&mut acts.bufs[x.0]);
                    let xs_rows = &xs[..r * l.in_features()];
                    if add {
                        let mut t = std::mem::take(tmp);
                        t.resize(r * l.out_features(), 0.0);
                        l.forward(xs_rows, qi, &mut t);
                        let o = acts.modify(out, r * l.out_features());
                        o.iter_mut().zip(&t).for_each(|(a, &b)| *a += b);
                        *tmp = t;
                    } else {
                        let o = acts.write(out, r, l.out_features());
                        l.forward(xs_rows, qi, o);
                    }
                    acts.bufs[x.0] = xs;
                }
                Op::Rope { layer, q, k } => {
                    let freqs = match g.rope_freqs {
                        Some(f) => Some(self.vector(f.0)?),
                        None => None,
                    };
                    for a in [q, k] {
                        let w = graph.acts[a.0].width;
                        let buf = acts.modify(a, n * w);
                        for &(start, len) in spans.iter() {
                            rope(
                                &mut buf[start * w..(start + len) * w],
                                len,
                                rows[start].pos,
                                g.head_dim,
                                g.n_rot,
                                g.rope_base_of(layer),
                                g.rope_mode,
                                freqs,
                            );
                        }
                    }
                }
                Op::LayerNorm { x, w, b, eps, out } => {
                    let (wv, bv) = (self.vector(w.0)?, self.vector(b.0)?);
                    let r = acts.rows[x.0];
                    let xs = std::mem::take(&mut acts.bufs[x.0]);
                    let o = acts.write(out, r, wv.len());
                    layer_norm(&xs[..r * wv.len()], wv, bv, eps, o);
                    acts.bufs[x.0] = xs;
                }
                Op::AddBias { x, b } => {
                    let bv = self.vector(b.0)?;
                    let r = acts.rows[x.0];
                    add_rows(acts.modify(x, r * bv.len()), bv);
                }
                Op::Act { act, x } => {
                    let len = acts.rows[x.0] * graph.acts[x.0].width;
                    let xs = acts.modify(x, len);
                    match act {
                        UnaryAct::GeluTanh => {
                            pool::global().for_each_chunk_mut(xs, 4096, |_, c, _| {
                                c.iter_mut().for_each(|v| *v = gelu_ggml(*v))
                            })
                        }
                    }
                }
                Op::AddPosEmbed { table, x } => {
                    let t = self.matrix(table.0)?;
                    let d = t.in_features();
                    let mut pe = std::mem::take(tmp);
                    pe.resize(d, 0.0);
                    let xs = acts.modify(x, n * d);
                    for (row, q) in xs.chunks_exact_mut(d).zip(rows.iter()) {
                        t.dequantize_row(q.pos, &mut pe)?;
                        add_rows(row, &pe);
                    }
                    *tmp = pe;
                }
                Op::Slice { x, start, out } => {
                    let (wx, wo) = (graph.acts[x.0].width, graph.acts[out.0].width);
                    let r = acts.rows[x.0];
                    let xs = std::mem::take(&mut acts.bufs[x.0]);
                    let o = acts.write(out, r, wo);
                    for (or, xr) in o.chunks_exact_mut(wo).zip(xs.chunks_exact(wx)) {
                        or.copy_from_slice(&xr[start..start + wo]);
                    }
                    acts.bufs[x.0] = xs;
                }
                Op::KvStore { layer, k, v } => {
                    let (ks, vs) = (&acts.bufs[k.0], &acts.bufs[v.0]);
                    for (s, &(start, len)) in steps.iter_mut().zip(spans.iter()) {
                        let span = start * kv_dim..(start + len) * kv_dim;
                        s.kv.write(layer, &ks[span.clone()], &vs[span]);
                    }
                }
                Op::Attention { layer, q, out } => {
                    let heads = Heads {
                        n_head: g.n_head,
                        n_head_kv: g.n_head_kv,
                        head_dim: g.head_dim,
                        window: g.window_of(layer),
                    };
                    let need =
                        scratch_per_thread(capacity, g.head_dim) * pool::global().n_threads();
                    attn_scratch.resize(need, 0.0);
                    let qs = std::mem::take(&mut acts.bufs[q.0]);
                    let w = graph.acts[out.0].width;
                    let o = acts.write(out, n, w);
                    let seqs: &[SeqStep<'_>] = steps;
                    if !g.causal && att_rows.is_empty() {
                        att_rows.extend(whole_step_rows(rows, spans));
                    }
                    attention_rows(
                        &qs[..n * g.n_head * g.head_dim],
                        |i| seqs[i].kv.layer(layer),
                        if g.causal { rows } else { att_rows },
                        heads,
                        capacity,
                        o,
                        attn_scratch,
                    );
                    acts.bufs[q.0] = qs;
                }
                Op::Glu { act, gate, up } => {
                    let w = graph.acts[gate.0].width;
                    let ups = std::mem::take(&mut acts.bufs[up.0]);
                    let gs = acts.modify(gate, n * w);
                    match act {
                        GluAct::Relu2 => gs.iter_mut().zip(&ups).for_each(|(g, &u)| {
                            let r = g.max(0.0);
                            *g = (r * r) * u;
                        }),
                        GluAct::Silu => gs.iter_mut().zip(&ups).for_each(|(g, &u)| {
                            *g = (*g / (1.0 + (-*g).exp())) * u;
                        }),
                        GluAct::GeluTanh => gs
                            .iter_mut()
                            .zip(&ups)
                            .for_each(|(g, &u)| *g = gelu_ggml(*g) * u),
                    }
                    acts.bufs[up.0] = ups;
                }
                Op::HeadRmsNorm { x, w, out } => {
                    let wv = self.vector(w.0)?;
                    let (r, width) = (acts.rows[x.0], graph.acts[x.0].width);
                    let xs = std::mem::take(&mut acts.bufs[x.0]);
                    rms_norm(
                        &xs[..r * width],
                        wv,
                        graph.rms_eps,
                        acts.write(out, r, width),
                    );
                    acts.bufs[x.0] = xs;
                }
                Op::Scale { x, s } => {
                    let len = acts.rows[x.0] * graph.acts[x.0].width;
                    acts.modify(x, len).iter_mut().for_each(|v| *v *= s);
                }
                Op::Add { x, y } => {
                    let len = acts.rows[x.0] * graph.acts[x.0].width;
                    let ys = std::mem::take(&mut acts.bufs[y.0]);
                    let xs = acts.modify(x, len);
                    xs.iter_mut().zip(&ys).for_each(|(a, &b)| *a += b);
                    acts.bufs[y.0] = ys;
                }
                Op::SoftCap { x, cap } => {
                    let len = acts.rows[x.0] * graph.acts[x.0].width;
                    let xs = acts.modify(x, len);
                    xs.iter_mut().for_each(|v| *v = (*v / cap).tanh() * cap);
                }
                Op::SelectRows { x, out } => {
                    let w = graph.acts[x.0].width;
                    let xs = std::mem::take(&mut acts.bufs[x.0]);
                    let o = acts.write(out, sel_src.len(), w);
                    for (or, &t) in o.chunks_exact_mut(w).zip(sel_src.iter()) {
                        or.copy_from_slice(&xs[t * w..(t + 1) * w]);
                    }
                    acts.bufs[x.0] = xs;
                }
            }
        }
        for s in steps.iter_mut() {
            s.kv.advance(s.tokens.len());
        }
        Ok(())
    }
}
