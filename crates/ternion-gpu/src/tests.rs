//! Every kernel against the CPU reference, on random inputs of odd sizes (run on lavapipe
//! in CI). Without an adapter these tests fail, unless `TERNION_SKIP_GPU_TESTS=1`.
//!
//! The kernels the browser also tests (embed, RMSNorm, the I2_S matvec, top-k) have their
//! bodies in `kernel_checks.rs`, with their tolerances; this file runs them on lavapipe,
//! one line each.
//!
//! Tolerances of the others:
//! - f16_matvec: |Δ| ≤ 1e-5 · Σ|w·x| (f32 accumulation order).
//! - rope_kv: q within 1e-5 of the pair's magnitude |x0|+|x1| (measured ≤ 2e-7 on
//!   lavapipe up to position 4093, own Cody–Waite sin/cos); cached k within 1 F16 ulp of the
//!   CPU's rounding (measured: equal), or within 1e-5 of the pair's magnitude in an F32
//!   cache; cached v bit-exact, F16 rounding edge cases included.
//! - attention: |Δ| ≤ 1e-4·max|v| (measured 5e-7 for batches, 4e-6 for decode with F16
//!   probabilities, up to 3 chunks).
//! - The cache kernels (rope_kv, attention, window attention) run each case over an F16
//!   and an F32 cache ([`KV_TYPES`]): over F32 neither q nor the probabilities are rounded,
//!   on either side.
//! - glu: ReLU² bit-exact; SiLU within 1e-6 relative.

use half::f16;
use rand::Rng;

use super::*;
use crate::backend::cpu::{attention_rows, attention_scratch, rms_norm, rope_neox};
use crate::backend::cpu::{Contiguous, Heads, KvRows, QueryRow};
pub(super) use crate::kernel_checks::{
    cpu_act, cpu_ternary, cpu_topk, rng, ternary_tensor, variants,
};
use crate::kv::{KvRow, KvType, PAGE_POSITIONS};
use crate::quant::{act, i2s};

pub(super) fn ctx_with(opts: &GpuOptions) -> Option<GpuContext> {
    match GpuContext::new(opts) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
                eprintln!("skipping GPU test (TERNION_SKIP_GPU_TESTS=1): {e}");
                None
            } else {
                panic!(
                    "no usable GPU adapter: {e}. Install Mesa's lavapipe \
                     (mesa-vulkan-drivers) or set TERNION_SKIP_GPU_TESTS=1 to skip"
                );
            }
        }
    }
}

pub(super) fn ctx() -> Option<GpuContext> {
    ctx_with(&GpuOptions::default())
}

/// Runs `f` inside one compute pass, submits once and waits for it.
pub(super) fn run(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    kernel_checks::submit_pass(ctx, f);
    ctx.wait().expect("gpu work");
}

/// One test per shared kernel body ([`kernel_checks`]), blocking on it here.
macro_rules! kernel_check {
    ($name:ident) => {
        #[test]
        fn $name() {
            let Some(ctx) = ctx() else { return };
            pollster::block_on(kernel_checks::$name(&ctx)).expect("gpu work");
        }
    };
}

crate::each_kernel_check!(kernel_check);

#[test]
fn context_reports_caps() {
    let Some(ctx) = ctx() else { return };
    let c = ctx.caps();
    eprintln!("{c:?}");
    assert!(c.max_binding >= 1 << 27, "binding limit {}", c.max_binding);
    assert!(!list_adapters(wgpu::Backends::PRIMARY).is_empty());
    let bad = GpuContext::new(&GpuOptions {
        device_index: Some(999),
        ..GpuOptions::default()
    });
    assert!(matches!(
        bad,
        Err(crate::Error::NoSuchAdapter { index: 999, found }) if found >= 1
    ));
}

/// The fused q/k/v launch stores exactly what three separate matvecs store.
#[test]
fn ternary3_equals_three_matvecs() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(41);
    let (k, tokens) = (384usize, 2usize);
    let rows = [40usize, 13, 13];
    let ws: Vec<TernaryWeights> = rows
        .iter()
        .map(|&m| TernaryWeights::upload(&ctx, "w", &ternary_tensor(&mut r, m, k), k, m).unwrap())
        .collect();
    let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
    let (qa, _, _) = cpu_act(&ctx, &x, k);
    let outs: Vec<GpuBuffer> = rows
        .iter()
        .map(|&m| GpuBuffer::zeroed(&ctx, "y", (tokens * m * 4) as u64).unwrap())
        .collect();
    for v in variants(&ctx, 32) {
        let mut want = Vec::new();
        for (w, o) in ws.iter().zip(&outs) {
            let op = TernaryMatvec::new(&ctx, v, 32, w, &qa, o, Epilogue::Store, None).unwrap();
            run(&ctx, |p| op.record(p, tokens as u32, false));
            want.push(o.read::<f32>(&ctx).unwrap());
        }
        for o in &outs {
            o.write(&ctx, 0, &vec![0u8; o.size as usize]);
        }
        let op = Ternary3::new(
            &ctx,
            v,
            32,
            [&ws[0], &ws[1], &ws[2]],
            &qa,
            [&outs[0], &outs[1], &outs[2]],
        )
        .unwrap();
        run(&ctx, |p| op.record(p, tokens as u32));
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(o.read::<f32>(&ctx).unwrap(), want[i], "{v:?} part {i}");
        }
    }
}

/// A random F16 head of `vocab` rows of `k` in shards of `shard_rows` rows, and `tokens`
/// random hidden states.
fn head_case(
    ctx: &GpuContext,
    seed: u64,
    (vocab, k, tokens): (usize, usize, usize),
    shard_rows: usize,
) -> (Vec<f16>, Vec<f32>, Sharded) {
    let mut r = rng(seed);
    let w: Vec<f16> = (0..vocab * k)
        .map(|_| f16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-3.0..3.0)).collect();
    let bytes = (shard_rows * k * 2) as u64;
    let sharded = Sharded::from_rows(ctx, "head", bytemuck::cast_slice(&w), k * 2, Some(bytes));
    (w, x, sharded.unwrap())
}

/// Asserts `got` (token-major logits) within 1e-5 of the magnitudes of the f64 sums of the
/// F16 rows `w` (`k` wide) and the states `xs`.
fn assert_head_sums(got: &[f32], w: &[f16], xs: &[f32], k: usize, what: &str) {
    let vocab = w.len() / k;
    for (t, x) in xs.chunks(k).enumerate() {
        for (j, row) in w.chunks(k).enumerate() {
            let (mut dot, mut mag) = (0f64, 0f64);
            for (a, b) in row.iter().zip(x) {
                let p = f64::from(a.to_f32()) * f64::from(*b);
                dot += p;
                mag += p.abs();
            }
            let g = f64::from(got[t * vocab + j]);
            assert!(
                (g - dot).abs() <= 1e-5 * mag,
                "{what} t{t} row {j}: gpu {g} cpu {dot}"
            );
        }
    }
}

#[test]
fn f16_matvec_matches_cpu_over_shards() {
    let Some(ctx) = ctx() else { return };
    let (vocab, k, tokens) = (1007usize, 200usize, 11usize);
    let (w, x, sharded) = head_case(&ctx, 5, (vocab, k, tokens), 333);
    assert_eq!(sharded.shards.len(), 4);
    let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "logits", (tokens * vocab * 4) as u64).unwrap();
    for round_x in [false, true] {
        let xs: Vec<f32> = x
            .iter()
            .map(|&v| {
                if round_x {
                    f16::from_f32(v).to_f32()
                } else {
                    v
                }
            })
            .collect();
        for tpr in [8u32, 32] {
            for v in variants(&ctx, tpr) {
                let op = F16Matvec::new(&ctx, v, tpr, &sharded, &xb, &out, round_x).unwrap();
                run(&ctx, |p| op.record(p, tokens as u32));
                let mut got = out.read::<f32>(&ctx).unwrap();
                // The last-row entry writes row tokens−1's logits into row 0.
                let step = StepUniform::new(&ctx).unwrap();
                step.write(&ctx, tokens as u32, 0);
                let last =
                    F16Matvec::last_row(&ctx, v, tpr, &sharded, &xb, &out, round_x, &step).unwrap();
                run(&ctx, |p| last.record(p, tokens as u32));
                let lr = out.read::<f32>(&ctx).unwrap();
                assert_eq!(lr[..vocab], got[(tokens - 1) * vocab..], "last row");
                // One token with the hidden state in workgroup memory: row 0's sums.
                let one = F16Matvec::one_token(&ctx, v, tpr, &sharded, &xb, &out, round_x);
                run(&ctx, |p| one.as_ref().unwrap().record(p, 1));
                assert_eq!(
                    out.read::<f32>(&ctx).unwrap()[..vocab],
                    got[..vocab],
                    "one token"
                );
                if !round_x {
                    // Eight tokens per workgroup: the same rows, bit for bit (a partial group
                    // of tokens % 8 at the end).
                    let eight = F16Matvec::rows8(&ctx, v, tpr, &sharded, &xb, &out, &step).unwrap();
                    run(&ctx, |p| eight.record(p, tokens as u32));
                    assert_eq!(out.read::<f32>(&ctx).unwrap(), got, "rows8 {tpr} {v:?}");
                }
                got.truncate(tokens * vocab);
                let what = format!("round {round_x} tpr {tpr} {v:?}");
                assert_head_sums(&got, &w, &xs, k, &what);
            }
        }
    }
}

/// The cooperative-matrix LM head over several sequences (`f16_coop.wgsl`): shards of a
/// multiple of 16 rows, two token tiles (the second partial), the hidden states rounded to
/// F16, against f64 sums (the tensor cores sum in their own order).
#[test]
fn f16_coop_rows_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let (vocab, k, tokens) = (1008usize, 192usize, 37usize);
    let (w, x, sharded) = head_case(&ctx, 6, (vocab, k, tokens), 336);
    assert_eq!(sharded.shards.len(), 3);
    let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "logits", (tokens * vocab * 4) as u64).unwrap();
    let step = StepUniform::new(&ctx).unwrap();
    step.write(&ctx, tokens as u32, 0);
    let Some(op) = F16Matvec::rows32(&ctx, &sharded, &xb, &out, &step).unwrap() else {
        assert_ne!(ctx.caps().prefill, PrefillKernel::Coop);
        eprintln!("skipped: {} has no cooperative matrices", ctx.caps().name);
        return;
    };
    run(&ctx, |p| op.record(p, tokens as u32));
    let got = out.read::<f32>(&ctx).unwrap();
    let xs: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_head_sums(&got, &w, &xs, k, "rows32");
    // A shard whose rows are not a multiple of 16 is refused (the caller takes rows8).
    let odd = Sharded::from_rows(
        &ctx,
        "odd",
        bytemuck::cast_slice(&w[..1000 * k]),
        k * 2,
        None,
    )
    .unwrap();
    assert!(F16Matvec::rows32(&ctx, &odd, &xb, &out, &step)
        .unwrap()
        .is_none());
}

pub(super) fn dims(
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_rot: usize,
    base: f32,
) -> AttnDims {
    AttnDims {
        n_head,
        n_head_kv,
        head_dim,
        n_rot,
        rope_base: base,
    }
}

/// Values whose F16 rounding is delicate: ties, the overflow edge, subnormals, signed zero.
const F16_EDGES: [f32; 14] = [
    1.0 + 1.0 / 2048.0, // tie → 1.0 (even)
    1.0 + 3.0 / 2048.0, // tie → 1 + 2/1024 (even)
    -(1.0 + 1.0 / 2048.0),
    65504.0,
    65519.99,       // below the overflow tie: 65504
    65520.0,        // the tie rounds to inf
    1e-7,           // F16 subnormal
    2.980_232_2e-8, // 2^-25: tie → 0
    4.470_348_4e-8, // 1.5·2^-25 → 2^-24
    6.097_555e-5,   // just below the smallest normal
    -0.0,
    1e-30,
    -7e4, // → -inf
    0.333_333_34,
];

#[test]
fn rope_kv_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(9);
    let mut worst = 0f32;
    let cases = [
        (dims(6, 2, 40, 24, 10000.0), 3usize, 5usize),
        (dims(4, 1, 64, 64, 500_000.0), 1000, 3),
        (dims(20, 5, 128, 128, 500_000.0), 4090, 1),
    ];
    for (&(d, pos0, n), ty) in cases.iter().flat_map(|c| KV_TYPES.map(|t| (c, t))) {
        let (hq, kvd) = (d.n_head * d.head_dim, d.kv_dim());
        let n_ctx = pos0 + n + 3;
        let q: Vec<f32> = (0..n * hq).map(|_| r.random_range(-3.0..3.0)).collect();
        let k: Vec<f32> = (0..n * kvd).map(|_| r.random_range(-3.0..3.0)).collect();
        let mut v: Vec<f32> = (0..n * kvd).map(|_| r.random_range(-3.0..3.0)).collect();
        for (x, &e) in v.iter_mut().zip(&F16_EDGES) {
            *x = e;
        }
        let (qb, kb, vb) = (
            GpuBuffer::from_slice(&ctx, "q", &q).unwrap(),
            GpuBuffer::from_slice(&ctx, "k", &k).unwrap(),
            GpuBuffer::from_slice(&ctx, "v", &v).unwrap(),
        );
        let seq = PagedSeq::typed(&ctx, ty, n_ctx, kvd, pos0, n);
        let step = StepUniform::new(&ctx).unwrap();
        step.write(&ctx, n as u32, pos0 as u32);
        let op = RopeKv::new(&ctx, d, &step, &qb, &kb, &vb, seq.both()).unwrap();
        run(&ctx, |p| op.record(p, n as u32));

        let (mut qc, mut kc) = (q.clone(), k.clone());
        rope_neox(&mut qc, n, pos0, d.head_dim, d.n_rot, d.rope_base);
        rope_neox(&mut kc, n, pos0, d.head_dim, d.n_rot, d.rope_base);
        let qg = qb.read::<f32>(&ctx).unwrap();
        let half = d.n_rot / 2;
        let mag = |x: &[f32], i: usize| {
            let j = i % d.head_dim;
            if j < d.n_rot {
                let b = i - j + j % half;
                x[b].abs() + x[b + half].abs()
            } else {
                x[i].abs()
            }
        };
        for i in 0..qc.len() {
            let err = (qg[i] - qc[i]).abs() / mag(&q, i).max(1e-30);
            worst = worst.max(err);
            assert!(err <= 1e-5, "{d:?} q[{i}]: gpu {} cpu {}", qg[i], qc[i]);
        }
        let (kcache, vcache) = seq.read_rows(&ctx);
        assert!(
            kcache[..pos0 * kvd].iter().all(|&b| b.to_bits() == 0),
            "rows before pos0"
        );
        assert!(
            kcache[(pos0 + n) * kvd..].iter().all(|&b| b.to_bits() == 0),
            "rows after"
        );
        for i in 0..n * kvd {
            let got = kcache[pos0 * kvd + i];
            assert!(
                cached_key_ok(ty, got, kc[i], mag(&k, i)),
                "{d:?} {ty:?} k[{i}]: gpu {got} cpu {}",
                kc[i]
            );
            let err = (got - kc[i]).abs() / mag(&k, i).max(1e-30);
            assert!(err <= 1e-3, "{d:?} {ty:?} k[{i}]");
            assert_eq!(
                vcache[pos0 * kvd + i].to_bits(),
                stored(ty, v[i]).to_bits(),
                "{d:?} {ty:?} v[{i}] = {}",
                v[i]
            );
        }
    }
    eprintln!("rope_kv: worst |gpu − cpu| / (|x0| + |x1|) = {worst:e}");
}

/// One sequence in slot 1 of a two-slot [`KvIndex`], its pages in reverse order after a
/// spare page 0 (so the page-table indirection is exercised), with its `n` new tokens at
/// positions `pos0..`: position-ordered rows go in and come out through its page table.
pub(super) struct PagedSeq {
    pub kv: GpuKv,
    pub index: KvIndex,
    pages: Vec<u32>,
    kvd: usize,
    n_ctx: usize,
}

impl PagedSeq {
    /// An F16 cache.
    pub fn new(ctx: &GpuContext, n_ctx: usize, kvd: usize, pos0: usize, n: usize) -> PagedSeq {
        Self::typed(ctx, KvType::F16, n_ctx, kvd, pos0, n)
    }

    /// A cache of `ty`.
    pub fn typed(
        ctx: &GpuContext,
        ty: KvType,
        n_ctx: usize,
        kvd: usize,
        pos0: usize,
        n: usize,
    ) -> PagedSeq {
        let n_pages = n_ctx.div_ceil(PAGE_POSITIONS);
        let pages: Vec<u32> = (0..n_pages).map(|i| (n_pages - i) as u32).collect();
        let kv = GpuKv::new(ctx, n_pages + 1, kvd, ty).unwrap();
        let index = KvIndex::new(ctx, n.max(1), 2, n_ctx, true).unwrap();
        let at = (index.pps * 4) as u64;
        index.pages.write(ctx, at, bytemuck::cast_slice(&pages));
        let toks: Vec<[u32; 2]> = (pos0..pos0 + n).map(|p| [p as u32, 1]).collect();
        index.toks.write(ctx, 0, bytemuck::cast_slice(&toks));
        PagedSeq {
            kv,
            index,
            pages,
            kvd,
            n_ctx,
        }
    }

    fn row(&self, pos: usize) -> usize {
        self.pages[pos / PAGE_POSITIONS] as usize * PAGE_POSITIONS + pos % PAGE_POSITIONS
    }

    /// Writes keys and values of positions `0..k.len() / kvd` (widened to f32 in an F32
    /// cache).
    pub fn write_rows(&self, ctx: &GpuContext, k: &[f16], v: &[f16]) {
        for (pos, (kr, vr)) in k.chunks(self.kvd).zip(v.chunks(self.kvd)).enumerate() {
            let at = (self.row(pos) * self.kvd * self.kv.ty.bytes()) as u64;
            for (buf, row) in [(&self.kv.k, kr), (&self.kv.v, vr)] {
                match self.kv.ty {
                    KvType::F16 => buf.write(ctx, at, bytemuck::cast_slice(row)),
                    KvType::F32 => {
                        let wide: Vec<f32> = row.iter().map(|x| x.to_f32()).collect();
                        buf.write(ctx, at, bytemuck::cast_slice(&wide));
                    }
                }
            }
        }
    }

    /// Keys and values of positions `0..n_ctx` as f32, in position order.
    pub fn read_rows(&self, ctx: &GpuContext) -> (Vec<f32>, Vec<f32>) {
        let read = |b: &GpuBuffer| match self.kv.ty {
            KvType::F16 => b
                .read::<u16>(ctx)
                .unwrap()
                .into_iter()
                .map(|h| f16::from_bits(h).to_f32())
                .collect(),
            KvType::F32 => b.read::<f32>(ctx).unwrap(),
        };
        let (k, v): (Vec<f32>, Vec<f32>) = (read(&self.kv.k), read(&self.kv.v));
        let gather = |c: &[f32]| {
            (0..self.n_ctx)
                .flat_map(|p| c[self.row(p) * self.kvd..][..self.kvd].iter().copied())
                .collect()
        };
        (gather(&k), gather(&v))
    }

    pub fn both(&self) -> (&GpuKv, &KvIndex) {
        (&self.kv, &self.index)
    }
}

pub(super) fn random_kv(r: &mut impl Rng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(r.random_range(-2.0..2.0)))
        .collect()
}

/// Both KV cache types: the cache tests run one body for each.
pub(super) const KV_TYPES: [KvType; 2] = [KvType::F16, KvType::F32];

/// `x` as a cache of `ty` holds it.
pub(super) fn stored(ty: KvType, x: f32) -> f32 {
    match ty {
        KvType::F16 => f16::from_f32(x).to_f32(),
        KvType::F32 => x,
    }
}

/// A cached key `got` against the CPU's rotated key `want` (`mag`: the magnitude of its
/// rotation pair): within one F16 ulp of `want`'s rounding in an F16 cache (a rotated value
/// within ~1e-7 of a rounding tie), within 1e-5·mag of `want` in an F32 one (as q).
pub(super) fn cached_key_ok(ty: KvType, got: f32, want: f32, mag: f32) -> bool {
    match ty {
        KvType::F16 => {
            let bits = |x: f32| i32::from(f16::from_f32(x).to_bits());
            (bits(got) - bits(want)).abs() <= 1
        }
        KvType::F32 => (got - want).abs() <= 1e-5 * mag,
    }
}

/// A contiguous F32 cache for the CPU reference ([`Contiguous`] is F16).
struct ContiguousF32 {
    k: Vec<f32>,
    v: Vec<f32>,
    kv_dim: usize,
    head_dim: usize,
}

impl KvRows for ContiguousF32 {
    fn ty(&self) -> KvType {
        KvType::F32
    }
    fn key(&self, p: usize, h: usize) -> KvRow<'_> {
        KvRow::F32(&self.k[p * self.kv_dim + h * self.head_dim..][..self.head_dim])
    }
    fn value(&self, p: usize, h: usize) -> KvRow<'_> {
        KvRow::F32(&self.v[p * self.kv_dim + h * self.head_dim..][..self.head_dim])
    }
}

/// The CPU reference's attention of `rows` (queries `q`) over the keys and values `kv`
/// held in a cache of `ty` (widened to f32 in an F32 one, as [`PagedSeq::write_rows`]).
pub(super) fn cpu_attention(
    ty: KvType,
    q: &[f32],
    (k, v): (&[f16], &[f16]),
    rows: &[QueryRow],
    heads: Heads,
    n_ctx: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; rows.len() * heads.n_head * heads.head_dim];
    let mut scratch = vec![0f32; attention_scratch(n_ctx, heads.n_head, heads.head_dim)];
    let kv_dim = heads.n_head_kv * heads.head_dim;
    match ty {
        KvType::F16 => {
            let head_dim = heads.head_dim;
            let cache = Contiguous {
                k,
                v,
                kv_dim,
                head_dim,
            };
            attention_rows(q, |_| &cache, rows, heads, n_ctx, &mut out, &mut scratch);
        }
        KvType::F32 => {
            let wide = |x: &[f16]| x.iter().map(|h| h.to_f32()).collect();
            let cache = ContiguousF32 {
                k: wide(k),
                v: wide(v),
                kv_dim,
                head_dim: heads.head_dim,
            };
            attention_rows(q, |_| &cache, rows, heads, n_ctx, &mut out, &mut scratch);
        }
    }
    out
}

/// Runs [`Attention`] for `n` tokens after `pos0` cached positions of random F16 keys and
/// values in [−2, 2] (in a cache of `ty`) and checks it against the CPU: |Δ| ≤ 1e-4·max|v|
/// per output (decode rounds probabilities to F16 like the reference over an F16 cache);
/// with the `fast` numerics a single token keeps its probabilities in f32 (split over KV
/// pages), so |Δ| ≤ 2e-3·max|v| over an F16 cache, the F16 rounding's own size; a prompt
/// step (the tiled kernel for head widths 64 and 128) stays within 1e-4·max|v|. Keys of
/// position j are scaled by 1 + rise·j (rising scores: every page passes the row maxima
/// before it). Returns the worst |Δ|/max|v|.
pub(super) fn attention_case(
    ctx: &GpuContext,
    r: &mut impl Rng,
    (d, ty): (AttnDims, KvType),
    (pos0, n, rise): (usize, usize, f32),
    fast: bool,
) -> f32 {
    let (hq, kvd) = (d.n_head * d.head_dim, d.kv_dim());
    let n_ctx = pos0 + n + 5;
    let n_kv = pos0 + n;
    let mut kc = random_kv(r, n_kv * kvd);
    for (j, row) in kc.chunks_mut(kvd).enumerate() {
        let f = 1.0 + rise * j as f32;
        row.iter_mut()
            .for_each(|k| *k = f16::from_f32(k.to_f32() * f));
    }
    let vc = random_kv(r, n_kv * kvd);
    let seq = PagedSeq::typed(ctx, ty, n_ctx, kvd, pos0, n);
    seq.write_rows(ctx, &kc, &vc);
    let qb = GpuBuffer::zeroed(ctx, "q", (n * hq * 4) as u64).unwrap();
    let out = GpuBuffer::zeroed(ctx, "att", (n * hq * 4) as u64).unwrap();
    let round = n == 1;
    let step = StepUniform::new(ctx).unwrap();
    step.write(ctx, n as u32, pos0 as u32);
    seq.index
        .write_blocks(ctx, std::iter::once(n), &mut Vec::new());
    let opts = AttnOpts {
        round_p: round,
        fast: fast.then_some(&step),
        rope: None,
    };
    let op = Attention::new(ctx, d, &qb, seq.both(), &out, opts).unwrap();
    let rows: Vec<QueryRow> = (0..n)
        .map(|t| QueryRow {
            seq: 0,
            pos: pos0 + t,
            round_probs: round,
        })
        .collect();
    let heads = Heads {
        n_head: d.n_head,
        n_head_kv: d.n_head_kv,
        head_dim: d.head_dim,
        window: None,
    };
    // Twice with other queries: the fast split's merge counters must be back at zero.
    let mut worst = 0f32;
    for _ in 0..2 {
        // Spread scores so that the softmax is far from uniform.
        let q: Vec<f32> = (0..n * hq).map(|_| r.random_range(-3.0..3.0)).collect();
        qb.write(ctx, 0, bytemuck::cast_slice(&q));
        run(ctx, |p| op.record(p, n as u32, n_kv as u32, (false, false)));
        let got = out.read::<f32>(ctx).unwrap();
        let want = cpu_attention(ty, &q, (&kc, &vc), &rows, heads, n_ctx);
        worst = worst.max(attention_error(
            &got,
            &want,
            fast && round && ty == KvType::F16,
            (d, ty, pos0, n, fast),
        ));
    }
    worst
}

/// Worst |gpu − cpu| / 2 of an attention output, asserted within the tolerance of its
/// numerics (`fast_decode`: the fast split's F16 probabilities).
fn attention_error(
    got: &[f32],
    want: &[f32],
    fast_decode: bool,
    case: (AttnDims, KvType, usize, usize, bool),
) -> f32 {
    let (d, ty, pos0, n, fast) = case;
    // Outputs are convex combinations of values in [−2, 2]: compare against that scale.
    let tol = if fast_decode { 2e-3 } else { 1e-4 };
    let mut worst = 0f32;
    for i in 0..want.len() {
        let err = (got[i] - want[i]).abs() / 2.0;
        worst = worst.max(err);
        assert!(
            err <= tol,
            "{d:?} {ty:?} pos0 {pos0} n {n} fast {fast} out[{i}]: gpu {} cpu {}",
            got[i],
            want[i]
        );
    }
    worst
}

#[test]
fn attention_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(10);
    let mut worst = [0f32; 3];
    // (dims, pos0, tokens): decode across 1..3 chunks, batches crossing a chunk boundary.
    let cases = [
        (dims(6, 2, 40, 40, 1e4), 0usize, 1usize),
        (dims(6, 2, 40, 40, 1e4), 4, 1),
        (dims(6, 2, 40, 40, 1e4), 300, 1),
        (dims(4, 1, 64, 64, 1e4), 700, 1),
        (dims(20, 5, 128, 128, 1e4), 600, 1),
        // 16 query heads a kv head (the fast merge stages 8 at a time), 47 pages.
        (dims(32, 2, 32, 32, 1e4), 1500, 1),
        (dims(6, 2, 40, 40, 1e4), 0, 7),
        (dims(4, 1, 64, 64, 1e4), 250, 9),
        (dims(3, 3, 6, 4, 1e4), 517, 2),
    ];
    for (&(d, pos0, n), ty) in cases.iter().flat_map(|c| KV_TYPES.map(|t| (c, t))) {
        let round = n == 1;
        let err = attention_case(&ctx, &mut r, (d, ty), (pos0, n, 0.0), false);
        worst[usize::from(round)] = worst[usize::from(round)].max(err);
    }
    // The fast numerics' split decode (within a page, across pages, a partial last page)
    // and tiled prompts (blocks and tiles cut anywhere, after cached positions or none;
    // the last two walk 10 and 12 pages of rising scores, so the cooperative-matrix P·V
    // rescales its accumulators at every page).
    let tiled = [
        (dims(8, 2, 128, 128, 1e4), 0usize, 37usize, 0.0),
        (dims(4, 1, 64, 64, 1e4), 45, 20, 0.0),
        (dims(20, 5, 128, 128, 1e4), 3, 16, 0.0),
        (dims(4, 2, 128, 128, 1e4), 250, 70, 0.05),
        (dims(2, 1, 64, 64, 1e4), 330, 40, 0.05),
    ];
    let decode = cases
        .iter()
        .filter(|c| c.2 == 1)
        .map(|&(d, p, n)| (d, p, n, 0.0));
    for (d, pos0, n, rise) in decode.chain(tiled) {
        for ty in KV_TYPES {
            let err = attention_case(&ctx, &mut r, (d, ty), (pos0, n, rise), true);
            worst[2] = worst[2].max(err);
        }
    }
    // Where the prompts' P·V ran on cooperative matrices, the scalar tiles once more.
    if crate::ops::prompt_kernel_coop(&ctx) {
        let scalar = GpuOptions {
            prefill: Some(PrefillKernel::Tiled),
            ..GpuOptions::default()
        };
        let ctx = ctx_with(&scalar).expect("the adapter without cooperative matrices");
        assert!(!crate::ops::prompt_kernel_coop(&ctx));
        for (d, pos0, n, rise) in tiled {
            let err = attention_case(&ctx, &mut r, (d, KvType::F16), (pos0, n, rise), true);
            worst[2] = worst[2].max(err);
        }
    }
    eprintln!(
        "attention: worst |gpu − cpu| / max|v|: batch {:e}, decode (F16 probs) {:e}, fast \
         decode {:e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn glu_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(11);
    let (n, t) = (777usize, 3usize);
    let g: Vec<f32> = (0..n * t).map(|_| r.random_range(-6.0..6.0)).collect();
    let u: Vec<f32> = (0..n * t).map(|_| r.random_range(-3.0..3.0)).collect();
    let ub = GpuBuffer::from_slice(&ctx, "up", &u).unwrap();
    let gb = GpuBuffer::zeroed(&ctx, "gate", (n * t * 4) as u64).unwrap();
    for act in [GluAct::ReluSqr, GluAct::Silu, GluAct::GeluTanh] {
        gb.write(&ctx, 0, bytemuck::cast_slice(&g));
        let op = Glu::new(&ctx, act, &gb, &ub, n).unwrap();
        run(&ctx, |p| op.record(p, t as u32));
        let got = gb.read::<f32>(&ctx).unwrap();
        for i in 0..n * t {
            let want = match act {
                GluAct::ReluSqr => {
                    let x = g[i].max(0.0);
                    (x * x) * u[i]
                }
                GluAct::Silu => (g[i] / (1.0 + (-g[i]).exp())) * u[i],
                GluAct::GeluTanh => crate::backend::cpu::gelu_ggml(g[i]) * u[i],
            };
            match act {
                GluAct::ReluSqr => assert_eq!(got[i].to_bits(), want.to_bits(), "{i}"),
                GluAct::Silu => assert!(
                    (got[i] - want).abs() <= 1e-6 * want.abs() + 1e-30,
                    "{i}: gpu {} cpu {want}",
                    got[i]
                ),
                // One F16 ulp of the GELU value (rowops.wgsl's bound), times |u|.
                GluAct::GeluTanh => assert!(
                    (got[i] - want).abs() <= (want.abs() / 1024.0 + 1e-6 * u[i].abs()) * 1.01,
                    "{i}: gpu {} cpu {want}",
                    got[i]
                ),
            }
        }
    }
}

/// embed → rmsnorm_quant → ternary (+= residual) → rmsnorm → f16 head → argmax, recorded
/// into one pass and submitted once; recording it 100 more times creates no GPU object.
#[test]
fn one_pass_chain_and_nothing_created_per_record() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(7);
    let (vocab, d) = (1007usize, 256usize);
    let table: Vec<f16> = (0..vocab * d)
        .map(|_| f16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let norm_w: Vec<f32> = (0..d).map(|_| r.random_range(0.5..1.5)).collect();
    let wdata = ternary_tensor(&mut r, d, d);
    let ids = [17u32];

    let v = ctx.variant(32);
    let embd = Sharded::from_rows(&ctx, "embd", bytemuck::cast_slice(&table), d * 2, None).unwrap();
    let idb = GpuBuffer::from_slice(&ctx, "ids", &ids).unwrap();
    let x = GpuBuffer::zeroed(&ctx, "x", (d * 4) as u64).unwrap();
    let h = GpuBuffer::zeroed(&ctx, "h", (d * 4) as u64).unwrap();
    let nw = GpuBuffer::from_slice(&ctx, "norm", &norm_w).unwrap();
    let qa = QuantAct::new(&ctx, d, 1).unwrap();
    let w = TernaryWeights::upload(&ctx, "w", &wdata, d, d).unwrap();
    let logits = GpuBuffer::zeroed(&ctx, "logits", (vocab * 4) as u64).unwrap();
    let embed = Embed::new(&ctx, v, &embd, &idb, &x).unwrap();
    let norm_q = RmsNorm::new(&ctx, v, &x, &nw, d, 1e-5, NormOut::Quant(&qa)).unwrap();
    let mm = TernaryMatvec::new(&ctx, v, 32, &w, &qa, &x, Epilogue::Add, None).unwrap();
    let norm = RmsNorm::new(&ctx, v, &x, &nw, d, 1e-5, NormOut::F32(&h)).unwrap();
    let head = F16Matvec::new(&ctx, v, 32, &embd, &h, &logits, true).unwrap();
    let argmax = TopK::new(&ctx, &logits, vocab as u32, 1).unwrap();

    let step = |ctx: &GpuContext| {
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            embed.record(&mut pass, 1);
            norm_q.record(&mut pass, 1);
            mm.record(&mut pass, 1, false);
            norm.record(&mut pass, 1);
            head.record(&mut pass, 1);
            argmax.record(&mut pass);
        }
        argmax.record_download(&mut enc);
        ctx.submit(enc);
        argmax.read(ctx).unwrap()
    };
    let got = step(&ctx);

    // CPU chain.
    let mut xc: Vec<f32> = table[17 * d..][..d].iter().map(|h| h.to_f32()).collect();
    let mut hc = vec![0f32; d];
    rms_norm(&xc, &norm_w, 1e-5, &mut hc);
    let mut q = vec![0i8; d];
    let p = act::quantize_per_token(&hc, &mut q);
    let ws = i2s::tensor_scale(&wdata, d * d);
    for (j, xv) in xc.iter_mut().enumerate() {
        *xv += (i2s::dot(&wdata[j * d / 4..][..d / 4], &q) as f32 / p.scale) * ws;
    }
    rms_norm(&xc, &norm_w, 1e-5, &mut hc);
    let xr: Vec<f32> = hc.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let lc: Vec<f32> = (0..vocab)
        .map(|j| (0..d).map(|i| table[j * d + i].to_f32() * xr[i]).sum())
        .collect();
    let lg = logits.read::<f32>(&ctx).unwrap();
    let best = cpu_topk(&lg, 1)[0];
    assert_eq!(got[0], best, "GPU argmax of its own logits");
    let cpu_best = cpu_topk(&lc, 1)[0];
    assert_eq!(got[0].0, cpu_best.0, "argmax vs CPU chain");
    for (g, c) in lg.iter().zip(&lc) {
        assert!(
            (g - c).abs() <= 1e-3 * (1.0 + c.abs()),
            "logit gpu {g} cpu {c}"
        );
    }

    // Recording again creates nothing.
    let before = ctx.counters();
    let n_pipelines = ctx.pipelines.len();
    for _ in 0..100 {
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            embed.record(&mut pass, 1);
            norm_q.record(&mut pass, 1);
            mm.record(&mut pass, 1, false);
            norm.record(&mut pass, 1);
            head.record(&mut pass, 1);
            argmax.record(&mut pass);
        }
        argmax.record_download(&mut enc);
        ctx.submit(enc);
        let _ = argmax.read(&ctx).unwrap();
    }
    assert_eq!(ctx.counters(), before);
    assert_eq!(ctx.pipelines.len(), n_pipelines);
    ctx.check().unwrap();
}

#[test]
fn f32_only_context_runs_the_fallbacks() {
    let Some(ctx) = ctx_with(&GpuOptions {
        disable_f16: true,
        disable_subgroups: true,
        ..GpuOptions::default()
    }) else {
        return;
    };
    assert!(!ctx.caps().f16 && !ctx.caps().subgroups);
    assert_eq!(ctx.variant(8), Variant::default());
}

/// Prints the wall-clock time per launch of `f` recorded 200 times into one pass, after
/// one warm-up pass, and the rate at which it reads `bytes` per launch.
pub(super) fn time_launches(
    ctx: &GpuContext,
    label: &str,
    bytes: f64,
    f: &dyn Fn(&mut wgpu::ComputePass<'_>),
) {
    let reps = 200u32;
    run(ctx, |p| f(p));
    let t = std::time::Instant::now();
    run(ctx, |p| {
        for _ in 0..reps {
            f(p)
        }
    });
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
    eprintln!("{label}: {us:.2} µs/launch, {:.0} GB/s", bytes / us / 1e3);
}

/// One dependent launch of the probe kernel by workgroup count: what a launch costs before
/// its work, for one workgroup a token of a prompt step against the 132 `bench` reports.
/// Run with `--ignored --nocapture` on a real GPU.
#[test]
#[ignore]
fn bench_dispatch_latency_by_workgroups() {
    let Some(ctx) = ctx() else { return };
    let latency = |groups, variants: &[Variant]| {
        crate::bandwidth::dispatch_latency_with(&ctx, groups, variants).unwrap()
    };
    for groups in [1, 132, 264, 512, 1024, 2048] {
        let us = latency(groups, &[Variant::default()]);
        eprintln!("{groups:>5} workgroups: {us:.2} µs a dependent launch");
    }
    // Two variants of the probe's kernel (two pipelines) taking turns, as a prompt step's
    // launches switch pipeline at every launch.
    eprintln!(
        "  512 workgroups, one pipeline: {:.2} µs; two taking turns: {:.2} µs a launch",
        latency(512, &[Variant::default()]),
        latency(512, &[Variant::default(), ctx.variant(32)])
    );
}

/// Wall-clock per dispatch of the decode kernels at BitNet 2B-4T shapes, each recorded 200
/// times into one pass (consecutive dispatches write the same buffer, so each waits for the
/// previous one, as in a forward pass). Run with `--ignored --nocapture` on a real GPU.
#[test]
#[ignore]
fn bench_decode_kernels() {
    let Some(ctx) = ctx() else { return };
    eprintln!("{:?}", ctx.caps());
    let time = |label: &str, bytes: f64, f: &dyn Fn(&mut wgpu::ComputePass<'_>)| {
        time_launches(&ctx, label, bytes, f)
    };
    let mut r = rng(8);
    let step = StepUniform::new(&ctx).unwrap();
    for &(rows, k) in &[
        (2560usize, 2560usize),
        (640, 2560),
        (6912, 2560),
        (2560, 6912),
    ] {
        let data = ternary_tensor(&mut r, rows, k);
        let w = TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap();
        let x: Vec<f32> = (0..8 * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, _, _) = cpu_act(&ctx, &x, k);
        let out = GpuBuffer::zeroed(&ctx, "y", (8 * rows * 4) as u64).unwrap();
        for tpr in [16u32, 32, 64] {
            let v = ctx.variant(tpr);
            let op = TernaryMatvec::new(&ctx, v, tpr, &w, &qa, &out, Epilogue::Store, Some(&step))
                .unwrap();
            let b = (rows * k / 4) as f64;
            time(&format!("ternary {rows}x{k} tpr {tpr} {v:?}"), b, &|p| {
                op.record(p, 1, false)
            });
            step.write(&ctx, 8, 0);
            time(&format!("ternary4 {rows}x{k} T=8 tpr {tpr}"), b, &|p| {
                op.record(p, 8, true)
            });
        }
    }
    let (vocab, d) = (128_256usize, 2560usize);
    let head: Vec<u16> = (0..vocab * d)
        .map(|i| (0x3000 + (i * 7919) % 0x0800) as u16)
        .collect();
    let sh = Sharded::from_rows(&ctx, "head", bytemuck::cast_slice(&head), d * 2, None).unwrap();
    drop(head);
    let x = GpuBuffer::from_slice(&ctx, "x", &vec![0.5f32; d]).unwrap();
    let logits = GpuBuffer::zeroed(&ctx, "logits", (vocab * 4) as u64).unwrap();
    for tpr in [32u32, 64] {
        let v = ctx.variant(tpr);
        let op = F16Matvec::new(&ctx, v, tpr, &sh, &x, &logits, true).unwrap();
        time(
            &format!("lm head tpr {tpr} {v:?} ({} shards)", sh.shards.len()),
            (vocab * d * 2) as f64,
            &|p| op.record(p, 1),
        );
    }
    let topk = TopK::new(&ctx, &logits, vocab as u32, 40).unwrap();
    let argmax = TopK::new(&ctx, &logits, vocab as u32, 1).unwrap();
    time("top-40", (vocab * 4) as f64, &|p| topk.record(p));
    time("argmax", (vocab * 4) as f64, &|p| argmax.record(p));
    let nw = GpuBuffer::from_slice(&ctx, "nw", &vec![1.0f32; 6912]).unwrap();
    let xs = GpuBuffer::from_slice(&ctx, "xs", &vec![0.3f32; 6912]).unwrap();
    let qa = QuantAct::new(&ctx, 6912, 1).unwrap();
    let n = RmsNorm::new(
        &ctx,
        Variant::default(),
        &xs,
        &nw,
        6912,
        1e-5,
        NormOut::Quant(&qa),
    )
    .unwrap();
    time("rmsnorm_quant 6912", 6912.0 * 4.0, &|p| n.record(p, 1));
}
