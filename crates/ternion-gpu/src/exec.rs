//! A model resident on the GPU: the compiled [`Plan`](super::plan) of its graph, its paged
//! KV caches, and the step loop — ONE compute pass and ONE submit per step.
//!
//! # A step
//! Write the token ids, each token's (position, sequence slot), the page tables that
//! changed and the step uniform, record every launch of the plan into one compute pass,
//! copy the result (logits, or the top-k / argmax pairs) to a persistent staging buffer,
//! submit once, map. Nothing is created after load: the counter test checks it over 100
//! decode steps.
//!
//! # Sequences
//! The model's own sequence serves the single-sequence API ([`GpuModel::forward`],
//! [`GpuModel::argmax_step`], ...). With [`GpuModelOptions::max_seqs`] > 1 more sequences
//! can be opened ([`GpuModel::new_seq`]) and stepped together
//! ([`GpuModel::forward_seqs`]): every weight is read once for all of them.
//!
//! Read-backs are `async` (a browser delivers map callbacks from its event loop); the
//! blocking methods wrap them for native callers.

use std::sync::Arc;

use super::buffers::GpuBuffer;
use super::context::GpuContext;
use super::greedy::CHAIN;
use super::ops::{KvIndex, TopK, DECODE_ROW};
use super::plan::{KvSizes, Numerics, Plan, PlanOpts, Rows};
use super::profile::Profiler;
use super::seqs::{lock, GpuSeq, GpuSeqStep, KvTable};
use super::upload::{GpuUpload, GpuWeight};
use crate::generate::{check_step, StepLimits};
use crate::kv::{KvType, PAGE_POSITIONS};
use crate::model::graph::Graph;
use crate::model::{Config, LmHead, Logits, Model};
use crate::{Error, Result};

/// Sizes fixed at load.
#[derive(Clone, Copy, Debug)]
pub struct GpuModelOptions {
    /// Most positions of one sequence.
    pub n_ctx: usize,
    /// Sequences [`GpuModel::new_seq`] can have open at once, besides the model's own.
    pub max_seqs: usize,
    /// KV pages (of [`PAGE_POSITIONS`] positions) shared by all sequences; `None`: room
    /// for `max_seqs + 1` full contexts.
    pub kv_pages: Option<usize>,
    /// Largest batch of tokens one step runs (activation buffers are sized for it);
    /// longer inputs are split into steps of this size.
    pub max_batch: usize,
    /// k of [`GpuModel::topk_step`].
    pub top_k: u32,
    /// Write a timestamp after every launch and keep per-kernel totals
    /// ([`GpuModel::profile`]); needs timestamp queries inside passes.
    pub profile: bool,
    /// Fast kernels (the default) or the CPU reference's arithmetic bit for bit.
    pub numerics: Numerics,
    /// Element type of the KV caches ([`GpuModel::from_model`] takes the model's).
    pub kv_type: KvType,
    /// The LM head as stored, or requantized to Q8_0 / Q6_K at upload (the CPU's bytes for
    /// the same choice; [`GpuModel::from_model`] takes the model's).
    pub lm_head: LmHead,
}

impl Default for GpuModelOptions {
    fn default() -> Self {
        GpuModelOptions {
            n_ctx: 4096,
            max_seqs: 0,
            kv_pages: None,
            max_batch: 256,
            top_k: 40,
            profile: false,
            numerics: Numerics::Fast,
            kv_type: KvType::F16,
            lm_head: LmHead::AsStored,
        }
    }
}

/// What a step hands back.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Out {
    /// Logits rows: all tokens', or the last token's only.
    Logits(Logits),
    /// Argmax of the (single) logits row.
    Argmax,
    /// Top-k of the (single) logits row.
    TopK,
    /// The last row of every sequence of a multi-sequence step.
    Picked,
    /// The top-k of the last row of every sequence of a multi-sequence step.
    PickedTopK,
    /// Nothing: the step only extends the KV cache (the LM head is not run).
    Cache,
    /// Every row of the final hidden state (no LM head; hidden.rs).
    Hidden,
    /// Greedy chaining (greedy.rs): the argmax id goes to the next step's token buffer
    /// and to word `at` of chain staging buffer `buf`; with `from_gpu` this step's token
    /// is the one the previous step left there (the host writes none).
    Chained {
        /// Staging buffer (0 or 1).
        buf: usize,
        /// Word in it.
        at: u64,
        /// The token comes from the previous step.
        from_gpu: bool,
    },
}

/// A model resident on the GPU with its KV cache.
pub struct GpuModel {
    pub(super) ctx: Arc<GpuContext>,
    cfg: Config,
    opts: GpuModelOptions,
    pub(super) plan: Plan,
    argmax: TopK,
    pub(super) topk: TopK,
    pub(super) staging: GpuBuffer,
    pub(super) profiler: Option<Profiler>,
    /// Slots and pages of the KV caches.
    table: Arc<std::sync::Mutex<KvTable>>,
    /// The sequence of the single-sequence API.
    main: GpuSeq,
    /// Scratch for the per-token (position, slot) pairs of a step.
    toks: Vec<[u32; 2]>,
    /// Scratch for the step's token ids.
    ids: Vec<u32>,
    /// The two staging buffers of chained greedy steps (greedy.rs), `CHAIN` ids each.
    pub(super) chain: [GpuBuffer; 2],
    /// Scratch for the query blocks of a step (`KvIndex::write_blocks`).
    blocks: Vec<[u32; 2]>,
}

impl GpuModel {
    /// Uploads a loaded [`Model`] (every tensor its graph reads, from its file) and
    /// compiles the plan, with the model's KV cache type ([`Model::kv_type`], in place of
    /// `opts.kv_type`). [`GpuUpload`] does the same one tensor at a time.
    pub fn from_model(
        ctx: Arc<GpuContext>,
        model: &Model,
        opts: GpuModelOptions,
    ) -> Result<GpuModel> {
        let opts = GpuModelOptions {
            kv_type: model.kv_type(),
            lm_head: model.lm_head(),
            ..opts
        };
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
            return Err(Error::Request(format!(
                "GPU plan: max_batch and n_ctx must be ≥ 1, got {} and {}",
                opts.max_batch, opts.n_ctx
            )));
        }
        let slots = opts.max_seqs.saturating_add(1);
        let g = &*ctx;
        let pages = opts
            .kv_pages
            .unwrap_or_else(|| opts.n_ctx.div_ceil(PAGE_POSITIONS).saturating_mul(slots));
        let kv = KvSizes {
            pages,
            slots,
            ty: opts.kv_type,
        };
        let plan = Plan::compile(
            g,
            graph,
            weights,
            &PlanOpts {
                max_batch: opts.max_batch,
                n_ctx: opts.n_ctx,
                n_vocab: cfg.n_vocab,
                kv,
                numerics: opts.numerics,
            },
        )?;
        let table = KvTable::new(slots, pages, opts.n_ctx);
        let main = KvTable::open(&table)?;
        let staging = GpuBuffer::with_usage(
            g,
            "logits.staging",
            plan.logits.size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let argmax = TopK::new(g, &plan.logits, cfg.n_vocab as u32, 1)?;
        let topk_rows = (opts.max_seqs + 1).min(plan.logits_rows) as u32;
        let topk = TopK::rows(g, &plan.logits, cfg.n_vocab as u32, opts.top_k, topk_rows)?;
        let profiler = if opts.profile {
            Some(Profiler::new(g, &plan)?)
        } else {
            None
        };
        let chain_buf = || {
            GpuBuffer::with_usage(
                g,
                "greedy.chain",
                CHAIN as u64 * 4,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            )
        };
        let chain = [chain_buf()?, chain_buf()?];
        Ok(GpuModel {
            ctx,
            cfg,
            opts,
            plan,
            argmax,
            topk,
            staging,
            profiler,
            table,
            main,
            chain,
            blocks: Vec::with_capacity(
                (KvIndex::max_blocks(opts.max_batch, slots) + 1).max(opts.max_batch),
            ),
            toks: Vec::with_capacity(opts.max_batch),
            ids: Vec::with_capacity(opts.max_batch),
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

    /// Most positions of one sequence.
    pub fn n_ctx(&self) -> usize {
        self.opts.n_ctx
    }

    /// Positions filled in the model's own sequence.
    pub fn pos(&self) -> usize {
        self.main.len()
    }

    /// Forgets every position of the model's own sequence after the first `len` (0 starts
    /// a new sequence).
    pub fn truncate(&mut self, len: usize) {
        self.main.truncate(len);
    }

    /// The KV slot of the model's own sequence.
    pub(super) fn main_slot(&self) -> u32 {
        self.main.slot()
    }

    /// Opens another sequence (one of [`GpuModelOptions::max_seqs`]).
    pub fn new_seq(&self) -> Result<GpuSeq> {
        KvTable::open(&self.table)
    }

    /// KV pages held by open sequences, and the pages there are.
    pub fn kv_pages(&self) -> (usize, usize) {
        let t = lock(&self.table);
        (t.pages_in_use(), t.capacity())
    }

    /// Pairs [`GpuModel::topk_step`] returns.
    pub fn top_k(&self) -> usize {
        self.opts.top_k as usize
    }

    /// Most tokens one step runs.
    pub fn max_batch(&self) -> usize {
        self.opts.max_batch
    }

    /// Dispatches recorded for one decode step ending in the GPU argmax
    /// ([`GpuModel::argmax_step`]).
    pub fn dispatches_per_token(&self) -> usize {
        self.plan.dispatches(1) + 2
    }

    /// Records and submits one step: the tokens of each `(slot, tokens)` part at the
    /// positions after those its sequence caches (≤ max_batch tokens in all), with the
    /// result selected by `out` copied to staging; advances the sequences. Returns the
    /// submission that copies the result.
    pub(super) fn step(
        &mut self,
        parts: &[(u32, &[u32])],
        out: Out,
    ) -> Result<wgpu::SubmissionIndex> {
        let n: usize = parts.iter().map(|p| p.1.len()).sum();
        if n == 0 || n > self.opts.max_batch || parts.iter().any(|p| p.1.is_empty()) {
            return Err(Error::Request(format!(
                "GPU step of {n} tokens (1..={} allowed, at least one per sequence)",
                self.opts.max_batch
            )));
        }
        let picked = matches!(out, Out::Picked | Out::PickedTopK);
        let max_picked = match out {
            Out::PickedTopK => self.plan.logits_rows.min(self.opts.max_seqs + 1),
            _ => self.plan.logits_rows,
        };
        if picked && parts.len() > max_picked {
            return Err(Error::Request(format!(
                "GPU step of {} sequences: at most {max_picked} logits rows per step",
                parts.len(),
            )));
        }
        let g = &*self.ctx;
        self.toks.clear();
        self.ids.clear();
        let copies;
        {
            let mut table = lock(&self.table);
            for (i, &(slot, tokens)) in parts.iter().enumerate() {
                if parts[..i].iter().any(|p| p.0 == slot) {
                    return Err(Error::Request(format!(
                        "sequence slot {slot} appears twice in one step"
                    )));
                }
                let len = table.len(slot);
                let limits = StepLimits {
                    n_vocab: Some(self.cfg.n_vocab),
                    n_ctx: self.opts.n_ctx,
                    max_pos: self.plan.max_pos,
                };
                check_step(len, tokens, &limits)?;
                self.ids.extend_from_slice(tokens);
                // The one token of a sequence beside others keeps the decode numerics.
                let flag = if parts.len() > 1 && tokens.len() == 1 {
                    DECODE_ROW
                } else {
                    0
                };
                self.toks
                    .extend((len..len + tokens.len()).map(|p| [p as u32, slot | flag]));
            }
            table.reserve(parts)?;
            copies = table.take_copies();
            let idx = &self.plan.index;
            for &(slot, _) in parts {
                if let Some(pages) = table.take_dirty(slot) {
                    let at = u64::from(slot) * idx.pps as u64 * 4;
                    idx.pages.write(g, at, bytemuck::cast_slice(pages));
                }
            }
        }
        let nt = n as u32;
        if !matches!(out, Out::Chained { from_gpu: true, .. }) {
            self.plan.ids.write(g, 0, bytemuck::cast_slice(&self.ids));
        }
        // `blocks` is scratch until the blocks are written.
        let idx = &self.plan.index;
        idx.write_toks(g, &self.toks, &mut self.blocks);
        self.plan.step.write(g, nt, self.toks[0][0]);
        if n > 1 {
            let lens = parts.iter().map(|p| p.1.len());
            self.plan.index.write_blocks(g, lens, &mut self.blocks);
        }
        // The longest context of the step's tokens (the last token of some sequence).
        let n_kv = self.toks.iter().map(|t| t[0] + 1).max().unwrap_or(1);
        let rows = match out {
            Out::Logits(w) => Rows::of(n, w),
            Out::Cache => Rows::Skip,
            Out::Hidden => Rows::Hidden,
            Out::Argmax | Out::TopK | Out::Chained { .. } => Rows::of(n, Logits::Last),
            Out::Picked | Out::PickedTopK => {
                // Each sequence's last row; the one token of a sequence keeps the decode
                // numerics in the head too. (`ids` is written: its scratch is free again.)
                let mut end = 0u32;
                self.ids.clear();
                self.ids.extend(parts.iter().map(|p| {
                    end += p.1.len() as u32;
                    let flag = if p.1.len() == 1 { DECODE_ROW } else { 0 };
                    (end - 1) | flag
                }));
                self.plan.picks.write(g, 0, bytemuck::cast_slice(&self.ids));
                self.plan.pick_step.write(g, parts.len() as u32, 0);
                Rows::Picked {
                    rows: parts.len() as u32,
                    decode: parts.iter().all(|p| p.1.len() == 1),
                }
            }
        };
        if let Some(p) = &mut self.profiler {
            p.last_tokens = nt;
        }
        let mut enc = g.encoder();
        self.plan.copy_kv_pages(&mut enc, &copies);
        // A hidden step records part of the launches: it is not profiled.
        let queries = match out {
            Out::Hidden => None,
            _ => self.profiler.as_ref().map(|p| &p.queries),
        };
        let total = self.plan.launches_of(rows);
        let mut start = 0;
        for end in submit_ends(nt, matches!(out, Out::Chained { .. }), total) {
            if start > 0 {
                g.submit(std::mem::replace(&mut enc, g.encoder()));
            }
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            self.plan
                .record(&mut pass, start..end, (nt, n_kv, rows), queries);
            start = end;
        }
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            match out {
                Out::Argmax | Out::Chained { .. } => self.argmax.record(&mut pass),
                Out::TopK => self.topk.record(&mut pass),
                Out::PickedTopK => self.topk.record_rows(&mut pass, parts.len() as u32),
                Out::Logits(_) | Out::Cache | Out::Picked | Out::Hidden => {}
            }
        }
        let logit_rows = match out {
            Out::Argmax => {
                self.argmax.record_download(&mut enc);
                0
            }
            Out::Chained { buf, at, .. } => {
                let id = &self.argmax.ids.buf;
                enc.copy_buffer_to_buffer(id, 0, &self.plan.ids.buf, 0, 4);
                enc.copy_buffer_to_buffer(id, 0, &self.chain[buf].buf, at * 4, 4);
                0
            }
            Out::TopK => {
                self.topk.record_download(&mut enc);
                0
            }
            Out::PickedTopK => {
                self.topk.record_download_rows(&mut enc, parts.len() as u32);
                0
            }
            Out::Logits(Logits::All) => n,
            Out::Logits(Logits::Last) => 1,
            Out::Picked => parts.len(),
            Out::Cache | Out::Hidden => 0,
        };
        if logit_rows > 0 {
            let bytes = (logit_rows * self.cfg.n_vocab * 4) as u64;
            enc.copy_buffer_to_buffer(&self.plan.logits.buf, 0, &self.staging.buf, 0, bytes);
        }
        if let (Out::Hidden, Some(h)) = (out, &self.plan.hidden) {
            let bytes = (n * h.width * 4) as u64;
            enc.copy_buffer_to_buffer(&h.buf.buf, 0, &self.staging.buf, 0, bytes);
        }
        if let Some(p) = self.profiler.as_ref().filter(|_| out != Out::Hidden) {
            p.record_resolve(&mut enc);
        }
        let submitted = g.submit(enc);
        let mut table = lock(&self.table);
        for &(slot, tokens) in parts {
            table.advance(slot, tokens.len());
        }
        Ok(submitted)
    }

    /// Maps `rows` logits rows of the staging buffer onto the end of `out`.
    async fn read_logits(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        let size = (rows * self.cfg.n_vocab * 4) as u64;
        self.ctx
            .map_read_with(&self.staging.buf, size, |b| {
                out.extend_from_slice(bytemuck::cast_slice(b))
            })
            .await
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
        self.whole_input(tokens.len(), chunk)?;
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
            self.step(&[(self.main.slot(), part)], out_kind)?;
            if which == Logits::All || last {
                let rows = if which == Logits::All { part.len() } else { 1 };
                self.read_logits(rows, &mut out).await?;
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
        self.step(
            &[(self.main.slot(), std::slice::from_ref(&token))],
            Out::Argmax,
        )?;
        let best = self.argmax.read_async(&self.ctx).await?[0].0;
        self.collect_profile().await?;
        Ok(best)
    }

    /// Decodes one token and returns the `top_k` best (id, logit) pairs, best first.
    pub async fn topk_step_async(&mut self, token: u32) -> Result<Vec<(u32, f32)>> {
        self.topk_step_masked_async(token, None).await
    }

    /// Runs one step over several sequences — each `steps[i].tokens` at the positions after
    /// those `steps[i].seq` caches, at most [`GpuModel::max_batch`] tokens in all, every
    /// sequence at most once — and returns the logits of each sequence's last token, one
    /// row of `n_vocab` per step in order. Several tokens use the batch numerics, one token
    /// alone the decode numerics (as [`GpuModel::forward`]). When the KV pages run out the
    /// error is [`Error::KvPoolExhausted`] and no sequence has changed.
    pub async fn forward_seqs_async(&mut self, steps: &[GpuSeqStep<'_>]) -> Result<Vec<f32>> {
        let parts = self.parts(steps)?;
        let out = if parts.len() == 1 {
            Out::Logits(Logits::Last)
        } else {
            Out::Picked
        };
        self.step(&parts, out)?;
        let mut logits = Vec::with_capacity(parts.len() * self.cfg.n_vocab);
        self.read_logits(parts.len(), &mut logits).await?;
        self.collect_profile().await?;
        Ok(logits)
    }

    /// Like [`GpuModel::forward_seqs_async`] but only the [`GpuModelOptions::top_k`] best
    /// (id, logit) pairs of each sequence's last row come back (best first, ties to the
    /// lower id): k pairs instead of a vocabulary of floats per sequence.
    pub async fn forward_seqs_topk_async(
        &mut self,
        steps: &[GpuSeqStep<'_>],
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        self.forward_seqs_topk_masked_async(steps, &[]).await
    }

    /// Blocking [`GpuModel::forward_seqs_topk_async`].
    pub fn forward_seqs_topk(&mut self, steps: &[GpuSeqStep<'_>]) -> Result<Vec<Vec<(u32, f32)>>> {
        pollster::block_on(self.forward_seqs_topk_async(steps))
    }

    /// The `(slot, tokens)` parts of `steps`, checked to be this model's sequences.
    pub(super) fn parts<'a>(&self, steps: &[GpuSeqStep<'a>]) -> Result<Vec<(u32, &'a [u32])>> {
        if let Some(s) = steps.iter().find(|s| !s.seq.belongs_to(&self.table)) {
            return Err(Error::Request(format!(
                "{:?} was opened on another model",
                s.seq
            )));
        }
        Ok(steps.iter().map(|s| (s.seq.slot(), s.tokens)).collect())
    }

    /// Blocking [`GpuModel::forward_seqs_async`].
    pub fn forward_seqs(&mut self, steps: &[GpuSeqStep<'_>]) -> Result<Vec<f32>> {
        pollster::block_on(self.forward_seqs_async(steps))
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

/// Launches in the first submission of a step recorded in parts; each later one holds
/// [`SUBMIT_GROWTH`] times as many (8, 32, 128, the rest).
const FIRST_SUBMIT: usize = 8;
/// How much larger each submission of a step recorded in parts is than the one before.
const SUBMIT_GROWTH: usize = 4;

/// Where the submissions of a step of `n_tokens` end (launch indices; the last is `total`).
/// Recording a launch costs the CPU a few µs (wgpu's tracking and barriers), so a step
/// recorded whole kept the GPU idle until it was all recorded (about a millisecond for a
/// 512-token prompt, 0.7 ms for a decode token): its launches go in growing parts instead,
/// the GPU running each while the next is recorded (H100: pp512 23.3k → 25.0k, 32
/// sequences decoded together 4.7–5.1k → 6.2k tok/s; BENCHMARKS.md, session 21). A
/// single-token step of a greedy chain (`chained`) is one submission: the chain records it
/// while the steps before it run.
pub(crate) fn submit_ends(
    n_tokens: u32,
    chained: bool,
    total: usize,
) -> impl Iterator<Item = usize> {
    let parted = n_tokens > 1 || !chained;
    std::iter::successors(Some(FIRST_SUBMIT), |e| Some(e * SUBMIT_GROWTH))
        .take_while(move |&e| parted && e < total)
        .chain(std::iter::once(total))
}
