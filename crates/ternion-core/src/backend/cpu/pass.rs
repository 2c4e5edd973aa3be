//! One CPU forward pass over the stacked rows of its steps: each graph op as a method. A
//! fused op runs as the primitive ops it stands for, in order, so its results are those of
//! the unfused graph bit for bit.

use super::acts::Acts;
use super::exec::{CpuModel, SeqStep};
use super::{
    add_rows, attention_rows, attention_scratch, gelu_ggml, layer_norm, pool, rms_norm,
    rotate_rows, Heads, Linear, QuantInput, QueryRow, RopeAngles,
};
use crate::model::graph::{ActId, GluAct, Graph, InNorm, Op, UnaryAct, WeightId};
use crate::Result;

/// Rows per parallel task of the row-wise element ops (RoPE, the gated activation): one
/// decode row is one task, run on the caller.
const ROWS_PER_TASK: usize = 4;

/// The state of one forward pass: the model, the steps and the workspace's buffers.
pub(super) struct Pass<'p, 'k> {
    pub(super) model: &'p CpuModel,
    pub(super) graph: &'p Graph,
    pub(super) steps: &'p mut [SeqStep<'k>],
    pub(super) acts: &'p mut Acts,
    pub(super) qi: &'p mut QuantInput,
    /// The activation (index, version) `qi` holds the quantization of.
    pub(super) qi_of: &'p mut Option<(usize, u64)>,
    pub(super) tmp: &'p mut Vec<f32>,
    pub(super) attn_scratch: &'p mut Vec<f32>,
    /// The pass's RoPE angles (cleared before it starts).
    pub(super) rope_angles: &'p mut RopeAngles,
    /// Sequence, position and decode flag of every row.
    pub(super) rows: &'p [QueryRow],
    /// Non-causal attention: `rows` with every position set to its step's last.
    pub(super) att_rows: &'p mut Vec<QueryRow>,
    /// Per step: first row and row count.
    pub(super) spans: &'p [(usize, usize)],
    /// The row each logits row comes from.
    pub(super) sel_src: &'p [usize],
    /// Token ids of every row.
    pub(super) tokens: &'p [u32],
    /// Largest context of the steps.
    pub(super) capacity: usize,
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

impl Pass<'_, '_> {
    /// Runs one graph op.
    pub(super) fn run(&mut self, op: &Op) -> Result<()> {
        match *op {
            Op::Embed { table, out } => self.embed(table, out)?,
            Op::RmsNorm { x, w, out } => self.rms_norm(x, w, out)?,
            Op::Linear { w, x, out, add } => self.linear(w, x, out, add)?,
            Op::NormLinear {
                x,
                norm,
                w,
                out,
                add,
            } => {
                let h = self.in_norm(x, norm)?;
                self.linear(w, h, out, add)?;
            }
            Op::NormQkv { x, norm, w, out } => {
                let h = self.in_norm(x, norm)?;
                self.linears(w, h, out)?;
            }
            Op::NormGlu {
                x,
                norm,
                act,
                w: [w_gate, w_up],
                gate,
                up,
            } => {
                let h = self.in_norm(x, norm)?;
                self.linears([w_gate, w_up], h, [gate, up])?;
                self.glu(act, gate, up);
            }
            Op::SelfAttention {
                layer,
                rope,
                q,
                k,
                v,
                out,
            } => {
                if rope {
                    self.rope(layer, q, k)?;
                }
                self.kv_store(layer, k, v);
                self.attention(layer, q, out);
            }
            Op::LayerNorm { x, w, b, eps, out } => {
                let (wv, bv) = (self.model.vector(w.0)?, self.model.vector(b.0)?);
                let r = self.acts.rows[x.0];
                let xs = std::mem::take(&mut self.acts.bufs[x.0]);
                let o = self.acts.write(out, r, wv.len());
                layer_norm(&xs[..r * wv.len()], wv, bv, eps, o);
                self.acts.bufs[x.0] = xs;
            }
            Op::AddBias { x, b } => {
                let bv = self.model.vector(b.0)?;
                let r = self.acts.rows[x.0];
                add_rows(self.acts.modify(x, r * bv.len()), bv);
            }
            Op::Act {
                act: UnaryAct::GeluTanh,
                x,
            } => {
                let xs = self.whole(x);
                pool::global().for_each_chunk_mut(xs, 4096, |_, c, _| {
                    c.iter_mut().for_each(|v| *v = gelu_ggml(*v))
                });
            }
            Op::AddPosEmbed { table, x } => self.add_pos(table, x)?,
            Op::Slice { x, start, out } => {
                let (wx, wo) = (self.width(x), self.width(out));
                let r = self.acts.rows[x.0];
                let xs = std::mem::take(&mut self.acts.bufs[x.0]);
                let o = self.acts.write(out, r, wo);
                for (or, xr) in o.chunks_exact_mut(wo).zip(xs.chunks_exact(wx)) {
                    or.copy_from_slice(&xr[start..start + wo]);
                }
                self.acts.bufs[x.0] = xs;
            }
            Op::Glu { act, gate, up } => self.glu(act, gate, up),
            Op::HeadRmsNorm { x, w, out } => {
                let wv = self.model.vector(w.0)?;
                let (r, width) = (self.acts.rows[x.0], self.width(x));
                let xs = std::mem::take(&mut self.acts.bufs[x.0]);
                let o = self.acts.write(out, r, width);
                rms_norm(&xs[..r * width], wv, self.graph.rms_eps, o);
                self.acts.bufs[x.0] = xs;
            }
            Op::Scale { x, s } => self.whole(x).iter_mut().for_each(|v| *v *= s),
            Op::Add { x, y } => {
                let ys = std::mem::take(&mut self.acts.bufs[y.0]);
                let xs = self.whole(x);
                xs.iter_mut().zip(&ys).for_each(|(a, &b)| *a += b);
                self.acts.bufs[y.0] = ys;
            }
            Op::SoftCap { x, cap } => self
                .whole(x)
                .iter_mut()
                .for_each(|v| *v = (*v / cap).tanh() * cap),
            Op::SelectRows { x, out } => {
                let w = self.width(x);
                let xs = std::mem::take(&mut self.acts.bufs[x.0]);
                let o = self.acts.write(out, self.sel_src.len(), w);
                for (or, &t) in o.chunks_exact_mut(w).zip(self.sel_src) {
                    or.copy_from_slice(&xs[t * w..(t + 1) * w]);
                }
                self.acts.bufs[x.0] = xs;
            }
        }
        Ok(())
    }

    fn width(&self, a: ActId) -> usize {
        self.graph.acts[a.0].width
    }

    /// Every value of `x`'s rows, for an in-place update.
    fn whole(&mut self, x: ActId) -> &mut [f32] {
        let len = self.acts.rows[x.0] * self.width(x);
        self.acts.modify(x, len)
    }

    fn embed(&mut self, table: WeightId, out: ActId) -> Result<()> {
        let t = self.model.embedding(table.0)?;
        let d = t.in_features();
        let o = self.acts.write(out, self.tokens.len(), d);
        for (&id, row) in self.tokens.iter().zip(o.chunks_exact_mut(d)) {
            t.dequantize_row(id as usize, row)?;
        }
        Ok(())
    }

    fn rms_norm(&mut self, x: ActId, w: WeightId, out: ActId) -> Result<()> {
        let wv = self.model.vector(w.0)?;
        let r = self.acts.rows[x.0];
        let xs = std::mem::take(&mut self.acts.bufs[x.0]);
        let o = self.acts.write(out, r, wv.len());
        rms_norm(&xs[..r * wv.len()], wv, self.graph.rms_eps, o);
        self.acts.bufs[x.0] = xs;
        Ok(())
    }

    /// The input norm of a fused projection op; returns the normalised rows' activation.
    fn in_norm(&mut self, x: ActId, norm: InNorm) -> Result<ActId> {
        self.rms_norm(x, norm.w, norm.scratch)?;
        Ok(norm.scratch)
    }

    fn linear(&mut self, w: WeightId, x: ActId, out: ActId, add: bool) -> Result<()> {
        let l: &Linear = match out == self.graph.logits {
            true => self.model.head(w.0)?,
            false => self.model.matrix(w.0)?,
        };
        let r = self.acts.rows[x.0];
        self.quantize_for(x, r);
        let xs = std::mem::take(&mut self.acts.bufs[x.0]);
        let xs_rows = &xs[..r * l.in_features()];
        if add {
            let mut t = std::mem::take(self.tmp);
            t.resize(r * l.out_features(), 0.0);
            l.forward(xs_rows, self.qi, &mut t);
            let o = self.acts.modify(out, r * l.out_features());
            o.iter_mut().zip(&t).for_each(|(a, &b)| *a += b);
            *self.tmp = t;
        } else {
            let o = self.acts.write(out, r, l.out_features());
            l.forward(xs_rows, self.qi, o);
        }
        self.acts.bufs[x.0] = xs;
        Ok(())
    }

    /// Points `qi` at `x` (`r` rows): its cached quantizations are reset when they belong
    /// to another activation or an older version of `x`.
    fn quantize_for(&mut self, x: ActId, r: usize) {
        let key = (x.0, self.acts.version[x.0]);
        if *self.qi_of != Some(key) {
            self.qi.reset();
            // Decode rows round F16 inputs. The rows of `x` are either one per token or
            // one per logits row; the two counts are equal only when every token is a
            // logits row, and then the flags agree.
            let rows = self.rows;
            if r == self.tokens.len() {
                self.qi.set_round_f16(rows.iter().map(|q| q.round_probs));
            } else {
                self.qi
                    .set_round_f16(self.sel_src.iter().map(|&t| rows[t].round_probs));
            }
            *self.qi_of = Some(key);
        }
    }

    /// The projections `w` of the same input `x` into `out` (Q, K and V; gate and up), as
    /// one parallel op where the weights allow ([`Linear::forward_fused`]).
    fn linears<const N: usize>(
        &mut self,
        w: [WeightId; N],
        x: ActId,
        out: [ActId; N],
    ) -> Result<()> {
        if N == 0 || out.contains(&self.graph.logits) {
            // The LM head may be substituted: one product at a time.
            for (w, out) in w.into_iter().zip(out) {
                self.linear(w, x, out, false)?;
            }
            return Ok(());
        }
        let first = self.model.matrix(w[0].0)?;
        let mut ls = [first; N];
        for (l, w) in ls.iter_mut().zip(w).skip(1) {
            *l = self.model.matrix(w.0)?;
        }
        let r = self.acts.rows[x.0];
        self.quantize_for(x, r);
        let xs = std::mem::take(&mut self.acts.bufs[x.0]);
        let mut bufs = std::array::from_fn::<_, N, _>(|i| {
            self.acts.write(out[i], r, ls[i].out_features());
            std::mem::take(&mut self.acts.bufs[out[i].0])
        });
        let mut i = 0;
        let products = bufs.each_mut().map(|b| {
            let l = ls[i];
            i += 1;
            (l, &mut b[..r * l.out_features()])
        });
        Linear::forward_fused(&xs[..r * first.in_features()], self.qi, products);
        for (o, b) in out.into_iter().zip(bufs) {
            self.acts.bufs[o.0] = b;
        }
        self.acts.bufs[x.0] = xs;
        Ok(())
    }

    fn rope(&mut self, layer: usize, q: ActId, k: ActId) -> Result<()> {
        let g = &self.graph.attn;
        let freqs = match g.rope_freqs {
            Some(f) => Some(self.model.vector(f.0)?),
            None => None,
        };
        let positions = self.rows.iter().map(|r| r.pos);
        let base = g.rope_base_of(layer);
        let table = self.rope_angles.table(base, g.n_rot, freqs, positions);
        let (n, per_row) = (self.tokens.len(), g.n_rot);
        for a in [q, k] {
            let w = self.graph.acts[a.0].width;
            let buf = self.acts.modify(a, n * w);
            // A row's rotation depends on its position only: blocks of rows in parallel.
            pool::global().for_each_chunk_mut(buf, ROWS_PER_TASK * w, |c, rows, _| {
                let angles = &table[c * ROWS_PER_TASK * per_row..];
                rotate_rows(rows, w, angles, g.head_dim, g.n_rot, g.rope_mode);
            });
        }
        Ok(())
    }

    fn kv_store(&mut self, layer: usize, k: ActId, v: ActId) {
        let kv_dim = self.graph.attn.n_head_kv * self.graph.attn.head_dim;
        let (ks, vs) = (&self.acts.bufs[k.0], &self.acts.bufs[v.0]);
        for (s, &(start, len)) in self.steps.iter_mut().zip(self.spans) {
            let span = start * kv_dim..(start + len) * kv_dim;
            s.kv.write(layer, &ks[span.clone()], &vs[span]);
        }
    }

    fn attention(&mut self, layer: usize, q: ActId, out: ActId) {
        let g = &self.graph.attn;
        let heads = Heads {
            n_head: g.n_head,
            n_head_kv: g.n_head_kv,
            head_dim: g.head_dim,
            window: g.window_of(layer),
        };
        let need = attention_scratch(self.capacity, g.n_head, g.head_dim);
        self.attn_scratch.resize(need, 0.0);
        let n = self.tokens.len();
        let qs = std::mem::take(&mut self.acts.bufs[q.0]);
        let o = self.acts.write(out, n, self.graph.acts[out.0].width);
        let seqs: &[SeqStep<'_>] = self.steps;
        if !g.causal && self.att_rows.is_empty() {
            self.att_rows.extend(whole_step_rows(self.rows, self.spans));
        }
        attention_rows(
            &qs[..n * g.n_head * g.head_dim],
            |i| seqs[i].kv.layer(layer),
            if g.causal { self.rows } else { self.att_rows },
            heads,
            self.capacity,
            o,
            self.attn_scratch,
        );
        self.acts.bufs[q.0] = qs;
    }

    fn glu(&mut self, act: GluAct, gate: ActId, up: ActId) {
        let w = self.width(gate);
        let ups = std::mem::take(&mut self.acts.bufs[up.0]);
        let gs = self.acts.modify(gate, self.tokens.len() * w);
        // Element by element: blocks of rows in parallel (a decode row runs inline).
        let block = ROWS_PER_TASK * w;
        pool::global().for_each_chunk_mut(gs, block, |c, gs, _| {
            let ups = &ups[c * block..];
            match act {
                GluAct::Relu2 => gs.iter_mut().zip(ups).for_each(|(g, &u)| {
                    let r = g.max(0.0);
                    *g = (r * r) * u;
                }),
                GluAct::Silu => gs.iter_mut().zip(ups).for_each(|(g, &u)| {
                    *g = (*g / (1.0 + (-*g).exp())) * u;
                }),
                GluAct::GeluTanh => gs
                    .iter_mut()
                    .zip(ups)
                    .for_each(|(g, &u)| *g = gelu_ggml(*g) * u),
            }
        });
        self.acts.bufs[up.0] = ups;
    }

    fn add_pos(&mut self, table: WeightId, x: ActId) -> Result<()> {
        let t = self.model.matrix(table.0)?;
        let d = t.in_features();
        let mut pe = std::mem::take(self.tmp);
        pe.resize(d, 0.0);
        let xs = self.acts.modify(x, self.tokens.len() * d);
        for (row, q) in xs.chunks_exact_mut(d).zip(self.rows) {
            t.dequantize_row(q.pos, &mut pe)?;
            add_rows(row, &pe);
        }
        *self.tmp = pe;
        Ok(())
    }
}
