//! A model resident on the GPU: the compiled [`Plan`](super::plan) of its graph, its KV
//! cache, and the step loop — ONE compute pass and ONE submit per step.
//!
//! # A step
//! Write the token ids and the step uniform (n_tokens, pos), record every launch of the
//! plan into one compute pass, copy the result (logits, or the top-k / argmax pairs) to a
//! persistent staging buffer, submit once, map. Nothing is created after load: the counter
//! test checks it over 100 decode steps.
//!
//! Read-backs are `async` (a browser delivers map callbacks from its event loop); the
//! blocking methods wrap them for native callers.

use std::sync::Arc;

use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::ops::TopK;
use super::plan::{Plan, Rows};
use super::upload::{GpuUpload, GpuWeight};
use crate::model::graph::Graph;
use crate::model::{Config, Logits, Model};
use crate::{Error, Result};

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
    /// Write a timestamp after every launch and keep per-kernel totals
    /// ([`GpuModel::profile`]); needs timestamp queries inside passes.
    pub profile: bool,
}

impl Default for GpuModelOptions {
    fn default() -> Self {
        GpuModelOptions {
            n_ctx: 4096,
            max_batch: 64,
            top_k: 40,
            profile: false,
        }
    }
}

/// Time spent in one kind of launch over the profiled steps.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// Launch label (`ternary`, `rmsnorm`, `attention`, ...).
    pub label: &'static str,
    /// Launches timed.
    pub count: u64,
    /// Total GPU time in nanoseconds.
    pub total_ns: f64,
}

/// Timestamp queries of the profiled steps.
struct Profiler {
    queries: wgpu::QuerySet,
    resolve: GpuBuffer,
    staging: GpuBuffer,
    n: u32,
    period_ns: f64,
    totals: Vec<KernelTime>,
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
    /// Nothing: the step only extends the KV cache (the LM head is not run).
    Cache,
}

/// A model resident on the GPU with its KV cache.
pub struct GpuModel {
    ctx: Arc<GpuContext>,
    cfg: Config,
    opts: GpuModelOptions,
    plan: Plan,
    argmax: TopK,
    topk: TopK,
    staging: GpuBuffer,
    profiler: Option<Profiler>,
    /// Positions filled in the KV cache.
    pos: usize,
}

impl GpuModel {
    /// Uploads a loaded [`Model`] (every tensor its graph reads, from its file) and
    /// compiles the plan. [`GpuUpload`] does the same one tensor at a time.
    pub fn from_model(
        ctx: Arc<GpuContext>,
        model: &Model,
        opts: GpuModelOptions,
    ) -> Result<GpuModel> {
        GpuUpload::from_file(ctx, model.file(), opts)
    }

    /// Compiles `graph` over uploaded weights (called by [`GpuUpload::finish`]).
    pub(crate) fn compile(
        ctx: Arc<GpuContext>,
        cfg: Config,
        graph: &Graph,
        weights: Vec<GpuWeight>,
        opts: GpuModelOptions,
    ) -> Result<GpuModel> {
        if opts.max_batch == 0 || opts.n_ctx == 0 {
            return Err(Error::Gpu(
                "GPU plan: max_batch and n_ctx must be ≥ 1".into(),
            ));
        }
        let g = &*ctx;
        let plan = Plan::compile(g, graph, weights, opts.max_batch, opts.n_ctx, cfg.n_vocab)?;
        let staging = GpuBuffer::with_usage(
            g,
            "logits.staging",
            plan.logits.size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let argmax = TopK::new(g, &plan.logits, cfg.n_vocab as u32, 1)?;
        let topk = TopK::new(g, &plan.logits, cfg.n_vocab as u32, opts.top_k)?;
        let profiler = if opts.profile {
            Some(Profiler::new(g, &plan)?)
        } else {
            None
        };
        Ok(GpuModel {
            ctx,
            cfg,
            opts,
            plan,
            argmax,
            topk,
            staging,
            profiler,
            pos: 0,
        })
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
        self.plan.dispatches(1) + 2
    }

    /// GPU time per kind of launch, summed over the steps run since load (`None` unless built
    /// with [`GpuModelOptions::profile`]).
    pub fn profile(&self) -> Option<Vec<KernelTime>> {
        let p = self.profiler.as_ref()?;
        let mut by_label: Vec<KernelTime> = Vec::new();
        for t in &p.totals {
            match by_label.iter_mut().find(|k| k.label == t.label) {
                Some(k) => {
                    k.count += t.count;
                    k.total_ns += t.total_ns;
                }
                None => by_label.push(t.clone()),
            }
        }
        Some(by_label)
    }

    /// Clears the profile totals (e.g. after warm-up and prefill, to time decode alone).
    pub fn reset_profile(&mut self) {
        if let Some(p) = &mut self.profiler {
            for t in &mut p.totals {
                t.count = 0;
                t.total_ns = 0.0;
            }
        }
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
        if let Some(max) = self.plan.max_pos.filter(|&m| self.pos + n > m) {
            return Err(Error::Request(format!(
                "position {} is past the model's {max} learned positions",
                self.pos + n - 1
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
        self.plan.ids.write(g, 0, bytemuck::cast_slice(tokens));
        self.plan.step.write(g, nt, self.pos as u32);
        let n_kv = (self.pos + n) as u32;
        let rows = match out {
            Out::Logits(w) => Rows::of(n, w),
            Out::Cache => Rows::Skip,
            Out::Argmax | Out::TopK => Rows::of(n, Logits::Last),
        };
        let mut enc = g.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            let queries = self.profiler.as_ref().map(|p| &p.queries);
            self.plan.record(&mut pass, nt, n_kv, rows, queries);
            match out {
                Out::Argmax => self.argmax.record(&mut pass),
                Out::TopK => self.topk.record(&mut pass),
                Out::Logits(_) | Out::Cache => {}
            }
        }
        match out {
            Out::Argmax => self.argmax.record_download(&mut enc),
            Out::TopK => self.topk.record_download(&mut enc),
            Out::Logits(w) => {
                let rows = if w == Logits::All { n } else { 1 };
                let bytes = (rows * self.cfg.n_vocab * 4) as u64;
                enc.copy_buffer_to_buffer(&self.plan.logits.buf, 0, &self.staging.buf, 0, bytes);
            }
            Out::Cache => {}
        }
        if let Some(p) = &self.profiler {
            p.record_resolve(&mut enc);
        }
        g.submit(enc);
        self.pos += n;
        Ok(())
    }

    /// Adds the last step's timestamps to the profile.
    async fn collect_profile(&mut self) -> Result<()> {
        if let Some(p) = &mut self.profiler {
            let bytes = self
                .ctx
                .map_read(&p.staging.buf, u64::from(p.n) * 8)
                .await?;
            let ticks: &[u64] = bytemuck::cast_slice(&bytes);
            for (i, w) in ticks.windows(2).enumerate() {
                let t = &mut p.totals[i];
                t.count += 1;
                t.total_ns += w[1].saturating_sub(w[0]) as f64 * p.period_ns;
            }
        }
        Ok(())
    }

    /// Runs `tokens` at the positions after those already cached (in steps of at most
    /// `max_batch`, or fewer when every row's logits are wanted) and returns the logits:
    /// one row per token for [`Logits::All`], the last token's for [`Logits::Last`].
    /// One token uses the reference's decode numerics, a batch its batch numerics.
    pub async fn forward_async(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Request("no tokens to evaluate".into()));
        }
        let chunk = match which {
            Logits::All => self.opts.max_batch.min(self.plan.logits_rows),
            Logits::Last => self.opts.max_batch,
        };
        let mut out = Vec::new();
        let n_chunks = tokens.len().div_ceil(chunk);
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let last = i + 1 == n_chunks;
            // Earlier chunks of a Last request only fill the cache: no LM head, no copy.
            let out_kind = if which == Logits::All || last {
                Out::Logits(which)
            } else {
                Out::Cache
            };
            self.step(part, out_kind)?;
            if which == Logits::All || last {
                let rows = if which == Logits::All { part.len() } else { 1 };
                let size = (rows * self.cfg.n_vocab * 4) as u64;
                let dst = &mut out;
                self.ctx
                    .map_read_with(&self.staging.buf, size, |b| {
                        dst.extend_from_slice(bytemuck::cast_slice(b))
                    })
                    .await?;
            } else {
                self.ctx.check()?;
            }
            self.collect_profile().await?;
        }
        Ok(out)
    }

    /// Decodes one token and returns the argmax of its logits (ties → lowest id); only
    /// the id and its logit come back from the GPU.
    pub async fn argmax_step_async(&mut self, token: u32) -> Result<u32> {
        self.step(&[token], Out::Argmax)?;
        let best = self.argmax.read_async(&self.ctx).await?[0].0;
        self.collect_profile().await?;
        Ok(best)
    }

    /// Decodes one token and returns the `top_k` best (id, logit) pairs, best first.
    pub async fn topk_step_async(&mut self, token: u32) -> Result<Vec<(u32, f32)>> {
        self.step(&[token], Out::TopK)?;
        let best = self.topk.read_async(&self.ctx).await?;
        self.collect_profile().await?;
        Ok(best)
    }

    /// Blocking [`GpuModel::forward_async`].
    pub fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        pollster::block_on(self.forward_async(tokens, which))
    }

    /// Blocking [`GpuModel::argmax_step_async`].
    pub fn argmax_step(&mut self, token: u32) -> Result<u32> {
        pollster::block_on(self.argmax_step_async(token))
    }

    /// Blocking [`GpuModel::topk_step_async`].
    pub fn topk_step(&mut self, token: u32) -> Result<Vec<(u32, f32)>> {
        pollster::block_on(self.topk_step_async(token))
    }
}

impl Profiler {
    fn new(ctx: &GpuContext, plan: &Plan) -> Result<Profiler> {
        if !ctx
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
        {
            return Err(Error::Gpu(format!(
                "{}: profiling needs timestamp queries inside compute passes, which this \
                 adapter does not offer",
                ctx.caps().name
            )));
        }
        let n = plan.len() as u32 + 1;
        let queries = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: n,
        });
        let bytes = u64::from(n) * 8;
        let resolve = GpuBuffer::with_usage(
            ctx,
            "profile.resolve",
            bytes,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let staging = GpuBuffer::with_usage(
            ctx,
            "profile.staging",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let totals = (0..plan.len())
            .map(|i| KernelTime {
                label: plan.label(i),
                count: 0,
                total_ns: 0.0,
            })
            .collect();
        Ok(Profiler {
            queries,
            resolve,
            staging,
            n,
            period_ns: f64::from(ctx.queue.get_timestamp_period()),
            totals,
        })
    }

    fn record_resolve(&self, enc: &mut wgpu::CommandEncoder) {
        enc.resolve_query_set(&self.queries, 0..self.n, &self.resolve.buf, 0);
        let bytes = u64::from(self.n) * 8;
        enc.copy_buffer_to_buffer(&self.resolve.buf, 0, &self.staging.buf, 0, bytes);
    }
}
