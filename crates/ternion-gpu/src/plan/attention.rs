//! The builder of `Op::SelfAttention`: one `rope_kv` launch (the rotation of q and k and
//! the F16 store of k and v; n_rot = 0 without RoPE), then the attention launches. The
//! angles come from a table filled once per distinct RoPE base (`RopeTable`). The
//! single-token split of full attention may take the rotation and the store over, and
//! then the `rope_kv` launch skips single-token steps.

use super::build::Compiler;
use super::launch::Launch;
use crate::model::graph::ActId;
use crate::ops::{Attention, AttnDims, AttnOpts, RopeKv, RopeOpts, RopeTable, WindowAttention};
use crate::Result;

impl Compiler<'_> {
    /// `Op::SelfAttention`.
    pub(super) fn self_attention(
        &mut self,
        (layer, rope): (usize, bool),
        [q, k, v]: [ActId; 3],
        out: ActId,
    ) -> Result<()> {
        let (g, s, geo) = (self.g, self.steps, &self.graph.attn);
        let (d, freqs) = if rope {
            let freqs = geo.rope_freqs.map(|f| self.vector(f)).transpose()?;
            let base = geo.rope_base_of(layer);
            (
                AttnDims {
                    rope_base: base,
                    ..self.dims
                },
                freqs,
            )
        } else {
            (
                AttnDims {
                    n_rot: 0,
                    ..self.dims
                },
                None,
            )
        };
        let opts = RopeOpts {
            mode: geo.rope_mode,
            freqs: freqs.as_ref(),
        };
        let n_pos = s.index.n_ctx;
        let table = match self.rope_tables.iter().find(|t| t.serves(d, opts, n_pos)) {
            Some(t) => t.clone(),
            None => {
                let t = RopeTable::new(g, d, opts, n_pos)?;
                self.rope_tables.push(t.clone());
                t
            }
        };
        let (qb, kb, vb) = (self.acts.f32(q)?, self.acts.f32(k)?, self.acts.f32(v)?);
        let cache = (&self.kv[layer], &s.index);
        let rope = (opts, &table);
        let mut rope_kv = RopeKv::with_rope(g, d, rope, &s.step, &qb, &kb, &vb, cache)?;
        let ob = self.acts.f32(out)?;
        let attention = match geo.window_of(layer) {
            Some(w) => {
                let a = WindowAttention::new(g, self.dims, w, &s.step, &qb, cache, &ob)?;
                Launch::WindowAttention(a)
            }
            None => {
                let fused = rope_kv.fused_inputs().clone();
                let opts = AttnOpts {
                    round_p: true,
                    fast: self.fast.then_some(&s.step),
                    rope: Some(&fused),
                };
                let a = Attention::new(g, self.dims, &qb, cache, &ob, opts)?;
                if a.fuses_rope() {
                    rope_kv.set_fused();
                }
                Launch::Attention(a)
            }
        };
        self.push(Launch::RopeKv(rope_kv))?;
        self.push(attention)
    }
}
