//! Micro-benchmarks of the CPU kernels at BitNet 2B-4T sizes (`cargo bench -p ternion`).
//! One call = one weight row against one (or four) activation rows, as in a matmul.

use divan::{black_box, Bencher};
use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ternion::backend::cpu::simd::{self, Level};
use ternion::quant;

const SIZES: &[usize] = &[2560, 6912];

fn main() {
    divan::main();
}

fn i2s_row(rng: &mut StdRng, k: usize) -> Vec<u8> {
    (0..k / 4)
        .map(|_| (0..4).fold(0u8, |b, i| b | (rng.random_range(0..3u8) << (2 * i))))
        .collect()
}

fn q_row(rng: &mut StdRng, k: usize) -> Vec<i8> {
    (0..k)
        .map(|_| rng.random_range(-127..=127i16) as i8)
        .collect()
}

/// The level's I2_S row kernel: NEON, or the scalar reference on x86, which repacks I2_S
/// for the tile kernels below (counter: weight bytes).
#[divan::bench(args = SIZES)]
fn i2s_dot(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let (row, q) = (i2s_row(&mut rng, k), q_row(&mut rng, k));
    let level = Level::detect();
    bencher
        .counter(divan::counter::BytesCount::new(k / 4))
        .bench(|| simd::i2s_dot(level, black_box(&row), black_box(&q), 0));
}

/// The scalar reference dot (counter: weight bytes).
#[divan::bench(args = SIZES)]
fn i2s_dot_scalar(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let (row, q) = (i2s_row(&mut rng, k), q_row(&mut rng, k));
    bencher
        .counter(divan::counter::BytesCount::new(k / 4))
        .bench(|| quant::i2s::dot(black_box(&row), black_box(&q)));
}

/// The level's four-token I2_S row kernel (NEON; scalar on x86, as above).
#[divan::bench(args = SIZES)]
fn i2s_dot4(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let row = i2s_row(&mut rng, k);
    let qs: Vec<Vec<i8>> = (0..4).map(|_| q_row(&mut rng, k)).collect();
    let level = Level::detect();
    bencher.bench(|| {
        simd::i2s_dot4(
            level,
            black_box(&row),
            [&qs[0], &qs[1], &qs[2], &qs[3]],
            [0; 4],
        )
    });
}

/// The level's TQ2_0 row kernel (NEON; scalar on x86, which repacks TQ2_0).
#[divan::bench(args = SIZES)]
fn tq2_dot_q8k(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1i32..=1) as f32).collect();
    let mut row = vec![0u8; k / 256 * 66];
    quant::tq2_0::quantize_row(&w, &mut row);
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let (mut q, mut d) = (vec![0i8; k], vec![0f32; k / 256]);
    quant::act::quantize_q8k(&x, &mut q, &mut d);
    let bsums = vec![0i32; k / 256];
    let level = Level::detect();
    bencher.bench(|| simd::tq2_dot_q8k(level, black_box(&row), &q, &d, &bsums));
}

#[divan::bench(args = [2560])]
fn f16_dot(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let w: Vec<u8> = (0..k)
        .flat_map(|_| f16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
        .collect();
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let level = Level::detect();
    bencher
        .counter(divan::counter::BytesCount::new(2 * k))
        .bench(|| simd::f16_dot(level, black_box(&w), black_box(&x)));
}

/// One query head (128 wide) against `n` F16 keys of a 2B-4T cache row (five kv heads,
/// 640 halves per position): the attention scores of one (row, head) task.
#[divan::bench(args = [128, 1024])]
fn f16_scores(bencher: Bencher, n: usize) {
    let (hd, stride) = (128, 640);
    let mut rng = StdRng::seed_from_u64(1);
    let keys: Vec<f16> = (0..n * stride)
        .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
        .collect();
    let q: Vec<f32> = (0..hd).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut out = vec![0f32; n];
    let level = Level::detect();
    bencher
        .counter(divan::counter::ItemsCount::new(n))
        .bench_local(|| simd::f16_scores(level, black_box(&q), black_box(&keys), stride, &mut out));
}

/// `g` query heads (128 wide) against 256 F16 keys of a 2B-4T cache row, scores then
/// probabilities times values: one grouped-query attention task over an F16 cache.
#[divan::bench(args = [1, 2, 4])]
fn attention_heads(bencher: Bencher, g: usize) {
    let (hd, stride, n) = (128, 640, 256);
    let mut rng = StdRng::seed_from_u64(1);
    let mut halves = |len: usize| -> Vec<f16> {
        (0..len)
            .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
            .collect()
    };
    let (keys, values) = (halves(n * stride), halves(n * stride));
    let q: Vec<f32> = (0..g * hd).map(|i| (i % 7) as f32 * 0.1).collect();
    let (mut scores, mut out) = (vec![0f32; g * n], vec![0f32; g * hd]);
    let level = Level::detect();
    bencher
        .counter(divan::counter::ItemsCount::new(g))
        .bench_local(|| {
            simd::f16_scores_heads(level, (&q, hd), (&keys, stride, n), &mut scores, n);
            scores.iter_mut().for_each(|s| *s = s.abs() * 1e-3);
            simd::f16_weighted_sum_heads(level, (&scores, n), (&values, stride, n), &mut out, hd);
            black_box(&out);
        });
}

#[divan::bench(args = [2560])]
fn q8_0_dot(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut row = vec![0u8; k / 32 * 34];
    quant::q8_0::quantize_row(&w, &mut row);
    let (mut q, mut d) = (vec![0i8; k], vec![0f32; k / 32]);
    quant::act::quantize_q8_0(&w, &mut q, &mut d);
    let level = Level::detect();
    bencher.bench(|| simd::q8_0_dot(level, black_box(&row), &q, &d));
}

/// One Q6_K row (as a quantized LM head's) against Q8_K activations (counter: weight
/// bytes; `TERNION_SIMD=avx2` runs the AVX2 kernel for comparison).
#[divan::bench(args = [2560])]
fn q6_k_dot_q8k(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut row = vec![0u8; k / 256 * 210];
    quant::q6_k::quantize_row(&w, &mut row);
    let (mut q, mut d) = (vec![0i8; k], vec![0f32; k / 256]);
    quant::act::quantize_q8k(&w, &mut q, &mut d);
    let level = Level::detect();
    bencher
        .counter(divan::counter::BytesCount::new(row.len()))
        .bench(|| simd::q6_k_dot_q8k(level, black_box(&row), &q, &d));
}

/// Four Q6_K rows interleaved in a quad (as the LM head requantized where AVX-512 runs)
/// against Q8_K activations, over 40 quads (336 KB, inside L2): the head kernel's
/// arithmetic rate (counter: weight bytes).
#[divan::bench(args = [2560])]
fn q6_k_dot4_q8k_l2(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let row_bytes = k / 256 * 210;
    let mut rows = vec![0u8; 40 * 4 * row_bytes];
    for row in rows.chunks_exact_mut(row_bytes) {
        let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
        quant::q6_k::quantize_row(&w, row);
    }
    simd::q6_k_interleave(&mut rows, row_bytes);
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let (mut q, mut d) = (vec![0i8; k], vec![0f32; k / 256]);
    quant::act::quantize_q8k(&x, &mut q, &mut d);
    let level = Level::detect();
    bencher
        .counter(divan::counter::BytesCount::new(rows.len()))
        .bench(|| {
            for quad in rows.chunks_exact(4 * row_bytes) {
                black_box(simd::q6_k_dot4_q8k(level, black_box(quad), &q, &d));
            }
        });
}

/// One activation row quantized per token (I2_S inputs) on the dispatched kernel.
#[divan::bench(args = SIZES)]
fn quantize_per_token(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
    let mut q = vec![0i8; k];
    let level = Level::detect();
    bencher.bench_local(|| simd::quantize_per_token(level, black_box(&x), &mut q));
}

/// 16 weight rows of `k` codes in the CPU ternary layout (codes 0..=2) and 16 token rows.
/// One activation row quantized to Q8_K (TQ2_0 / TQ1_0 inputs, the Q6_K head's input) on
/// the dispatched kernel.
#[divan::bench(args = SIZES)]
fn quantize_q8k(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
    let (mut q, mut d, mut bsum) = (vec![0i8; k], vec![0f32; k / 256], vec![0i32; k / 256]);
    let level = Level::detect();
    bencher.bench_local(|| simd::quantize_q8k(level, black_box(&x), &mut q, &mut d, &mut bsum));
}

fn ternary_tile(rng: &mut StdRng, k: usize) -> (Vec<simd::Chunk>, Vec<i8>) {
    let group = (0..k / simd::CHUNK_ELEMS)
        .map(|_| simd::Chunk(std::array::from_fn(|_| rng.random::<u8>() & 0b1001_1001)))
        .collect();
    (group, q_row(rng, 16 * k))
}

/// One 16-row group against 16 tokens with the interleaved-layout kernel of the chosen
/// level (AVX-512 VNNI; AVX2 under `TERNION_SIMD=avx2`; counter: multiply-adds).
#[divan::bench(args = SIZES)]
fn tiles_per_token_dots_16x16(bencher: Bencher, k: usize) {
    let Some(v) = simd::Tiles::get() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(1);
    let (group, q) = ternary_tile(&mut rng, k);
    let (sum, scale) = ([0i32; 16], [1f32; 16]);
    let mut out = [[0f32; 16]; 16];
    bencher
        .counter(divan::counter::ItemsCount::new(16 * 16 * k))
        .bench_local(|| {
            v.per_token_dots(
                black_box(&group),
                &q,
                &sum,
                &scale,
                1.0,
                simd::OutCols::tile(&mut out),
            )
        });
}

/// One 16-row group against 16 tokens of Q8_K activations with per-block weight scales
/// (TQ2_0 / TQ1_0 prompts; the chosen level's kernel, as above; counter: multiply-adds).
#[divan::bench(args = SIZES)]
fn tiles_block_dots_16x16(bencher: Bencher, k: usize) {
    let Some(v) = simd::Tiles::get() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(1);
    let (group, q) = ternary_tile(&mut rng, k);
    let nb = k / simd::SCALE_BLOCK;
    let scales = vec![f16::from_f32(0.5); nb * simd::GROUP_ROWS];
    let (d, bsum) = (vec![0.01f32; 16 * nb], vec![3i32; 16 * nb]);
    let x = simd::Q8kRows {
        q: &q,
        d: &d,
        bsum: &bsum,
    };
    let mut out = [[0f32; 16]; 16];
    bencher
        .counter(divan::counter::ItemsCount::new(16 * 16 * k))
        .bench_local(|| {
            v.block_dots(
                black_box(&group),
                &scales,
                x,
                1.0,
                simd::OutCols::tile(&mut out),
            )
        });
}

/// The same work (16 rows × 16 tokens) with the level's row kernel `i2s_dot4` (NEON; scalar on x86).
#[divan::bench(args = SIZES)]
fn i2s_dot4_16x16(bencher: Bencher, k: usize) {
    let mut rng = StdRng::seed_from_u64(1);
    let rows: Vec<Vec<u8>> = (0..16).map(|_| i2s_row(&mut rng, k)).collect();
    let qs: Vec<Vec<i8>> = (0..16).map(|_| q_row(&mut rng, k)).collect();
    let level = Level::detect();
    bencher
        .counter(divan::counter::ItemsCount::new(16 * 16 * k))
        .bench_local(|| {
            for row in &rows {
                for t in qs.chunks_exact(4) {
                    let q = [&t[0][..], &t[1], &t[2], &t[3]];
                    black_box(simd::i2s_dot4(level, black_box(row), q, [0; 4]));
                }
            }
        });
}

/// One token against 6400 groups of 16 rows (64 MB of weights, far more than the caches
/// hold), as a decode step's matrix-vector product streams them (counter: weight bytes).
#[divan::bench(args = [2560])]
fn tiles_per_token_dot1_stream(bencher: Bencher, k: usize) {
    dot1_groups(bencher, k, 6400);
}

/// The same product over 40 groups (400 KB, inside L2): the kernel's arithmetic rate,
/// the ceiling a streamed product would meet if memory were free (counter: weight bytes).
#[divan::bench(args = [2560])]
fn tiles_per_token_dot1_l2(bencher: Bencher, k: usize) {
    dot1_groups(bencher, k, 40);
}

/// One token against `groups` groups of 16 rows of width `k`, group after group.
fn dot1_groups(bencher: Bencher, k: usize, groups: usize) {
    let Some(v) = simd::Tiles::get() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(1);
    let (tile, q) = ternary_tile(&mut rng, k);
    let weights: Vec<simd::Chunk> = (0..groups).flat_map(|_| tile.iter().copied()).collect();
    let q = &q[..k];
    let mut out = [[0f32; 16]; 1];
    let bytes = std::mem::size_of_val(weights.as_slice());
    bencher
        .counter(divan::counter::BytesCount::new(bytes))
        .bench_local(|| {
            for group in weights.chunks_exact(k / simd::CHUNK_ELEMS) {
                v.per_token_dots(
                    black_box(group),
                    q,
                    &[0],
                    &[1.0],
                    1.0,
                    simd::OutCols::tile(&mut out),
                );
            }
        });
}
