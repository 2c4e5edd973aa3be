//! The CPU runs a model's [`Graph`] op by op with the kernels of this module.

use std::sync::Arc;

use super::{
    add_rows, attention, gelu_ggml, layer_norm, pool, rms_norm, rope, scratch_per_thread,
    AttnShape, Linear, QuantInput,
};
use crate::gguf::GgufFile;
use crate::kv::KvCache;
use crate::model::graph::{ActId, GluAct, Graph, Op, UnaryAct, WeightKind};
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

/// The per-sequence state of a CPU run: KV cache and reusable buffers (sized on first use,
/// then reused, so decode steps do not allocate).
pub struct CpuState {
    kv: KvCache,
    acts: Acts,
    qi: QuantInput,
    qi_of: Option<(usize, u64)>,
    tmp: Vec<f32>,
    attn_scratch: Vec<f32>,
}

impl CpuState {
    /// The logits rows written by the last forward pass of `graph`.
    pub fn logits(&self, graph: &Graph) -> &[f32] {
        let l = graph.logits.0;
        &self.acts.bufs[l][..self.acts.rows[l] * graph.acts[l].width]
    }

    /// The KV cache.
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Forgets every position after the first `len`.
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
                    CpuWeight::Matrix(l)
                }
            });
        }
        let mut model = CpuModel {
            weights,
            lm_head: None,
        };
        if opts.lm_head == LmHead::Q8_0 {
            let head = graph.ops.iter().find_map(|op| match op {
                Op::Linear { w, out, .. } if *out == graph.logits => Some(*w),
                _ => None,
            });
            if let Some(w) = head {
                model.lm_head = Some(model.matrix(w.0)?.requantized_q8_0()?);
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

    /// A fresh sequence state with room for `n_ctx` positions.
    pub fn new_state(&self, graph: &Graph, n_ctx: usize) -> CpuState {
        let kv_dim = graph.attn.n_head_kv * graph.attn.head_dim;
        let n = graph.acts.len();
        CpuState {
            kv: KvCache::new(graph.n_layer, kv_dim, n_ctx),
            acts: Acts {
                bufs: vec![Vec::new(); n],
                rows: vec![0; n],
                version: vec![0; n],
            },
            qi: QuantInput::default(),
            qi_of: None,
            tmp: Vec::new(),
            attn_scratch: Vec::new(),
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
        let n = tokens.len();
        if n == 0 {
            return Err(Error::Request("no tokens to evaluate".into()));
        }
        st.kv.check_room(n)?;
        let pos0 = st.kv.len();
        let single = n == 1;
        st.qi.round_f16 = single;
        st.qi_of = None;
        let g = &graph.attn;
        for op in &graph.ops {
            match *op {
                Op::Embed { table, out } => {
                    let t = self.matrix(table.0)?;
                    let d = t.in_features();
                    let o = st.acts.write(out, n, d);
                    for (&id, row) in tokens.iter().zip(o.chunks_exact_mut(d)) {
                        if id as usize >= t.out_features() {
                            return Err(Error::Request(format!(
                                "token id {id} is outside the vocabulary (size {})",
                                t.out_features()
                            )));
                        }
                        t.dequantize_row(id as usize, row)?;
                    }
                }
                Op::RmsNorm { x, w, out } => {
                    let wv = self.vector(w.0)?;
                    let rows = st.acts.rows[x.0];
                    let xs = std::mem::take(&mut st.acts.bufs[x.0]);
                    let o = st.acts.write(out, rows, wv.len());
                    rms_norm(&xs[..rows * wv.len()], wv, graph.rms_eps, o);
                    st.acts.bufs[x.0] = xs;
                }
                Op::Linear { w, x, out, add } => {
                    let l = match (&self.lm_head, out == graph.logits) {
                        (Some(h), true) => h,
                        _ => self.matrix(w.0)?,
                    };
                    let rows = st.acts.rows[x.0];
                    let key = (x.0, st.acts.version[x.0]);
                    if st.qi_of != Some(key) {
                        st.qi.reset();
                        st.qi_of = Some(key);
                    }
                    let xs = std::mem::take(&mut st.acts.bufs[x.0]);
                    let xs_rows = &xs[..rows * l.in_features()];
                    if add {
                        let mut tmp = std::mem::take(&mut st.tmp);
                        tmp.resize(rows * l.out_features(), 0.0);
                        l.forward(xs_rows, &mut st.qi, &mut tmp);
                        let o = st.acts.modify(out, rows * l.out_features());
                        o.iter_mut().zip(&tmp).for_each(|(a, &b)| *a += b);
                        st.tmp = tmp;
                    } else {
                        let o = st.acts.write(out, rows, l.out_features());
                        l.forward(xs_rows, &mut st.qi, o);
                    }
                    st.acts.bufs[x.0] = xs;
                }
                Op::Rope { q, k } => {
                    let freqs = match g.rope_freqs {
                        Some(f) => Some(self.vector(f.0)?),
                        None => None,
                    };
                    for a in [q, k] {
                        let w = graph.acts[a.0].width;
                        let buf = st.acts.modify(a, n * w);
                        rope(
                            buf,
                            n,
                            pos0,
                            g.head_dim,
                            g.n_rot,
                            g.rope_base,
                            g.rope_mode,
                            freqs,
                        );
                    }
                }
                Op::LayerNorm { x, w, b, eps, out } => {
                    let (wv, bv) = (self.vector(w.0)?, self.vector(b.0)?);
                    let rows = st.acts.rows[x.0];
                    let xs = std::mem::take(&mut st.acts.bufs[x.0]);
                    let o = st.acts.write(out, rows, wv.len());
                    layer_norm(&xs[..rows * wv.len()], wv, bv, eps, o);
                    st.acts.bufs[x.0] = xs;
                }
                Op::AddBias { x, b } => {
                    let bv = self.vector(b.0)?;
                    let rows = st.acts.rows[x.0];
                    add_rows(st.acts.modify(x, rows * bv.len()), bv);
                }
                Op::Act { act, x } => {
                    let len = st.acts.rows[x.0] * graph.acts[x.0].width;
                    let xs = st.acts.modify(x, len);
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
                    if pos0 + n > t.out_features() {
                        return Err(Error::Request(format!(
                            "position {} is past the model's {} learned positions",
                            pos0 + n - 1,
                            t.out_features()
                        )));
                    }
                    let mut tmp = std::mem::take(&mut st.tmp);
                    tmp.resize(d, 0.0);
                    let xs = st.acts.modify(x, n * d);
                    for (r, row) in xs.chunks_exact_mut(d).enumerate() {
                        t.dequantize_row(pos0 + r, &mut tmp)?;
                        add_rows(row, &tmp);
                    }
                    st.tmp = tmp;
                }
                Op::Slice { x, start, out } => {
                    let (wx, wo) = (graph.acts[x.0].width, graph.acts[out.0].width);
                    let rows = st.acts.rows[x.0];
                    let xs = std::mem::take(&mut st.acts.bufs[x.0]);
                    let o = st.acts.write(out, rows, wo);
                    for (or, xr) in o.chunks_exact_mut(wo).zip(xs.chunks_exact(wx)) {
                        or.copy_from_slice(&xr[start..start + wo]);
                    }
                    st.acts.bufs[x.0] = xs;
                }
                Op::KvStore { layer, k, v } => {
                    let kv_dim = g.n_head_kv * g.head_dim;
                    let (ks, vs) = (
                        &st.acts.bufs[k.0][..n * kv_dim],
                        &st.acts.bufs[v.0][..n * kv_dim],
                    );
                    st.kv.write(layer, ks, vs);
                }
                Op::Attention { layer, q, out } => {
                    let shape = AttnShape {
                        n_head: g.n_head,
                        n_head_kv: g.n_head_kv,
                        head_dim: g.head_dim,
                        pos0,
                        round_probs: single,
                        capacity: st.kv.n_ctx(),
                    };
                    let need =
                        scratch_per_thread(st.kv.n_ctx(), g.head_dim) * pool::global().n_threads();
                    let mut scratch = std::mem::take(&mut st.attn_scratch);
                    scratch.resize(need, 0.0);
                    let qs = std::mem::take(&mut st.acts.bufs[q.0]);
                    let w = graph.acts[out.0].width;
                    let o = st.acts.write(out, n, w);
                    let (kc, vc) = st.kv.layer(layer, pos0 + n);
                    attention(
                        &qs[..n * g.n_head * g.head_dim],
                        kc,
                        vc,
                        &shape,
                        o,
                        &mut scratch,
                    );
                    st.acts.bufs[q.0] = qs;
                    st.attn_scratch = scratch;
                }
                Op::Glu { act, gate, up } => {
                    let w = graph.acts[gate.0].width;
                    let ups = std::mem::take(&mut st.acts.bufs[up.0]);
                    let gs = st.acts.modify(gate, n * w);
                    match act {
                        GluAct::Relu2 => gs.iter_mut().zip(&ups).for_each(|(g, &u)| {
                            let r = g.max(0.0);
                            *g = (r * r) * u;
                        }),
                        GluAct::Silu => gs.iter_mut().zip(&ups).for_each(|(g, &u)| {
                            *g = (*g / (1.0 + (-*g).exp())) * u;
                        }),
                    }
                    st.acts.bufs[up.0] = ups;
                }
                Op::SelectRows { x, out } => {
                    let w = graph.acts[x.0].width;
                    let sel = match which {
                        Logits::Last => n - 1..n,
                        Logits::All => 0..n,
                    };
                    let xs = std::mem::take(&mut st.acts.bufs[x.0]);
                    let o = st.acts.write(out, sel.len(), w);
                    o.copy_from_slice(&xs[sel.start * w..sel.end * w]);
                    st.acts.bufs[x.0] = xs;
                }
            }
        }
        st.kv.advance(n);
        Ok(st.logits(graph))
    }
}

/// The activation buffers of a step.
struct Acts {
    bufs: Vec<Vec<f32>>,
    rows: Vec<usize>,
    /// Bumped on every write of an activation, so cached quantized inputs know they are stale.
    version: Vec<u64>,
}

impl Acts {
    /// The buffer of `a`, resized to `rows × width` and marked as rewritten.
    fn write(&mut self, a: ActId, rows: usize, width: usize) -> &mut [f32] {
        self.rows[a.0] = rows;
        self.modify(a, rows * width)
    }

    /// The first `len` values of `a`'s buffer for an in-place update.
    fn modify(&mut self, a: ActId, len: usize) -> &mut [f32] {
        self.version[a.0] += 1;
        let buf = &mut self.bufs[a.0];
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        &mut buf[..len]
    }
}
