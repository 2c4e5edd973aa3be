//! Rust wrappers of the kernels. Each op is built once (pipelines fetched from the cache,
//! parameter uniforms and bind groups created) and then recorded into any number of
//! compute passes with `record`, which creates nothing.

use super::buffers::{GpuBuffer, Sharded, UNIFORM};
use super::context::GpuContext;
use super::pipelines::{AttnStage, Epilogue, GluAct, Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// Threads per workgroup of every kernel.
pub const WG: u32 = 256;

/// One recorded kernel launch: pipeline, bind group and workgroup count along x.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    groups_x: u32,
}

impl Dispatch {
    fn new(
        ctx: &GpuContext,
        key: PipelineKey,
        label: &str,
        bindings: &[(u32, wgpu::BufferBinding<'_>)],
        groups_x: u32,
    ) -> Result<Dispatch> {
        let pipeline = ctx.pipeline(key)?;
        let layout = pipeline.get_bind_group_layout(0);
        let bind_group = ctx.create_bind_group(label, &layout, bindings);
        Ok(Dispatch {
            pipeline,
            bind_group,
            groups_x,
        })
    }

    fn record(&self, pass: &mut wgpu::ComputePass<'_>, groups_y: u32) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(self.groups_x, groups_y, 1);
    }
}

fn uniform(ctx: &GpuContext, label: &str, words: &[u32]) -> Result<GpuBuffer> {
    GpuBuffer::from_bytes(ctx, label, bytemuck::cast_slice(words), UNIFORM)
}

fn check_tpr(tpr: u32) -> Result<()> {
    if tpr.is_power_of_two() && tpr <= WG {
        Ok(())
    } else {
        Err(Error::Gpu(format!(
            "threads per row must be a power of two ≤ {WG}, got {tpr}"
        )))
    }
}

impl GpuContext {
    /// The best variant for a kernel with `tpr` lanes per row: F16 when enabled, subgroup
    /// reductions when enabled and a row's lanes fit in the smallest subgroup.
    pub fn variant(&self, tpr: u32) -> Variant {
        let c = self.caps();
        Variant {
            f16: c.f16,
            subgroups: c.subgroups && tpr <= c.subgroup_min_size,
        }
    }
}

/// The per-step uniform `{ n_tokens, pos, 0, 0 }` read by batched kernels; written once
/// per step with [`StepUniform::write`].
#[derive(Clone, Debug)]
pub struct StepUniform {
    /// The 16-byte uniform buffer.
    pub buf: GpuBuffer,
}

impl StepUniform {
    /// A zeroed step uniform.
    pub fn new(ctx: &GpuContext) -> Result<StepUniform> {
        Ok(StepUniform {
            buf: uniform(ctx, "step", &[0; 4])?,
        })
    }

    /// Queues the new values (ordered before the next submit).
    pub fn write(&self, ctx: &GpuContext, n_tokens: u32, pos: u32) {
        self.buf
            .write(ctx, 0, bytemuck::cast_slice(&[n_tokens, pos, 0, 0]));
    }
}

/// Gathers embedding rows: `out[t] = f32(table[ids[t]])`, one dispatch per table shard.
pub struct Embed {
    dispatches: Vec<Dispatch>,
    _params: Vec<GpuBuffer>,
}

impl Embed {
    /// `table`: F16 rows of `dim` elements (row_bytes = 2·dim); `ids`: u32 per token;
    /// `out`: f32, `dim` per token.
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        table: &Sharded,
        ids: &GpuBuffer,
        out: &GpuBuffer,
    ) -> Result<Embed> {
        let dim = (table.row_bytes / 2) as u32;
        let key = PipelineKey {
            kernel: Kernel::Embed,
            variant,
        };
        let mut dispatches = Vec::new();
        let mut params = Vec::new();
        for (i, shard) in table.shards.iter().enumerate() {
            let (r0, rows) = table.shard_rows(i);
            let u = uniform(ctx, "embed.params", &[dim, r0 as u32, rows as u32, 0])?;
            dispatches.push(Dispatch::new(
                ctx,
                key,
                "embed",
                &[
                    (0, u.binding()),
                    (1, ids.binding()),
                    (2, shard.binding()),
                    (3, out.binding()),
                ],
                (dim / 2).div_ceil(WG),
            )?);
            params.push(u);
        }
        Ok(Embed {
            dispatches,
            _params: params,
        })
    }

    /// Records the gather of the first `n_tokens` ids.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        for d in &self.dispatches {
            d.record(pass, n_tokens);
        }
    }

    /// Dispatches per record (one per table shard).
    pub fn dispatch_count(&self) -> usize {
        self.dispatches.len()
    }
}

/// Packed int8 activations and per-token (scale, Σq) written by [`RmsNorm`] in quant mode
/// and read by [`TernaryMatvec`].
#[derive(Clone, Debug)]
pub struct QuantAct {
    /// `max_tokens × k/4` words of packed int8.
    pub q: GpuBuffer,
    /// `max_tokens` pairs (f32 scale bits, i32 Σq bits).
    pub meta: GpuBuffer,
    /// Row width.
    pub k: usize,
}

impl QuantAct {
    /// Buffers for up to `max_tokens` rows of `k` (a multiple of 4).
    pub fn new(ctx: &GpuContext, k: usize, max_tokens: usize) -> Result<QuantAct> {
        Ok(QuantAct {
            q: GpuBuffer::zeroed(ctx, "act.q", (max_tokens * k) as u64)?,
            meta: GpuBuffer::zeroed(ctx, "act.meta", (max_tokens * 8) as u64)?,
            k,
        })
    }
}

/// Where [`RmsNorm`] writes.
pub enum NormOut<'a> {
    /// f32 rows.
    F32(&'a GpuBuffer),
    /// Per-token int8 quantization for the ternary matmuls.
    Quant(&'a QuantAct),
}

/// RMSNorm × weight of each token row, to f32 or quantized to int8.
pub struct RmsNorm {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl RmsNorm {
    /// Normalises rows of `x` (f32, `n` per token) with weight `w` (`n` f32).
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        x: &GpuBuffer,
        w: &GpuBuffer,
        n: usize,
        eps: f32,
        out: NormOut<'_>,
    ) -> Result<RmsNorm> {
        let params = uniform(ctx, "rmsnorm.params", &[n as u32, eps.to_bits()])?;
        let quant = matches!(out, NormOut::Quant(_));
        if quant && !n.is_multiple_of(4) {
            return Err(Error::Gpu(format!(
                "rmsnorm_quant: row width {n} is not a multiple of 4"
            )));
        }
        let mut bindings = vec![(0, params.binding()), (1, x.binding()), (2, w.binding())];
        match &out {
            NormOut::F32(o) => bindings.push((3, o.binding())),
            NormOut::Quant(a) => {
                bindings.push((3, a.q.binding()));
                bindings.push((4, a.meta.binding()));
            }
        }
        let key = PipelineKey {
            kernel: Kernel::RmsNorm { quant },
            variant,
        };
        let dispatch = Dispatch::new(ctx, key, "rmsnorm", &bindings, 0)?;
        Ok(RmsNorm {
            dispatch,
            _params: params,
        })
    }

    /// Records the norm of the first `n_tokens` rows (one workgroup each).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        pass.set_pipeline(&self.dispatch.pipeline);
        pass.set_bind_group(0, &self.dispatch.bind_group, &[]);
        pass.dispatch_workgroups(n_tokens, 1, 1);
    }
}

/// An I2_S weight matrix on the GPU: the codes as stored in the file, and the scale.
#[derive(Clone, Debug)]
pub struct TernaryWeights {
    /// `rows × k/4` bytes of codes.
    pub codes: GpuBuffer,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of 128).
    pub k: usize,
    /// Per-tensor scale.
    pub scale: f32,
}

impl TernaryWeights {
    /// Uploads an I2_S tensor (`data` = codes then the 32-byte tail, as in the file) of
    /// `rows` rows of `k` elements.
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        data: &[u8],
        k: usize,
        rows: usize,
    ) -> Result<TernaryWeights> {
        let codes = k * rows / 4;
        if !k.is_multiple_of(crate::quant::i2s::BLOCK_ELEMS) || data.len() < codes + 4 {
            return Err(Error::Gpu(format!(
                "{name}: I2_S tensor of {} bytes does not hold {rows} rows of {k} (K must be \
                 a multiple of 128) plus the scale",
                data.len()
            )));
        }
        let scale = crate::quant::i2s::tensor_scale(data, k * rows);
        Ok(TernaryWeights {
            codes: GpuBuffer::from_slice(ctx, name, &data[..codes])?,
            rows,
            k,
            scale,
        })
    }
}

/// `out (= or +=) W · dequant(act)` for I2_S `W`: a matvec per token (decode) and, when a
/// [`StepUniform`] is given, the 4-tokens-per-workgroup batch kernel (prefill).
pub struct TernaryMatvec {
    single: Dispatch,
    batch: Option<Dispatch>,
    _params: GpuBuffer,
}

impl TernaryMatvec {
    /// Binds `w`, `act` and `out` (f32, `w.rows` per token); `tpr` lanes per row.
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &TernaryWeights,
        act: &QuantAct,
        out: &GpuBuffer,
        epilogue: Epilogue,
        step: Option<&StepUniform>,
    ) -> Result<TernaryMatvec> {
        check_tpr(tpr)?;
        if act.k != w.k {
            return Err(Error::Gpu(format!(
                "ternary matvec: activations of width {} for weights of width {}",
                act.k, w.k
            )));
        }
        let words = (w.k / 16) as u32;
        let params = uniform(
            ctx,
            "ternary.params",
            &[w.rows as u32, words, w.scale.to_bits(), 0],
        )?;
        let groups = (w.rows as u32).div_ceil(WG / tpr);
        let mut bindings = vec![
            (0, params.binding()),
            (1, w.codes.binding()),
            (2, act.q.binding()),
            (3, act.meta.binding()),
            (4, out.binding()),
        ];
        let key = |batch| PipelineKey {
            kernel: Kernel::Ternary {
                tpr,
                epilogue,
                batch,
            },
            variant,
        };
        let single = Dispatch::new(ctx, key(false), "ternary", &bindings, groups)?;
        let batch = match step {
            Some(s) => {
                bindings.push((5, s.buf.binding()));
                Some(Dispatch::new(
                    ctx,
                    key(true),
                    "ternary4",
                    &bindings,
                    groups,
                )?)
            }
            None => None,
        };
        Ok(TernaryMatvec {
            single,
            batch,
            _params: params,
        })
    }

    /// Records the product for `n_tokens` tokens: the matvec per token, or (when built
    /// with a step uniform holding `n_tokens`, and `batched`) the batch kernel.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32, batched: bool) {
        match (&self.batch, batched) {
            (Some(b), true) => b.record(pass, n_tokens.div_ceil(4)),
            _ => self.single.record(pass, n_tokens),
        }
    }
}

/// One layer's F16 KV cache on the GPU: `n_ctx` rows of `kv_dim` halves for keys and for
/// values (two halves per u32 word), written by [`RopeKv`] and read by [`Attention`].
#[derive(Clone, Debug)]
pub struct GpuKv {
    /// Keys.
    pub k: GpuBuffer,
    /// Values.
    pub v: GpuBuffer,
    /// Positions held.
    pub n_ctx: usize,
    /// Halves per position (n_head_kv · head_dim).
    pub kv_dim: usize,
}

impl GpuKv {
    /// A zeroed cache of `n_ctx` positions of `kv_dim` (even) halves.
    pub fn new(ctx: &GpuContext, n_ctx: usize, kv_dim: usize) -> Result<GpuKv> {
        if !kv_dim.is_multiple_of(2) {
            return Err(Error::Gpu(format!("KV cache: kv_dim {kv_dim} is odd")));
        }
        let bytes = (n_ctx * kv_dim * 2) as u64;
        Ok(GpuKv {
            k: GpuBuffer::zeroed(ctx, "kv.k", bytes)?,
            v: GpuBuffer::zeroed(ctx, "kv.v", bytes)?,
            n_ctx,
            kv_dim,
        })
    }
}

/// Attention geometry shared by [`RopeKv`] and [`Attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnDims {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_head_kv: usize,
    /// Width of a head (even, ≤ 512).
    pub head_dim: usize,
    /// Rotated dims per head (a multiple of 4, ≤ head_dim).
    pub n_rot: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
}

impl AttnDims {
    fn check(&self) -> Result<()> {
        let ok = self.n_head_kv > 0
            && self.n_head.is_multiple_of(self.n_head_kv)
            && self.head_dim.is_multiple_of(2)
            && self.head_dim <= 512
            && self.n_rot.is_multiple_of(4)
            && self.n_rot <= self.head_dim;
        if ok {
            Ok(())
        } else {
            Err(Error::Gpu(format!(
                "attention: unsupported geometry {self:?} (need n_head_kv | n_head, even \
                 head_dim ≤ 512, n_rot a multiple of 4 and ≤ head_dim)"
            )))
        }
    }

    /// Width of the key/value rows.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// NEOX RoPE of `q` (in place) and `k` at the step's positions, then `k` and `v` stored
/// into the cache as F16 (`rope_kv.wgsl`).
pub struct RopeKv {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl RopeKv {
    /// `q`: f32, `n_head·head_dim` per token; `k`, `v`: f32, `kv_dim` per token.
    pub fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        step: &StepUniform,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        kv: &GpuKv,
    ) -> Result<RopeKv> {
        dims.check()?;
        if kv.kv_dim != dims.kv_dim() {
            return Err(Error::Gpu(format!(
                "rope_kv: cache rows of {} for kv_dim {}",
                kv.kv_dim,
                dims.kv_dim()
            )));
        }
        // The same f32 expression as backend/cpu/rope.rs.
        let theta_scale = dims.rope_base.powf(-2.0 / dims.n_rot as f32);
        let params = uniform(
            ctx,
            "rope_kv.params",
            &[
                dims.n_head as u32,
                dims.n_head_kv as u32,
                dims.head_dim as u32,
                dims.n_rot as u32,
                theta_scale.to_bits(),
                0,
                0,
                0,
            ],
        )?;
        let items = ((dims.n_head + 2 * dims.n_head_kv) * dims.head_dim / 2) as u32;
        let key = PipelineKey {
            kernel: Kernel::RopeKv,
            variant: Variant::default(),
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "rope_kv",
            &[
                (0, params.binding()),
                (1, step.buf.binding()),
                (2, q.binding()),
                (3, k.binding()),
                (4, v.binding()),
                (5, kv.k.binding()),
                (6, kv.v.binding()),
            ],
            items.div_ceil(WG),
        )?;
        Ok(RopeKv {
            dispatch,
            _params: params,
        })
    }

    /// Records the rotation and cache store of `n_tokens` tokens (the step uniform must hold
    /// the same count and their first position).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}

/// Keys per chunk of the decode split (`attention.wgsl` CHUNK).
pub const ATTN_CHUNK: u32 = 256;

/// Causal GQA attention over a [`GpuKv`] (`attention.wgsl`): flash-decoding in three
/// dispatches for one token, one workgroup per (head, token) for a batch.
pub struct Attention {
    scores: Dispatch,
    probs_pv: Dispatch,
    merge: Dispatch,
    prefill: Dispatch,
    n_head: u32,
    n_ctx: u32,
    _keep: Vec<GpuBuffer>,
}

impl Attention {
    /// `q`: rotated f32 queries, `n_head·head_dim` per token; `out`: f32, same shape. A
    /// single token rounds its probabilities to F16 when `round_p` (the reference's decode
    /// numerics); a batch keeps them in f32.
    pub fn new(
        ctx: &GpuContext,
        dims: AttnDims,
        step: &StepUniform,
        q: &GpuBuffer,
        kv: &GpuKv,
        out: &GpuBuffer,
        round_p: bool,
    ) -> Result<Attention> {
        dims.check()?;
        let max_chunks = (kv.n_ctx as u32).div_ceil(ATTN_CHUNK);
        let hq = dims.n_head * dims.head_dim;
        let scale = 1.0 / (dims.head_dim as f32).sqrt();
        let params = uniform(
            ctx,
            "attention.params",
            &[
                dims.n_head as u32,
                dims.n_head_kv as u32,
                dims.head_dim as u32,
                kv.n_ctx as u32,
                scale.to_bits(),
                max_chunks,
                0,
                0,
            ],
        )?;
        let scores =
            GpuBuffer::zeroed(ctx, "attention.scores", (dims.n_head * kv.n_ctx * 4) as u64)?;
        let stats = GpuBuffer::zeroed(
            ctx,
            "attention.stats",
            u64::from(max_chunks) * dims.n_head as u64 * 8,
        )?;
        let partial = GpuBuffer::zeroed(
            ctx,
            "attention.partial",
            u64::from(max_chunks) * hq as u64 * 4,
        )?;
        let key = |stage| PipelineKey {
            kernel: Kernel::Attention {
                stage,
                round_p: round_p && stage == AttnStage::ProbsPv,
            },
            variant: Variant::default(),
        };
        let (u, st) = (params.binding(), step.buf.binding());
        let scores_d = Dispatch::new(
            ctx,
            key(AttnStage::Scores),
            "attention.scores",
            &[
                (0, u.clone()),
                (1, st.clone()),
                (2, q.binding()),
                (3, kv.k.binding()),
                (6, scores.binding()),
                (7, stats.binding()),
            ],
            0,
        )?;
        let probs_pv = Dispatch::new(
            ctx,
            key(AttnStage::ProbsPv),
            "attention.probs_pv",
            &[
                (0, u.clone()),
                (1, st.clone()),
                (4, kv.v.binding()),
                (6, scores.binding()),
                (7, stats.binding()),
                (8, partial.binding()),
            ],
            0,
        )?;
        let merge = Dispatch::new(
            ctx,
            key(AttnStage::Merge),
            "attention.merge",
            &[
                (0, u.clone()),
                (1, st.clone()),
                (5, out.binding()),
                (8, partial.binding()),
            ],
            ((hq / 2) as u32).div_ceil(WG),
        )?;
        let prefill = Dispatch::new(
            ctx,
            key(AttnStage::Prefill),
            "attention.prefill",
            &[
                (0, u),
                (1, st),
                (2, q.binding()),
                (3, kv.k.binding()),
                (4, kv.v.binding()),
                (5, out.binding()),
            ],
            dims.n_head as u32,
        )?;
        Ok(Attention {
            scores: scores_d,
            probs_pv,
            merge,
            prefill,
            n_head: dims.n_head as u32,
            n_ctx: kv.n_ctx as u32,
            _keep: vec![params, scores, stats, partial],
        })
    }

    /// Records attention for `n_tokens` new tokens whose last one is at position
    /// `n_kv − 1` (the step uniform must hold `n_tokens` and `n_kv − n_tokens`): three
    /// dispatches for one token, one for a batch.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32, n_kv: u32) {
        debug_assert!(n_kv <= self.n_ctx && n_tokens <= n_kv);
        if n_tokens == 1 {
            let chunks = n_kv.div_ceil(ATTN_CHUNK);
            for d in [&self.scores, &self.probs_pv] {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind_group, &[]);
                pass.dispatch_workgroups(chunks, self.n_head, 1);
            }
            self.merge.record(pass, 1);
        } else {
            self.prefill.record(pass, n_tokens);
        }
    }

    /// Dispatches [`Attention::record`] issues for `n_tokens`.
    pub fn dispatches(n_tokens: u32) -> usize {
        if n_tokens == 1 {
            3
        } else {
            1
        }
    }
}

/// `gate = act(gate) · up` elementwise (`glu.wgsl`).
pub struct Glu {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl Glu {
    /// `gate` (in place) and `up`: f32, `n` per token.
    pub fn new(
        ctx: &GpuContext,
        act: GluAct,
        gate: &GpuBuffer,
        up: &GpuBuffer,
        n: usize,
    ) -> Result<Glu> {
        let params = uniform(ctx, "glu.params", &[n as u32, 0, 0, 0])?;
        let key = PipelineKey {
            kernel: Kernel::Glu { act },
            variant: Variant::default(),
        };
        let dispatch = Dispatch::new(
            ctx,
            key,
            "glu",
            &[
                (0, params.binding()),
                (1, gate.binding()),
                (2, up.binding()),
            ],
            (n as u32).div_ceil(WG),
        )?;
        Ok(Glu {
            dispatch,
            _params: params,
        })
    }

    /// Records the product over `n_tokens` rows.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}

/// `out[t][row0 + j] = W_shard[j] · x[t]` over every shard of an F16 matrix (LM head).
pub struct F16Matvec {
    dispatches: Vec<Dispatch>,
    last: bool,
    _params: Vec<GpuBuffer>,
}

impl F16Matvec {
    /// `w`: F16 rows of `k` (a multiple of 4); `x`: f32, `k` per token; `out`: f32,
    /// `w.rows` per token.
    pub fn new(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
    ) -> Result<F16Matvec> {
        Self::build(ctx, variant, tpr, w, x, out, round_x, None)
    }

    /// Like [`F16Matvec::new`] but multiplies only the last token row of the step (row
    /// `n_tokens − 1` of `x`, read from `step`) into row 0 of `out`.
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn last_row(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
        step: &StepUniform,
    ) -> Result<F16Matvec> {
        Self::build(ctx, variant, tpr, w, x, out, round_x, Some(step))
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        ctx: &GpuContext,
        variant: Variant,
        tpr: u32,
        w: &Sharded,
        x: &GpuBuffer,
        out: &GpuBuffer,
        round_x: bool,
        step: Option<&StepUniform>,
    ) -> Result<F16Matvec> {
        check_tpr(tpr)?;
        let k = (w.row_bytes / 2) as u32;
        if !k.is_multiple_of(4) {
            return Err(Error::Gpu(format!(
                "f16 matvec: row width {k} is not a multiple of 4"
            )));
        }
        let last = step.is_some();
        let key = PipelineKey {
            kernel: Kernel::F16Matvec { tpr, round_x, last },
            variant,
        };
        let mut dispatches = Vec::new();
        let mut params = Vec::new();
        for (i, shard) in w.shards.iter().enumerate() {
            let (r0, rows) = w.shard_rows(i);
            let u = uniform(
                ctx,
                "f16_matvec.params",
                &[rows as u32, k, r0 as u32, w.rows as u32],
            )?;
            let mut bindings = vec![
                (0, u.binding()),
                (1, shard.binding()),
                (2, x.binding()),
                (3, out.binding()),
            ];
            if let Some(s) = step {
                bindings.push((4, s.buf.binding()));
            }
            dispatches.push(Dispatch::new(
                ctx,
                key,
                "f16_matvec",
                &bindings,
                (rows as u32).div_ceil(WG / tpr),
            )?);
            params.push(u);
        }
        Ok(F16Matvec {
            dispatches,
            last,
            _params: params,
        })
    }

    /// Records every shard's dispatch for `n_tokens` tokens (one row when built with
    /// [`F16Matvec::last_row`]).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let rows = if self.last { 1 } else { n_tokens };
        for d in &self.dispatches {
            d.record(pass, rows);
        }
    }

    /// Dispatches per record (one per shard).
    pub fn dispatch_count(&self) -> usize {
        self.dispatches.len()
    }
}

/// Elements per workgroup in the first top-k pass.
pub const SELECT_CHUNK: u32 = 4096;
/// Largest k of [`TopK`].
pub const MAX_TOPK: u32 = 64;

/// Top-k (k ≤ 64) of one f32 vector, best first, ties to the lower index; k = 1 is argmax.
/// Only the k (value, id) pairs need to come back to the host.
pub struct TopK {
    partial: Dispatch,
    merge: Dispatch,
    /// k best values.
    pub vals: GpuBuffer,
    /// Their ids.
    pub ids: GpuBuffer,
    staging: GpuBuffer,
    k: u32,
    _keep: Vec<GpuBuffer>,
}

impl TopK {
    /// Selects from the first `n` values of `logits`.
    pub fn new(ctx: &GpuContext, logits: &GpuBuffer, n: u32, k: u32) -> Result<TopK> {
        if k == 0 || k > MAX_TOPK || n == 0 {
            return Err(Error::Gpu(format!(
                "top-k: need 1 ≤ k ≤ {MAX_TOPK} and n ≥ 1, got k = {k}, n = {n}"
            )));
        }
        let chunks = n.div_ceil(SELECT_CHUNK);
        let cand = (chunks * k) as u64;
        let cand_v = GpuBuffer::zeroed(ctx, "topk.cand_vals", cand * 4)?;
        let cand_i = GpuBuffer::zeroed(ctx, "topk.cand_ids", cand * 4)?;
        let vals = GpuBuffer::zeroed(ctx, "topk.vals", u64::from(k) * 4)?;
        let ids = GpuBuffer::zeroed(ctx, "topk.ids", u64::from(k) * 4)?;
        let dummy = GpuBuffer::zeroed(ctx, "topk.unused", 4)?;
        let staging = GpuBuffer::with_usage(
            ctx,
            "topk.staging",
            u64::from(k) * 8,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let p1 = uniform(ctx, "topk.params1", &[n, SELECT_CHUNK])?;
        let p2 = uniform(ctx, "topk.params2", &[cand as u32, 0])?;
        let key = |partial| PipelineKey {
            kernel: Kernel::Select { k, partial },
            variant: Variant::default(),
        };
        let partial = Dispatch::new(
            ctx,
            key(true),
            "topk.partial",
            &[
                (0, p1.binding()),
                (1, logits.binding()),
                (2, cand_v.binding()),
                (3, cand_i.binding()),
                (4, dummy.binding()),
            ],
            chunks,
        )?;
        let merge = Dispatch::new(
            ctx,
            key(false),
            "topk.merge",
            &[
                (0, p2.binding()),
                (1, cand_v.binding()),
                (2, vals.binding()),
                (3, ids.binding()),
                (4, cand_i.binding()),
            ],
            1,
        )?;
        Ok(TopK {
            partial,
            merge,
            vals,
            ids,
            staging,
            k,
            _keep: vec![cand_v, cand_i, dummy, p1, p2],
        })
    }

    /// Records both passes.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.partial.record(pass, 1);
        self.merge.record(pass, 1);
    }

    /// Records the copy of the result into the host-visible staging buffer (after the pass).
    pub fn record_download(&self, enc: &mut wgpu::CommandEncoder) {
        let bytes = u64::from(self.k) * 4;
        enc.copy_buffer_to_buffer(&self.vals.buf, 0, &self.staging.buf, 0, bytes);
        enc.copy_buffer_to_buffer(&self.ids.buf, 0, &self.staging.buf, bytes, bytes);
    }

    /// Maps the staging buffer (after the submit of [`TopK::record_download`]) and returns
    /// the k (id, value) pairs, best first; missing candidates are `(u32::MAX, -inf)`.
    pub fn read(&self, ctx: &GpuContext) -> Result<Vec<(u32, f32)>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.staging
            .buf
            .map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
        ctx.wait()?;
        rx.recv()
            .map_err(|_| Error::Gpu("top-k: map callback dropped".into()))?
            .map_err(|e| Error::Gpu(format!("top-k: map failed: {e}")))?;
        let k = self.k as usize;
        let out = {
            let view = self
                .staging
                .buf
                .get_mapped_range(..)
                .map_err(|e| Error::Gpu(format!("top-k: {e}")))?;
            let words: &[u32] = bytemuck::cast_slice(&view[..k * 8]);
            (0..k)
                .map(|i| (words[k + i], f32::from_bits(words[i])))
                .collect()
        };
        self.staging.buf.unmap();
        Ok(out)
    }
}
