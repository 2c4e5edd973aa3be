//! The whole BitNet forward pass on the GPU: a plan of kernel ops compiled once at load,
//! recorded into ONE compute pass and submitted ONCE per step.
//!
//! # Plan
//! [`GpuModel::load`] uploads every weight once (I2_S codes as stored, the F16 embedding
//! sharded and shared with the tied LM head, norm vectors as f32), allocates persistent
//! activation buffers for the largest batch (`max_batch` tokens) and a per-layer F16 KV
//! cache, and builds one op struct per kernel launch (bind groups created there, never per
//! step). Per layer the plan is
//! ```text
//! rmsnorm+quant(x, attn_norm) → act_d
//! q, k, v = ternary(act_d)                       (batched kernel when n > 1)
//! rope_kv(q, k, v) → q rotated, k/v into the F16 cache at pos..
//! att = attention(q, cache)                      (3 dispatches for 1 token, 1 for a batch)
//! rmsnorm+quant(att, attn_sub_norm) → act_d;  x += ternary_o(act_d)     (Epilogue::Add)
//! rmsnorm+quant(x, ffn_norm) → act_d;  gate, up = ternary(act_d)
//! gate = act(gate)·up                            (ReLU² or SiLU)
//! rmsnorm+quant(gate, ffn_sub_norm) → act_ff;  x += ternary_down(act_ff)
//! ```
//! then `h = rmsnorm(x, output_norm)` (f32) and the F16 LM head over the embedding shards:
//! with `round_x` for a single token (the reference's decode numerics), the `last` entry for
//! a prompt's last row, or every row. Every norm that feeds ternary linears is fused with
//! the int8 quantization.
//!
//! # A step
//! Write the token ids and the [`StepUniform`] (n_tokens, pos), record every op into one
//! compute pass, copy the result (logits, or the top-k / argmax pairs) to a persistent
//! staging buffer, submit once, map. Nothing is created after load: the counter test checks
//! it over 100 decode steps.
//!
//! This plan is built from the GGUF tensors and [`Config`] with the same names and shapes
//! as `model/bitnet.rs` (weights are read from the file, never from the CPU model's copies).

use std::sync::Arc;

use super::buffers::{GpuBuffer, Sharded};
use super::context::GpuContext;
use super::ops::{
    Attention, AttnDims, Embed, F16Matvec, Glu, GpuKv, NormOut, QuantAct, RmsNorm, RopeKv,
    StepUniform, TernaryMatvec, TernaryWeights, TopK,
};
use super::pipelines::{Epilogue, GluAct};
use crate::gguf::GgufFile;
use crate::model::{Arch, Config, Logits, Model};
use crate::quant::{self, GgmlType};
use crate::{Error, Result};

/// Lanes per weight row of the ternary and F16 matvecs.
const TPR: u32 = 32;

/// Sizes fixed at load.
#[derive(Clone, Copy, Debug)]
pub struct GpuModelOptions {
    /// Positions of the KV cache.
    pub n_ctx: usize,
    /// Largest batch of tokens one step runs (activation buffers are sized for it);
    /// longer inputs are split into steps of this size.
    pub max_batch: usize,
    /// k of [`GpuModel::topk_step`].
    pub top_k: u32,
}

impl Default for GpuModelOptions {
    fn default() -> Self {
        GpuModelOptions {
            n_ctx: 4096,
            max_batch: 64,
            top_k: 40,
        }
    }
}

struct Layer {
    attn_norm: RmsNorm,
    wq: TernaryMatvec,
    wk: TernaryMatvec,
    wv: TernaryMatvec,
    rope: RopeKv,
    attn: Attention,
    attn_sub_norm: RmsNorm,
    wo: TernaryMatvec,
    ffn_norm: RmsNorm,
    w_gate: TernaryMatvec,
    w_up: TernaryMatvec,
    glu: Glu,
    ffn_sub_norm: RmsNorm,
    w_down: TernaryMatvec,
}

impl Layer {
    fn record(&self, pass: &mut wgpu::ComputePass<'_>, n: u32, n_kv: u32) {
        let b = n > 1;
        self.attn_norm.record(pass, n);
        self.wq.record(pass, n, b);
        self.wk.record(pass, n, b);
        self.wv.record(pass, n, b);
        self.rope.record(pass, n);
        self.attn.record(pass, n, n_kv);
        self.attn_sub_norm.record(pass, n);
        self.wo.record(pass, n, b);
        self.ffn_norm.record(pass, n);
        self.w_gate.record(pass, n, b);
        self.w_up.record(pass, n, b);
        self.glu.record(pass, n);
        self.ffn_sub_norm.record(pass, n);
        self.w_down.record(pass, n, b);
    }

    /// Dispatches of [`Layer::record`] for `n` tokens.
    fn dispatches(n: u32) -> usize {
        13 + Attention::dispatches(n)
    }
}

/// What a step hands back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// Logits rows: all tokens', or the last token's only.
    Logits(Logits),
    /// Argmax of the (single) logits row.
    Argmax,
    /// Top-k of the (single) logits row.
    TopK,
}

/// A BitNet model resident on the GPU with its KV cache.
pub struct GpuModel {
    ctx: Arc<GpuContext>,
    cfg: Config,
    opts: GpuModelOptions,
    ids: GpuBuffer,
    step: StepUniform,
    embed: Embed,
    layers: Vec<Layer>,
    out_norm: RmsNorm,
    head_decode: F16Matvec,
    head_all: F16Matvec,
    head_last: F16Matvec,
    argmax: TopK,
    topk: TopK,
    logits: GpuBuffer,
    /// Rows the logits buffer holds.
    logits_rows: usize,
    staging: GpuBuffer,
    /// Positions filled in the KV cache.
    pos: usize,
    _keep: Vec<GpuBuffer>,
    _kv: Vec<GpuKv>,
    _embd: Sharded,
}

fn tensor<'f>(file: &'f GgufFile, name: &str) -> Result<(&'f crate::gguf::TensorInfo, &'f [u8])> {
    let info = file
        .tensor(name)
        .ok_or_else(|| Error::Model(format!("tensor '{name}' is missing")))?;
    Ok((info, file.tensor_data(info)))
}

fn vector(ctx: &GpuContext, file: &GgufFile, name: &str, n: usize) -> Result<GpuBuffer> {
    let (info, data) = tensor(file, name)?;
    if info.n_elements() != n as u64 {
        return Err(Error::Model(format!(
            "tensor '{name}': expected {n} elements, found shape {:?}",
            info.shape
        )));
    }
    let mut v = vec![0f32; n];
    quant::dequantize_row(info.ty, name, data, n, 0, &mut v)?;
    GpuBuffer::from_slice(ctx, name, &v)
}

fn ternary(
    ctx: &GpuContext,
    file: &GgufFile,
    cfg: &Config,
    name: &str,
    k: usize,
    m: usize,
) -> Result<TernaryWeights> {
    let (info, data) = tensor(file, name)?;
    if info.ty != GgmlType::I2_S {
        return Err(Error::Gpu(format!(
            "tensor '{name}' is {}: the GPU backend multiplies I2_S ternary weights only",
            info.ty.name()
        )));
    }
    if info.shape != [k as u64, m as u64] {
        return Err(Error::Model(format!(
            "tensor '{name}': expected shape [{k}, {m}], found {:?}",
            info.shape
        )));
    }
    let mut w = TernaryWeights::upload(ctx, name, data, k, m)?;
    // 1bitLLM's optional per-projection scale, folded into the tensor scale (the CPU
    // multiplies it after; the results differ by an ulp).
    let scale_name = name.replace(".weight", ".scale");
    if cfg.arch == Arch::BitNet && file.tensor(&scale_name).is_some() {
        let (info, data) = tensor(file, &scale_name)?;
        let mut s = [0f32];
        quant::dequantize_row(info.ty, &scale_name, data, 1, 0, &mut s)?;
        w.scale *= s[0];
    }
    Ok(w)
}

impl GpuModel {
    /// Uploads the model in `file` (hyper-parameters `cfg`, as the CPU model reads them)
    /// and builds the plan.
    pub fn load(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        cfg: &Config,
        opts: GpuModelOptions,
    ) -> Result<GpuModel> {
        let c = cfg;
        if !matches!(c.arch, Arch::BitNetB158 | Arch::BitNet) {
            return Err(Error::Gpu(format!(
                "the GPU backend runs BitNet models only in this build ('{}' runs on --backend cpu)",
                c.arch_name
            )));
        }
        let (d, kvd, ff, hq) = (c.n_embd, c.kv_dim(), c.n_ff, c.n_head * c.head_dim);
        if hq != d {
            return Err(Error::Gpu(format!(
                "GPU plan: n_head·head_dim = {hq} differs from n_embd = {d}"
            )));
        }
        if opts.max_batch == 0 || opts.n_ctx == 0 {
            return Err(Error::Gpu(
                "GPU plan: max_batch and n_ctx must be ≥ 1".into(),
            ));
        }
        let t = opts.max_batch;
        let g = &*ctx;
        let v = g.variant(TPR);
        let dims = AttnDims {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            n_rot: c.n_rot,
            rope_base: c.rope_base,
        };

        let (einfo, edata) = tensor(file, "token_embd.weight")?;
        if einfo.ty != GgmlType::F16 || einfo.shape != [d as u64, c.n_vocab as u64] {
            return Err(Error::Gpu(format!(
                "token_embd.weight: the GPU backend needs F16 [{d}, {}], found {} {:?}",
                c.n_vocab,
                einfo.ty.name(),
                einfo.shape
            )));
        }
        let embd = Sharded::from_rows(g, "token_embd", edata, d * 2, None)?;

        let step = StepUniform::new(g)?;
        let ids = GpuBuffer::zeroed(g, "ids", (t * 4) as u64)?;
        let f32s = |label: &str, n: usize| GpuBuffer::zeroed(g, label, (n * 4) as u64);
        let x = f32s("x", t * d)?;
        let q = f32s("q", t * hq)?;
        let k = f32s("k", t * kvd)?;
        let vb = f32s("v", t * kvd)?;
        let att = f32s("att", t * hq)?;
        let gate = f32s("gate", t * ff)?;
        let up = f32s("up", t * ff)?;
        let h = f32s("h", t * d)?;
        let act_d = QuantAct::new(g, d, t)?;
        let act_ff = QuantAct::new(g, ff, t)?;
        let row_bytes = (c.n_vocab * 4) as u64;
        let logits_rows = (t as u64).min(g.caps().max_binding / row_bytes).max(1) as usize;
        let logits = GpuBuffer::zeroed(g, "logits", logits_rows as u64 * row_bytes)?;
        let staging = GpuBuffer::with_usage(
            g,
            "logits.staging",
            logits.size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;

        let embed = Embed::new(g, v, &embd, &ids, &x)?;
        let norm_q = |w: &GpuBuffer, input: &GpuBuffer, n: usize, a: &QuantAct| {
            RmsNorm::new(g, v, input, w, n, c.rms_eps, NormOut::Quant(a))
        };
        let lin = |w: &TernaryWeights, a: &QuantAct, out: &GpuBuffer, e: Epilogue| {
            TernaryMatvec::new(g, v, TPR, w, a, out, e, Some(&step))
        };
        let act = match c.arch {
            Arch::BitNet => GluAct::Silu,
            _ => GluAct::ReluSqr,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        let mut keep = Vec::new();
        let mut kvs = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let tw = |s: &str, k: usize, m: usize| ternary(g, file, c, &n(s), k, m);
            let nv = |s: &str, len: usize| vector(g, file, &n(s), len);
            let (attn_norm_w, sub_w, ffn_norm_w, ffn_sub_w) = (
                nv("attn_norm", d)?,
                nv("attn_sub_norm", d)?,
                nv("ffn_norm", d)?,
                nv("ffn_sub_norm", ff)?,
            );
            let (wq, wk, wv, wo) = (
                tw("attn_q", d, hq)?,
                tw("attn_k", d, kvd)?,
                tw("attn_v", d, kvd)?,
                tw("attn_output", d, d)?,
            );
            let (wg, wu, wd) = (
                tw("ffn_gate", d, ff)?,
                tw("ffn_up", d, ff)?,
                tw("ffn_down", ff, d)?,
            );
            let kv = GpuKv::new(g, opts.n_ctx, kvd)?;
            layers.push(Layer {
                attn_norm: norm_q(&attn_norm_w, &x, d, &act_d)?,
                wq: lin(&wq, &act_d, &q, Epilogue::Store)?,
                wk: lin(&wk, &act_d, &k, Epilogue::Store)?,
                wv: lin(&wv, &act_d, &vb, Epilogue::Store)?,
                rope: RopeKv::new(g, dims, &step, &q, &k, &vb, &kv)?,
                attn: Attention::new(g, dims, &step, &q, &kv, &att, true)?,
                attn_sub_norm: norm_q(&sub_w, &att, d, &act_d)?,
                wo: lin(&wo, &act_d, &x, Epilogue::Add)?,
                ffn_norm: norm_q(&ffn_norm_w, &x, d, &act_d)?,
                w_gate: lin(&wg, &act_d, &gate, Epilogue::Store)?,
                w_up: lin(&wu, &act_d, &up, Epilogue::Store)?,
                glu: Glu::new(g, act, &gate, &up, ff)?,
                ffn_sub_norm: norm_q(&ffn_sub_w, &gate, ff, &act_ff)?,
                w_down: lin(&wd, &act_ff, &x, Epilogue::Add)?,
            });
            kvs.push(kv);
            keep.extend([attn_norm_w, sub_w, ffn_norm_w, ffn_sub_w]);
            keep.extend([wq, wk, wv, wo, wg, wu, wd].map(|w| w.codes));
        }
        let out_norm_w = vector(g, file, "output_norm.weight", d)?;
        let out_norm = RmsNorm::new(g, v, &x, &out_norm_w, d, c.rms_eps, NormOut::F32(&h))?;
        let head_decode = F16Matvec::new(g, v, TPR, &embd, &h, &logits, true)?;
        let head_all = F16Matvec::new(g, v, TPR, &embd, &h, &logits, false)?;
        let head_last = F16Matvec::last_row(g, v, TPR, &embd, &h, &logits, false, &step)?;
        let argmax = TopK::new(g, &logits, c.n_vocab as u32, 1)?;
        let topk = TopK::new(g, &logits, c.n_vocab as u32, opts.top_k)?;
        keep.extend([
            out_norm_w,
            x,
            q,
            k,
            vb,
            att,
            gate,
            up,
            h,
            act_d.q,
            act_d.meta,
            act_ff.q,
            act_ff.meta,
        ]);
        Ok(GpuModel {
            ctx,
            cfg: c.clone(),
            opts,
            ids,
            step,
            embed,
            layers,
            out_norm,
            head_decode,
            head_all,
            head_last,
            argmax,
            topk,
            logits,
            logits_rows,
            staging,
            pos: 0,
            _keep: keep,
            _kv: kvs,
            _embd: embd,
        })
    }

    /// Uploads a loaded [`Model`] (its file and configuration) and builds the plan.
    pub fn from_model(
        ctx: Arc<GpuContext>,
        model: &Model,
        opts: GpuModelOptions,
    ) -> Result<GpuModel> {
        Self::load(ctx, model.file(), model.config(), opts)
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The context this model runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Positions the KV cache holds.
    pub fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    /// Positions filled in the KV cache.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Forgets every position after the first `len` (0 starts a new sequence).
    pub fn truncate(&mut self, len: usize) {
        self.pos = self.pos.min(len);
    }

    /// Dispatches recorded for one decode step ending in the GPU argmax
    /// ([`GpuModel::argmax_step`]).
    pub fn dispatches_per_token(&self) -> usize {
        self.embed.dispatch_count()
            + self.layers.len() * Layer::dispatches(1)
            + 1
            + self.head_decode.dispatch_count()
            + 2
    }

    /// Records and submits one step of `tokens` (≤ max_batch) at the current position,
    /// with the result selected by `out` copied to staging; advances the position.
    fn step(&mut self, tokens: &[u32], out: Out) -> Result<()> {
        let n = tokens.len();
        if n == 0 || n > self.opts.max_batch {
            return Err(Error::Request(format!(
                "GPU step of {n} tokens (1..={} allowed)",
                self.opts.max_batch
            )));
        }
        if self.pos + n > self.opts.n_ctx {
            return Err(Error::Request(format!(
                "context full: {} positions used + {n} new > context size {}",
                self.pos, self.opts.n_ctx
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
            return Err(Error::Request(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.cfg.n_vocab
            )));
        }
        let g = &*self.ctx;
        let nt = n as u32;
        self.ids.write(g, 0, bytemuck::cast_slice(tokens));
        self.step.write(g, nt, self.pos as u32);
        let n_kv = (self.pos + n) as u32;
        let head = match (n, out) {
            (1, _) => &self.head_decode,
            (_, Out::Logits(Logits::All)) => &self.head_all,
            _ => &self.head_last,
        };
        let mut enc = g.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            self.embed.record(&mut pass, nt);
            for l in &self.layers {
                l.record(&mut pass, nt, n_kv);
            }
            self.out_norm.record(&mut pass, nt);
            head.record(&mut pass, nt);
            match out {
                Out::Argmax => self.argmax.record(&mut pass),
                Out::TopK => self.topk.record(&mut pass),
                Out::Logits(_) => {}
            }
        }
        match out {
            Out::Argmax => self.argmax.record_download(&mut enc),
            Out::TopK => self.topk.record_download(&mut enc),
            Out::Logits(w) => {
                let rows = if w == Logits::All { n } else { 1 };
                let bytes = (rows * self.cfg.n_vocab * 4) as u64;
                enc.copy_buffer_to_buffer(&self.logits.buf, 0, &self.staging.buf, 0, bytes);
            }
        }
        g.submit(enc);
        self.pos += n;
        Ok(())
    }

    /// Maps the first `floats` values of the logits staging buffer.
    fn read_staging(&self, floats: usize, out: &mut Vec<f32>) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.staging
            .buf
            .map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
        self.ctx.wait()?;
        rx.recv()
            .map_err(|_| Error::Gpu("logits: map callback dropped".into()))?
            .map_err(|e| Error::Gpu(format!("logits: map failed: {e}")))?;
        {
            let view = self
                .staging
                .buf
                .get_mapped_range(..)
                .map_err(|e| Error::Gpu(format!("logits: {e}")))?;
            out.extend_from_slice(bytemuck::cast_slice(&view[..floats * 4]));
        }
        self.staging.buf.unmap();
        Ok(())
    }

    /// Runs `tokens` at the positions after those already cached (in steps of at most
    /// `max_batch`, or fewer when every row's logits are wanted) and returns the logits:
    /// one row per token for [`Logits::All`], the last token's for [`Logits::Last`].
    /// One token uses the reference's decode numerics, a batch its batch numerics.
    pub fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Request("no tokens to evaluate".into()));
        }
        let chunk = match which {
            Logits::All => self.opts.max_batch.min(self.logits_rows),
            Logits::Last => self.opts.max_batch,
        };
        let mut out = Vec::new();
        let chunks: Vec<&[u32]> = tokens.chunks(chunk).collect();
        for (i, part) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            if which == Logits::All || last {
                self.step(part, Out::Logits(which))?;
                let rows = if which == Logits::All { part.len() } else { 1 };
                self.read_staging(rows * self.cfg.n_vocab, &mut out)?;
            } else {
                // Earlier chunks of a Last request: nothing to read back.
                self.step(part, Out::Logits(Logits::Last))?;
            }
        }
        self.ctx.check()?;
        Ok(out)
    }

    /// Decodes one token and returns the argmax of its logits (ties → lowest id); only
    /// the id and its logit come back from the GPU.
    pub fn argmax_step(&mut self, token: u32) -> Result<u32> {
        self.step(&[token], Out::Argmax)?;
        Ok(self.argmax.read(&self.ctx)?[0].0)
    }

    /// Decodes one token and returns the `top_k` best (id, logit) pairs, best first.
    pub fn topk_step(&mut self, token: u32) -> Result<Vec<(u32, f32)>> {
        self.step(&[token], Out::TopK)?;
        self.topk.read(&self.ctx)
    }
}
