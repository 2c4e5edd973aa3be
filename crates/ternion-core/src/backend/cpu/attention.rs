//! Causal multi-head attention over an F16 (or F32) KV cache, with grouped-query heads:
//! [`attention_rows`] runs the query rows of several sequences at once, each row reading
//! its own sequence's cache (the paged [`crate::kv::KvSeq`] through [`KvRows`]);
//! [`attention`] is the same computation over one contiguous cache.
//!
//! Numerics follow the reference engines: Q is rounded to F16 for QKᵀ, scores are scaled
//! by 1/√head_dim, the softmax takes its exponentials in f64 rounded to f32
//! ([`simd::exp_f32`], the same on every platform) and sums them in f64, and for
//! single-token decode the probabilities are rounded to F16 before P·V (a batch keeps them
//! in f32). Over an F32 cache nothing is rounded (ggml keeps Q and the probabilities in f32
//! against F32 K/V).

use super::pool::{self, SharedMut};
use super::simd;
use crate::kv::{KvRow, KvType};
use half::f16;

/// Shape of one attention call.
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Position of the first query row.
    pub pos0: usize,
    /// Round probabilities to F16 before P·V (single-token decode).
    pub round_probs: bool,
    /// Positions the cache can hold (scratch is sized for it once).
    pub capacity: usize,
}

/// Scratch floats [`attention_rows`] needs on the global pool for a cache of `capacity`
/// positions and `n_head` query heads of `head_dim`: each thread's region
/// ([`per_thread`]), then the region [`long_row`] shares between them (every query head's
/// rounded query and scores).
pub fn attention_scratch(capacity: usize, n_head: usize, head_dim: usize) -> usize {
    per_thread(capacity, head_dim) * pool::global().n_threads() + n_head * (capacity + head_dim)
}

/// Scratch floats one thread needs (a task runs up to [`simd::MAX_HEADS`] query heads).
fn per_thread(capacity: usize, head_dim: usize) -> usize {
    simd::MAX_HEADS * (capacity + head_dim)
}

/// Keys from which a lone decode row's attention is split by positions and output columns
/// ([`long_row`]) instead of running as one task per group of query heads. With few kv
/// heads on two threads (2B-4T: five tasks) one thread runs the odd task alone. Split, a
/// 2B-4T decode's attention took ~9 % less time at 512 positions and ~12 % less at 2,048,
/// and the same at 256, where the two extra parallel ops cost what the balance saves
/// (BENCHMARKS.md, session 33).
const SPLIT_FROM: usize = 384;

/// Positions of one scores task of [`long_row`] (two pages: every kv head's keys of a page
/// lie one after another).
const KEY_BLOCK: usize = 64;

/// Output columns of one P·V task of [`long_row`].
const DIM_BLOCK: usize = 64;

/// Query heads per task: the largest divisor of the group (query heads per kv head) that
/// is at most [`simd::MAX_HEADS`] — they read the same keys and values.
fn heads_per_task(group: usize) -> usize {
    (1..=simd::MAX_HEADS.min(group))
        .rev()
        .find(|g| group.is_multiple_of(*g))
        .unwrap_or(1)
}

/// Where the keys and values of one sequence's cache are read, one kv head at a time.
pub trait KvRows: Sync {
    /// The element type of every row.
    fn ty(&self) -> KvType;
    /// Kv head `h`'s key at position `p`.
    fn key(&self, p: usize, h: usize) -> KvRow<'_>;
    /// Kv head `h`'s value at position `p`.
    fn value(&self, p: usize, h: usize) -> KvRow<'_>;
    /// Kv head `h`'s keys from position `p` on as stored, and the distance between two
    /// positions' keys: at least `p`'s own key (by default only it), each further position's
    /// one stride after the previous one's.
    fn keys_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        let k = self.key(p, h);
        (k, k.len())
    }
    /// Kv head `h`'s values from position `p` on, as [`KvRows::keys_from`].
    fn values_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        let v = self.value(p, h);
        (v, v.len())
    }
}

/// A cache laid out contiguously: position `p`'s kv heads one after the other at
/// `p · kv_dim`.
pub struct Contiguous<'a> {
    /// Keys, `kv_dim` per position.
    pub k: &'a [f16],
    /// Values, same layout.
    pub v: &'a [f16],
    /// Halves per position.
    pub kv_dim: usize,
    /// Halves per head.
    pub head_dim: usize,
}

impl KvRows for Contiguous<'_> {
    fn ty(&self) -> KvType {
        KvType::F16
    }
    fn key(&self, p: usize, h: usize) -> KvRow<'_> {
        KvRow::F16(&self.k[p * self.kv_dim + h * self.head_dim..][..self.head_dim])
    }
    fn value(&self, p: usize, h: usize) -> KvRow<'_> {
        KvRow::F16(&self.v[p * self.kv_dim + h * self.head_dim..][..self.head_dim])
    }
    fn keys_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        let k = &self.k[p * self.kv_dim + h * self.head_dim..];
        (KvRow::F16(k), self.kv_dim)
    }
    fn values_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        let v = &self.v[p * self.kv_dim + h * self.head_dim..];
        (KvRow::F16(v), self.kv_dim)
    }
}

impl<T: KvRows> KvRows for &T {
    fn ty(&self) -> KvType {
        (**self).ty()
    }
    fn key(&self, p: usize, h: usize) -> KvRow<'_> {
        (**self).key(p, h)
    }
    fn value(&self, p: usize, h: usize) -> KvRow<'_> {
        (**self).value(p, h)
    }
    fn keys_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        (**self).keys_from(p, h)
    }
    fn values_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        (**self).values_from(p, h)
    }
}

impl KvRows for crate::kv::KvLayer<'_> {
    fn ty(&self) -> KvType {
        crate::kv::KvLayer::ty(self)
    }
    fn key(&self, p: usize, h: usize) -> KvRow<'_> {
        crate::kv::KvLayer::key(self, p, h)
    }
    fn value(&self, p: usize, h: usize) -> KvRow<'_> {
        crate::kv::KvLayer::value(self, p, h)
    }
    fn keys_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        let k = crate::kv::KvLayer::keys_from(self, p, h);
        (k, self.head_dim())
    }
    fn values_from(&self, p: usize, h: usize) -> (KvRow<'_>, usize) {
        let v = crate::kv::KvLayer::values_from(self, p, h);
        (v, self.head_dim())
    }
}

/// Calls `f(i, rows, stride, n)` over the F16 runs `run(p)` (rows of `hd` halves, `stride`
/// apart) covering the positions `span` in order: `rows` holds the `n` rows from position
/// `span.start + i`. The first rows of each next run are asked for before `f` reads the
/// current one ([`simd::prefetch_f16_rows`]).
fn f16_runs<'c>(
    span: std::ops::Range<usize>,
    hd: usize,
    run: impl Fn(usize) -> (KvRow<'c>, usize),
    mut f: impl FnMut(usize, &'c [f16], usize, usize),
) {
    let f16 = |p: usize| {
        let (KvRow::F16(rows), stride) = run(p) else {
            unreachable!("an F16 cache holds F16 rows")
        };
        (rows, stride)
    };
    let mut p = span.start;
    let mut cur = (p < span.end).then(|| f16(p));
    while let Some((rows, stride)) = cur {
        let n = ((rows.len() - hd) / stride + 1).min(span.end - p);
        cur = (p + n < span.end).then(|| f16(p + n));
        if let Some((next, next_stride)) = cur {
            simd::prefetch_f16_rows(next, next_stride, hd);
        }
        f(p - span.start, rows, stride, n);
        p += n;
    }
}

/// `q · k` for one head: against F16 keys with `q` already rounded to F16 (SIMD), against
/// F32 keys in f32.
fn dot(level: simd::Level, k: KvRow<'_>, q: &[f32]) -> f32 {
    match k {
        KvRow::F16(k) => simd::f16_dot_halves(level, k, q),
        KvRow::F32(k) => k.iter().zip(q).map(|(&a, &b)| a * b).sum(),
    }
}

/// `out += w · v` for one head.
fn axpy(level: simd::Level, out: &mut [f32], w: f32, v: KvRow<'_>) {
    match v {
        KvRow::F16(v) => simd::f16_axpy(level, out, w, v),
        KvRow::F32(v) => out.iter_mut().zip(v).for_each(|(o, &x)| *o += w * x),
    }
}

/// One query row of a batched attention call: which sequence's cache it reads, its
/// position, and whether its probabilities are rounded to F16 (single-token decode).
#[derive(Clone, Copy, Debug)]
pub struct QueryRow {
    /// Index of the sequence's cache.
    pub seq: usize,
    /// Position of the row (it sees keys `0..=pos`).
    pub pos: usize,
    /// Round probabilities to F16 before P·V.
    pub round_probs: bool,
}

/// Head geometry of a batched attention call.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Positions a query sees, itself included (`None`: every cached one).
    pub window: Option<usize>,
}

/// `q` holds one row of `n_head · head_dim` per new token; `k`/`v` hold the cached rows for
/// positions `0..pos0 + n_tokens`. Writes the concatenated head outputs to `out`.
/// `scratch` holds [`attention_scratch`] floats.
pub fn attention(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    s: &AttnShape,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let heads = Heads {
        n_head: s.n_head,
        n_head_kv: s.n_head_kv,
        head_dim: s.head_dim,
        window: None,
    };
    let rows: Vec<QueryRow> = (0..q.len() / (s.n_head * s.head_dim))
        .map(|t| QueryRow {
            seq: 0,
            pos: s.pos0 + t,
            round_probs: s.round_probs,
        })
        .collect();
    let cache = Contiguous {
        k,
        v,
        kv_dim: s.n_head_kv * s.head_dim,
        head_dim: s.head_dim,
    };
    attention_rows(q, |_| &cache, &rows, heads, s.capacity, out, scratch);
}

/// Batched causal attention: query row `r` of `q` (described by `rows[r]`) attends over
/// positions `0..=rows[r].pos` of cache `cache(rows[r].seq)` (the last `window` of them
/// when [`Heads::window`] is set). Each row's query heads of one kv head, up to
/// [`simd::MAX_HEADS`] at a time (the largest divisor of the group that fits), are one task
/// of the global pool, which converts each F16 key and value row once for them; the numerics
/// are those of [`attention`], each head's result the same bit for bit however the heads
/// are grouped. A lone decode row over [`SPLIT_FROM`] keys or more of an F16 cache runs as
/// [`long_row`] instead (the same results). `capacity` bounds every row's position + 1;
/// `scratch` holds [`attention_scratch`] floats.
pub fn attention_rows<C: KvRows>(
    q: &[f32],
    cache: impl Fn(usize) -> C + Sync,
    rows: &[QueryRow],
    s: Heads,
    capacity: usize,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    assert!(
        scratch.len() >= attention_scratch(capacity, s.n_head, s.head_dim),
        "attention: scratch too small"
    );
    let per_thread = per_thread(capacity, s.head_dim);
    if let [row] = *rows {
        let n_keys = row.pos + 1;
        let first = s.window.map_or(0, |w| n_keys.saturating_sub(w));
        let c = cache(row.seq);
        if pool::global().n_threads() > 1
            && n_keys - first >= SPLIT_FROM
            && s.head_dim.is_multiple_of(DIM_BLOCK)
            && c.ty() == KvType::F16
        {
            return long_row(q, &c, (row, first), s, out, (scratch, per_thread));
        }
    }
    by_head_groups(q, cache, rows, s, out, (scratch, per_thread));
}

/// [`attention_rows`] as one task per row and group of query heads that share a kv head;
/// `scratch` holds the threads' regions of `per_thread` floats.
fn by_head_groups<C: KvRows>(
    q: &[f32],
    cache: impl Fn(usize) -> C + Sync,
    rows: &[QueryRow],
    s: Heads,
    out: &mut [f32],
    (scratch, per_thread): (&mut [f32], usize),
) {
    let (hd, group) = (s.head_dim, s.n_head / s.n_head_kv);
    let (scale, level, pool) = (scale(hd), simd::Level::detect(), pool::global());
    let scratch = SharedMut(scratch.as_mut_ptr());
    let g = heads_per_task(group);
    // Each task: one row's g query heads of one kv head (contiguous in `out`).
    pool.for_each_chunk_mut(out, g * hd, |i, o, thread| {
        let scratch = &scratch;
        // SAFETY: thread `thread` alone uses floats [thread·per_thread, +per_thread) of
        // the scratch (asserted large enough), and runs one chunk at a time.
        let mine = unsafe {
            std::slice::from_raw_parts_mut(scratch.0.add(thread * per_thread), per_thread)
        };
        let (qh, scores) = mine.split_at_mut(g * hd);
        let (row, h) = (rows[i * g / s.n_head], i * g % s.n_head);
        let cache = cache(row.seq);
        let half = cache.ty() == KvType::F16;
        let n_keys = row.pos + 1;
        let first = s.window.map_or(0, |w| n_keys.saturating_sub(w));
        let (kvh, len) = (h / group, n_keys - first);
        // The length of each query's row of scores, at least 1 (an empty window's rows are
        // empty slices either way).
        let step = len.max(1);
        qh.copy_from_slice(&q[i * g * hd..(i + 1) * g * hd]);
        if half {
            simd::round_f16(level, qh);
        }
        // Query j's scores at scores[j·len..][..len].
        let scores = &mut scores[..g * len];
        if half {
            let keys = |p| cache.keys_from(p, kvh);
            f16_runs(first..n_keys, hd, keys, |i, k, stride, n| {
                simd::f16_scores_heads(level, (qh, hd), (k, stride, n), &mut scores[i..], len)
            });
        } else {
            for (qj, sj) in qh.chunks_exact(hd).zip(scores.chunks_exact_mut(step)) {
                for (p, sc) in (first..).zip(sj.iter_mut()) {
                    *sc = dot(level, cache.key(p, kvh), qj);
                }
            }
        }
        softmax_rows(level, scores, step, scale, row.round_probs && half);
        o.fill(0.0);
        if half {
            let values = |p| cache.values_from(p, kvh);
            f16_runs(first..n_keys, hd, values, |i, v, stride, n| {
                simd::f16_weighted_sum_heads(level, (&scores[i..], len), (v, stride, n), o, hd)
            });
        } else {
            for (oj, sj) in o.chunks_exact_mut(hd).zip(scores.chunks_exact(step)) {
                for (p, &w) in (first..).zip(sj.iter()) {
                    axpy(level, oj, w, cache.value(p, kvh));
                }
            }
        }
    });
}

/// The scores' scale for heads of `hd`: 1/√hd.
fn scale(hd: usize) -> f32 {
    1.0 / (hd as f32).sqrt()
}

/// [`attention_rows`] for one decode row over a long F16 cache, in three parallel ops that
/// keep both threads busy however few kv heads there are: the scores by blocks of
/// [`KEY_BLOCK`] positions (all heads of a block: one stream through its pages), the
/// softmax by groups of query heads, and P·V by blocks of [`DIM_BLOCK`] output columns.
/// Each score, probability and output element is computed by the same operations in the
/// same order as in one task per group of query heads, so the results are the same bit for
/// bit. `scratch` holds the threads' regions of `per_thread` floats, then the shared
/// region of [`attention_scratch`].
fn long_row<C: KvRows>(
    q: &[f32],
    cache: &C,
    (row, first): (QueryRow, usize),
    s: Heads,
    out: &mut [f32],
    (scratch, per_thread): (&mut [f32], usize),
) {
    let (hd, group) = (s.head_dim, s.n_head / s.n_head_kv);
    let g = heads_per_task(group);
    let (n_keys, level, pool) = (row.pos + 1, simd::Level::detect(), pool::global());
    let len = n_keys - first;
    let (mine, shared) = scratch.split_at_mut(per_thread * pool.n_threads());
    let (qr, scores) = shared.split_at_mut(s.n_head * hd);
    qr.copy_from_slice(&q[..s.n_head * hd]);
    simd::round_f16(level, qr);
    let qr = &*qr;
    let scores = &mut scores[..s.n_head * len];
    let (mine, sp) = (SharedMut(mine.as_mut_ptr()), SharedMut(scores.as_mut_ptr()));
    // Thread `thread`'s scratch region.
    let region = |mine: &SharedMut<f32>, thread: usize| {
        // SAFETY: thread `thread` alone uses floats [thread·per_thread, +per_thread) of the
        // threads' scratch, and runs one task at a time.
        unsafe { std::slice::from_raw_parts_mut(mine.0.add(thread * per_thread), per_thread) }
    };
    let units = s.n_head / g;
    pool.run(len.div_ceil(KEY_BLOCK), &|b, thread| {
        let (mine, sp) = (&mine, &sp);
        let span = first + b * KEY_BLOCK..(first + (b + 1) * KEY_BLOCK).min(n_keys);
        let tile = &mut region(mine, thread)[..g * KEY_BLOCK];
        for u in 0..units {
            let (qu, kvh) = (&qr[u * g * hd..(u + 1) * g * hd], u * g / group);
            let keys = |p| cache.keys_from(p, kvh);
            f16_runs(span.clone(), hd, keys, |i, k, stride, n| {
                simd::f16_scores_heads(level, (qu, hd), (k, stride, n), &mut tile[i..], KEY_BLOCK)
            });
            for (j, t) in tile.chunks_exact(KEY_BLOCK).enumerate() {
                let n = span.len();
                // SAFETY: query head u·g + j's scores at positions `span` belong to this
                // block's task alone, inside the n_head · len scores.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(sp.0.add((u * g + j) * len + b * KEY_BLOCK), n)
                };
                dst.copy_from_slice(&t[..n]);
            }
        }
    });
    let round = row.round_probs;
    pool.for_each_chunk_mut(scores, g * len, |_, su, _| {
        softmax_rows(level, su, len, scale(hd), round)
    });
    let (scores, op) = (&*scores, SharedMut(out.as_mut_ptr()));
    let blocks = hd / DIM_BLOCK;
    pool.run(units * blocks, &|t, thread| {
        let (mine, op) = (&mine, &op);
        let (u, c0) = (t / blocks, t % blocks * DIM_BLOCK);
        let (su, kvh) = (&scores[u * g * len..(u + 1) * g * len], u * g / group);
        let acc = &mut region(mine, thread)[..g * DIM_BLOCK];
        acc.fill(0.0);
        let values = |p| cache.values_from(p, kvh);
        f16_runs(first..n_keys, hd, values, |i, v, stride, n| {
            let v = &v[c0..];
            simd::f16_weighted_sum_heads(level, (&su[i..], len), (v, stride, n), acc, DIM_BLOCK)
        });
        for (j, a) in acc.chunks_exact(DIM_BLOCK).enumerate() {
            // SAFETY: columns c0..c0 + DIM_BLOCK of query head u·g + j belong to this task
            // alone, inside the n_head · hd outputs.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(op.0.add((u * g + j) * hd + c0), DIM_BLOCK)
            };
            dst.copy_from_slice(a);
        }
    });
}

/// The probabilities of each query's raw scores (the rows of `scores`, `step` apart, 1 to
/// [`simd::MAX_HEADS`] of them): scaled by `scale`, softmax with each row's sum in f64 in
/// element order, rounded to F16 when `round` (single-token decode over an F16 cache). The
/// rows' sums run side by side (a missing row's chain repeats the last row's, unused):
/// independent chains, each the same additions in the same order as one row alone.
fn softmax_rows(level: simd::Level, scores: &mut [f32], step: usize, scale: f32, round: bool) {
    let n = scores.len() / step;
    if n == 0 {
        return;
    }
    for row in scores.chunks_exact_mut(step) {
        row.iter_mut().for_each(|sc| *sc *= scale);
        let max = simd::max(level, row);
        simd::exp_shifted(level, row, max);
    }
    let rows: [&[f32]; simd::MAX_HEADS] =
        std::array::from_fn(|j| &scores[j.min(n - 1) * step..][..step]);
    let mut sums = [0f64; simd::MAX_HEADS];
    for i in 0..step {
        for (sum, row) in sums.iter_mut().zip(&rows) {
            *sum += f64::from(row[i]);
        }
    }
    for (row, &sum) in scores.chunks_exact_mut(step).zip(&sums) {
        let inv = (1.0 / sum) as f32;
        row.iter_mut().for_each(|sc| *sc *= inv);
        if round {
            simd::round_f16(level, row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With one key, attention returns that key's value whatever the query.
    #[test]
    fn single_key_returns_its_value() {
        let hd = 4;
        let q = vec![0.3f32; 2 * hd];
        let k: Vec<f16> = (0..hd).map(|i| f16::from_f32(i as f32)).collect();
        let v: Vec<f16> = (0..hd).map(|i| f16::from_f32(1.0 + i as f32)).collect();
        let mut out = vec![0.0; 2 * hd];
        let s = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: hd,
            pos0: 0,
            round_probs: false,
            capacity: 2,
        };
        let mut scratch = vec![0.0; 64 * pool::global().n_threads()];
        attention(&q, &k, &v, &s, &mut out, &mut scratch);
        assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
    }

    /// An F16 cache's pages of 32 positions.
    fn f16_pages(n_layer: usize, n_head_kv: usize, head_dim: usize) -> crate::kv::KvGeometry {
        crate::kv::KvGeometry {
            n_layer,
            n_head_kv,
            head_dim,
            page_size: 32,
            ty: KvType::F16,
        }
    }

    /// The paged cache (each head's rows of a page one run, several pages, a run prefetched
    /// ahead) gives the contiguous layout's results bit for bit, decode and prompt rows.
    #[test]
    fn paged_cache_equals_the_contiguous_one() {
        use crate::kv::{KvPool, KvSeq};
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(9);
        let (n_head, n_head_kv, hd) = (8, 2, 64);
        let kv_dim = n_head_kv * hd;
        // 75 positions: two full pages of 32 and a partial one.
        let n = 75;
        let geo = f16_pages(2, n_head_kv, hd);
        let mut values = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)).to_f32())
                .collect()
        };
        let (k, v) = (values(n * kv_dim), values(n * kv_dim));
        let q = values(3 * n_head * hd);
        let mut seq = KvSeq::new(KvPool::new(geo, 4), n);
        seq.reserve(n).unwrap();
        seq.write(0, &vec![0.5; n * kv_dim], &vec![0.5; n * kv_dim]);
        seq.write(1, &k, &v);
        seq.advance(n);
        let halves = |x: &[f32]| x.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>();
        let (k16, v16) = (halves(&k), halves(&v));
        let contiguous = Contiguous {
            k: &k16,
            v: &v16,
            kv_dim,
            head_dim: hd,
        };
        let heads = Heads {
            n_head,
            n_head_kv,
            head_dim: hd,
            window: None,
        };
        // A decode row at the last position, and prompt rows ending on and inside a page.
        let rows = [(n - 1, true), (31, false), (50, false)].map(|(pos, round_probs)| QueryRow {
            seq: 0,
            pos,
            round_probs,
        });
        let mut scratch = vec![0.0; attention_scratch(n, n_head, hd)];
        let mut got = vec![0.0; q.len()];
        let layer = seq.layer(1);
        attention_rows(&q, |_| layer, &rows, heads, n, &mut got, &mut scratch);
        let mut want = vec![0.0; q.len()];
        attention_rows(
            &q,
            |_| &contiguous,
            &rows,
            heads,
            n,
            &mut want,
            &mut scratch,
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    /// Grouped-query attention (tasks of several query heads sharing one kv head) gives
    /// bit for bit what the same heads give against a cache with each kv head repeated
    /// for every query head (one head per task), for groups of 4, 8 (two tasks of 4), 6
    /// (two of 3) and 5 (one head per task), with and without rounded probabilities.
    #[test]
    fn grouped_heads_equal_repeated_kv_heads() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(5);
        let (hd, pos0, t) = (128, 3, 9);
        let n = pos0 + t;
        for (n_head, n_head_kv) in [(8, 2), (8, 1), (6, 1), (5, 1)] {
            let group = n_head / n_head_kv;
            let mut half = |len: usize| -> Vec<f16> {
                (0..len)
                    .map(|_| f16::from_f32(rng.random_range(-2.0..2.0)))
                    .collect()
            };
            let (k, v) = (half(n * n_head_kv * hd), half(n * n_head_kv * hd));
            let q: Vec<f32> = (0..t * n_head * hd)
                .map(|_| rng.random_range(-2.0..2.0))
                .collect();
            // Position p, head h of the repeated cache is kv head h / group of p.
            let repeat = |c: &[f16]| -> Vec<f16> {
                (0..n * n_head)
                    .flat_map(|i| {
                        let (p, h) = (i / n_head, i % n_head);
                        c[(p * n_head_kv + h / group) * hd..][..hd].to_vec()
                    })
                    .collect()
            };
            let (kr, vr) = (repeat(&k), repeat(&v));
            for round_probs in [false, true] {
                let shape = |kv| AttnShape {
                    n_head,
                    n_head_kv: kv,
                    head_dim: hd,
                    pos0,
                    round_probs,
                    capacity: n,
                };
                let mut scratch = vec![0.0; attention_scratch(n, n_head, hd)];
                let mut got = vec![0.0; t * n_head * hd];
                attention(&q, &k, &v, &shape(n_head_kv), &mut got, &mut scratch);
                let mut want = vec![0.0; t * n_head * hd];
                attention(&q, &kr, &vr, &shape(n_head), &mut want, &mut scratch);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{n_head}/{n_head_kv} {round_probs}"
                );
            }
        }
    }

    /// A lone decode row over a long paged cache, split by positions and output columns
    /// ([`long_row`]), gives what one task per group of query heads gives
    /// ([`by_head_groups`]) bit for bit, and [`attention_rows`] the same: 2B-4T's heads and
    /// other groupings, lengths on both sides of [`SPLIT_FROM`] and off page and block
    /// boundaries, a sliding window, rounded probabilities or not.
    #[test]
    fn long_row_equals_tasks_by_heads() {
        use crate::kv::{KvPool, KvSeq};
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(11);
        for (n_head, n_head_kv, hd) in [(20, 5, 128), (8, 2, 64), (6, 1, 128), (4, 4, 64)] {
            let kv_dim = n_head_kv * hd;
            let n = 1000;
            let geo = f16_pages(1, n_head_kv, hd);
            let mut values = |len: usize| -> Vec<f32> {
                (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
            };
            let (k, v, q) = (values(n * kv_dim), values(n * kv_dim), values(n_head * hd));
            let mut seq = KvSeq::new(KvPool::new(geo, geo.pages_for(n)), n);
            seq.reserve(n).unwrap();
            seq.write(0, &k, &v);
            seq.advance(n);
            let layer = seq.layer(0);
            let mut scratch = vec![0.0; attention_scratch(n, n_head, hd)];
            let cases = [
                (70, None),
                (SPLIT_FROM - 1, None),
                (SPLIT_FROM, None),
                (450, None),
                (999, None),
                (999, Some(SPLIT_FROM + 16)),
            ];
            for ((pos, window), round_probs) in
                cases.into_iter().flat_map(|c| [(c, false), (c, true)])
            {
                let heads = Heads {
                    n_head,
                    n_head_kv,
                    head_dim: hd,
                    window,
                };
                let rows = [QueryRow {
                    seq: 0,
                    pos,
                    round_probs,
                }];
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let scratch_pt = (&mut scratch[..], per_thread(n, hd));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let mut split = vec![f32::NAN; n_head * hd];
                long_row(&q, &layer, (rows[0], first), heads, &mut split, scratch_pt);
                let mut grouped = vec![f32::NAN; n_head * hd];
                let scratch_pt = (&mut scratch[..], per_thread(n, hd));
                by_head_groups(&q, |_| layer, &rows, heads, &mut grouped, scratch_pt);
                let mut chosen = vec![f32::NAN; n_head * hd];
                attention_rows(&q, |_| layer, &rows, heads, n, &mut chosen, &mut scratch);
                let case = format!("{n_head}/{n_head_kv}/{hd} at {pos}, {window:?}, {round_probs}");
                assert_eq!(bits(&split), bits(&grouped), "{case}");
                assert_eq!(bits(&chosen), bits(&grouped), "{case}");
                assert!(split.iter().all(|v| v.is_finite()), "{case}");
            }
        }
    }

    /// Equal scores average the values; the second token sees both keys, the first one.
    #[test]
    fn causal_mask_and_average() {
        let hd = 2;
        let q = vec![0.0f32; 2 * hd];
        let k = vec![f16::ZERO; 2 * hd];
        let v: Vec<f16> = [2.0, 4.0, 6.0, 8.0].map(f16::from_f32).to_vec();
        let mut out = vec![0.0; 2 * hd];
        let s = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: hd,
            pos0: 0,
            round_probs: false,
            capacity: 2,
        };
        let mut scratch = vec![0.0; 64 * pool::global().n_threads()];
        attention(&q, &k, &v, &s, &mut out, &mut scratch);
        assert_eq!(out, vec![2.0, 4.0, 4.0, 6.0]);
    }
}
