//! BitNet b1.58 (2B-4T: `bitnet-b1.58` / `bitnet-25`) and 1bitLLM BitNet (`bitnet`).
//!
//! One block, as the math reads (BITNET.md §5):
//! ```text
//! h = rmsnorm(x)·attn_norm
//! q, k, v = BitLinear(h); q, k = rope_neox(q, k)
//! a = rmsnorm(softmax(q·kᵀ/√d + mask)·v)·attn_sub_norm       (GQA: q head h uses kv head h/group)
//! x = x + BitLinear_o(a)
//! h = rmsnorm(x)·ffn_norm
//! f = rmsnorm(act(BitLinear_gate(h)) · BitLinear_up(h))·ffn_sub_norm   (act: ReLU² or SiLU)
//! x = x + BitLinear_down(f)
//! ```
//! and `logits = token_embd · (rmsnorm(x)·output_norm)` (the LM head is tied).

use std::sync::Arc;

use super::config::{Arch, Config};
use crate::backend::cpu::{attention, rms_norm, rope_neox, AttnShape, Linear, QuantInput};
use crate::gguf::GgufFile;
use crate::kv::KvCache;
use crate::quant;
use crate::{Error, Result};

/// The weights of one transformer block.
struct Block {
    attn_norm: Vec<f32>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    attn_sub_norm: Vec<f32>,
    wo: Linear,
    ffn_norm: Vec<f32>,
    w_gate: Linear,
    w_up: Linear,
    ffn_sub_norm: Vec<f32>,
    w_down: Linear,
}

/// A loaded BitNet model: configuration plus weights, which stay in the mapped file.
pub struct BitNet {
    cfg: Config,
    file: Arc<GgufFile>,
    blocks: Vec<Block>,
    output_norm: Vec<f32>,
    lm_head: Linear,
}

/// Reusable activation buffers for one sequence; sized on first use, then reused.
#[derive(Default)]
pub struct Workspace {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    qi: QuantInput,
}

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's row.
    Last,
    /// One row per input token.
    All,
}

/// Reads a 1-D F32 (or F16) vector of `n` values.
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

impl Workspace {
    /// The logits written by the last forward pass.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

fn resize(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    buf.resize(n, 0.0);
    &mut buf[..n]
}

impl BitNet {
    /// Binds every tensor of the file to the architecture, checking names and shapes.
    pub fn load(file: Arc<GgufFile>, cfg: Config) -> Result<BitNet> {
        let (d, kv, ff) = (cfg.n_embd, cfg.kv_dim(), cfg.n_ff);
        let linear = |name: &str, k: usize, m: usize| -> Result<Linear> {
            let mut l = Linear::load(&file, name)?;
            if l.in_features() != k || l.out_features() != m {
                return Err(Error::Model(format!(
                    "tensor '{name}': expected shape [{k}, {m}], found [{}, {}]",
                    l.in_features(),
                    l.out_features()
                )));
            }
            let scale_name = name.replace(".weight", ".scale");
            if cfg.arch == Arch::BitNet && file.tensor(&scale_name).is_some() {
                l = l.with_post_scale(load_vector(&file, &scale_name, 1)?[0]);
            }
            Ok(l)
        };
        // block_count comes from the file: reserve no more blocks than it has tensors.
        let mut blocks = Vec::with_capacity(cfg.n_layer.min(file.tensors.len()));
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                attn_norm: load_vector(&file, &n("attn_norm"), d)?,
                wq: linear(&n("attn_q"), d, cfg.n_head * cfg.head_dim)?,
                wk: linear(&n("attn_k"), d, kv)?,
                wv: linear(&n("attn_v"), d, kv)?,
                attn_sub_norm: load_vector(&file, &n("attn_sub_norm"), d)?,
                wo: linear(&n("attn_output"), d, d)?,
                ffn_norm: load_vector(&file, &n("ffn_norm"), d)?,
                w_gate: linear(&n("ffn_gate"), d, ff)?,
                w_up: linear(&n("ffn_up"), d, ff)?,
                ffn_sub_norm: load_vector(&file, &n("ffn_sub_norm"), ff)?,
                w_down: linear(&n("ffn_down"), ff, d)?,
            });
        }
        let output_norm = load_vector(&file, "output_norm.weight", d)?;
        // The LM head is tied to the token embedding even when `output.weight` exists,
        // as in the reference graph (BITNET.md §5).
        let lm_head = linear("token_embd.weight", d, cfg.n_vocab)?;
        Ok(BitNet {
            cfg,
            file,
            blocks,
            output_norm,
            lm_head,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Bytes of weights read to decode one token (every matrix once, plus the LM head).
    pub fn weight_bytes_per_token(&self) -> u64 {
        let per_block = |b: &Block| {
            [&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down]
                .iter()
                .map(|l| l.weight_bytes())
                .sum::<u64>()
        };
        self.blocks.iter().map(per_block).sum::<u64>() + self.lm_head.weight_bytes()
    }

    fn embed(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let d = self.cfg.n_embd;
        let info = self
            .file
            .tensor("token_embd.weight")
            .expect("checked at load");
        let data = self.file.tensor_data(info);
        for (&t, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
            if t as usize >= self.cfg.n_vocab {
                return Err(Error::Request(format!(
                    "token id {t} is outside the vocabulary (size {})",
                    self.cfg.n_vocab
                )));
            }
            quant::dequantize_row(info.ty, &info.name, data, d, t as usize, row)?;
        }
        Ok(())
    }

    /// Runs `tokens` (at the positions after those already in `kv`) as one batch, appends
    /// their keys and values to `kv`, and returns the requested logits rows.
    ///
    /// A single token runs with the reference engine's decode numerics (probabilities and
    /// the final hidden state rounded to F16); a batch keeps them in f32.
    pub fn forward<'w>(
        &self,
        tokens: &[u32],
        kv: &mut KvCache,
        which: Logits,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        let n = tokens.len();
        if n == 0 {
            return Err(Error::Request("no tokens to evaluate".into()));
        }
        kv.check_room(n)?;
        let c = &self.cfg;
        let (d, kvd, ff, hq) = (c.n_embd, c.kv_dim(), c.n_ff, c.n_head * c.head_dim);
        let pos0 = kv.len();
        let positions: Vec<usize> = (pos0..pos0 + n).collect();
        let single = n == 1;
        ws.qi.round_f16 = single;

        let x = resize(&mut ws.x, n * d);
        self.embed(tokens, x)?;
        let h = resize(&mut ws.h, n * d.max(ff));
        let q = resize(&mut ws.q, n * hq);
        let k = resize(&mut ws.k, n * kvd);
        let v = resize(&mut ws.v, n * kvd);
        let att = resize(&mut ws.att, n * hq);
        let o = resize(&mut ws.o, n * d);
        let gate = resize(&mut ws.gate, n * ff);
        let up = resize(&mut ws.up, n * ff);
        let qi = &mut ws.qi;
        let shape = AttnShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            pos0,
            round_probs: single,
        };

        for (l, b) in self.blocks.iter().enumerate() {
            let hd = &mut h[..n * d];
            rms_norm(x, &b.attn_norm, c.rms_eps, hd);
            qi.reset();
            b.wq.forward(hd, qi, q);
            b.wk.forward(hd, qi, k);
            b.wv.forward(hd, qi, v);
            rope_neox(q, &positions, c.head_dim, c.n_rot, c.rope_base);
            rope_neox(k, &positions, c.head_dim, c.n_rot, c.rope_base);
            kv.write(l, k, v);
            let (kc, vc) = kv.layer(l, pos0 + n);
            attention(q, kc, vc, &shape, att);
            rms_norm(att, &b.attn_sub_norm, c.rms_eps, hd);
            qi.reset();
            b.wo.forward(hd, qi, o);
            add(x, o);

            rms_norm(x, &b.ffn_norm, c.rms_eps, hd);
            qi.reset();
            b.w_gate.forward(hd, qi, gate);
            b.w_up.forward(hd, qi, up);
            match c.arch {
                Arch::BitNetB158 => gate.iter_mut().zip(up.iter()).for_each(|(g, &u)| {
                    let r = g.max(0.0);
                    *g = (r * r) * u;
                }),
                Arch::BitNet => gate.iter_mut().zip(up.iter()).for_each(|(g, &u)| {
                    *g = (*g / (1.0 + (-*g).exp())) * u;
                }),
            }
            let hf = &mut h[..n * ff];
            rms_norm(gate, &b.ffn_sub_norm, c.rms_eps, hf);
            qi.reset();
            b.w_down.forward(hf, qi, o);
            add(x, o);
        }
        kv.advance(n);

        let rows = match which {
            Logits::Last => n - 1..n,
            Logits::All => 0..n,
        };
        let xs = &x[rows.start * d..rows.end * d];
        let hn = &mut h[..xs.len()];
        rms_norm(xs, &self.output_norm, c.rms_eps, hn);
        qi.reset();
        let logits = resize(&mut ws.logits, rows.len() * c.n_vocab);
        self.lm_head.forward(hn, qi, logits);
        Ok(logits)
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
}
