//! Every dispatched kernel against its scalar reference, on random inputs of odd sizes.

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn random_i2s_row(rng: &mut StdRng, k: usize) -> Vec<u8> {
    // Codes 0..=2 only, as in real files.
    (0..k / 4)
        .map(|_| (0..4).fold(0u8, |b, i| b | (rng.random_range(0..3u8) << (2 * i))))
        .collect()
}

fn random_q(rng: &mut StdRng, k: usize) -> Vec<i8> {
    (0..k)
        .map(|_| rng.random_range(-128..=127i16) as i8)
        .collect()
}

#[test]
fn i2s_dot_matches_reference() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(3);
    for k in [128, 384, 2560, 6912] {
        let row = random_i2s_row(&mut rng, k);
        let qs: Vec<Vec<i8>> = (0..4).map(|_| random_q(&mut rng, k)).collect();
        let sums: Vec<i32> = qs
            .iter()
            .map(|q| q.iter().map(|&v| i32::from(v)).sum())
            .collect();
        let want: Vec<i32> = qs.iter().map(|q| quant::i2s::dot(&row, q)).collect();
        for t in 0..4 {
            assert_eq!(
                i2s_dot(level, &row, &qs[t], sums[t]),
                want[t],
                "k={k} t={t}"
            );
        }
        let four = i2s_dot4(
            level,
            &row,
            [&qs[0], &qs[1], &qs[2], &qs[3]],
            [sums[0], sums[1], sums[2], sums[3]],
        );
        assert_eq!(four.to_vec(), want, "k={k} dot4");
    }
}

#[test]
fn i2s_dot_extremes_are_exact() {
    // All +1 against all −128 and all 127: the largest magnitudes the kernel can see.
    let level = Level::detect();
    let k = 6912;
    let row = vec![0b10_10_10_10u8; k / 4];
    for v in [-128i8, 127] {
        let q = vec![v; k];
        let sum = i32::from(v) * k as i32;
        assert_eq!(i2s_dot(level, &row, &q, sum), sum);
    }
}

#[test]
fn f16_kernels_match_reference() {
    let mut rng = StdRng::seed_from_u64(5);
    for (level, n) in levels()
        .into_iter()
        .flat_map(|l| [1, 7, 8, 31, 33, 64, 127, 150, 2560, 2600].map(|n| (l, n)))
    {
        let w: Vec<f16> = (0..n)
            .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let bytes: Vec<u8> = w.iter().flat_map(|h| h.to_le_bytes()).collect();
        let want: f64 = w
            .iter()
            .zip(&x)
            .map(|(a, b)| f64::from(a.to_f32()) * f64::from(*b))
            .sum();
        let tol = 1e-5 * (n as f64).sqrt() + 1e-6;
        assert!(
            (f64::from(f16_dot(level, &bytes, &x)) - want).abs() < tol,
            "{level:?} f16_dot n={n}"
        );
        assert!(
            (f64::from(f16_dot_halves(level, &w, &x)) - want).abs() < tol,
            "{level:?} halves n={n}"
        );
        let mut out = x.clone();
        f16_axpy(level, &mut out, 0.5, &w);
        for i in 0..n {
            assert!(
                (out[i] - (x[i] + 0.5 * w[i].to_f32())).abs() < 1e-6,
                "axpy n={n} i={i}"
            );
        }
    }
}

/// The attention kernels over runs of rows (`f16_scores`, `f16_weighted_sum`) return, at
/// every level, bit for bit what the row-at-a-time kernels return at the AVX2 level (the
/// numerics the AVX-512 kernels keep) and at their own level, for head widths that take
/// the AVX-512 path and widths that do not, rows inside wider strided rows, runs of whole
/// blocks of eight keys and runs with a tail.
#[test]
fn attention_runs_equal_row_at_a_time_kernels() {
    let mut rng = StdRng::seed_from_u64(11);
    let shapes = [16, 32, 40, 64, 80, 96, 128, 144, 256]
        .into_iter()
        .flat_map(|hd| [(hd, 37), (hd, 8), (hd, 1)])
        .chain([(128, 16), (128, 23), (32, 7)]);
    for (hd, n) in shapes {
        let (stride, off) = (3 * hd + 16, hd + 8);
        let rows: Vec<f16> = (0..n * stride)
            .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)))
            .collect();
        let q: Vec<f32> = (0..hd)
            .map(|_| f16::from_f32(rng.random_range(-3.0..3.0)).to_f32())
            .collect();
        let w: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..0.2)).collect();
        let row = |i: usize| &rows[off + i * stride..][..hd];
        for level in levels() {
            let reference = match level {
                Level::Avx512 => Level::Avx2,
                other => other,
            };
            for lv in [level, reference] {
                let mut scores = vec![0f32; n];
                f16_scores(level, &q, &rows[off..], stride, &mut scores);
                for (i, &sc) in scores.iter().enumerate() {
                    let want = f16_dot_halves(lv, row(i), &q);
                    assert_eq!(
                        sc.to_bits(),
                        want.to_bits(),
                        "{level:?}/{lv:?} hd={hd} n={n} key {i}"
                    );
                }
                let mut got = vec![0.25f32; hd];
                f16_weighted_sum(level, &w, &rows[off..], stride, &mut got);
                let mut want = vec![0.25f32; hd];
                for (i, &wi) in w.iter().enumerate() {
                    f16_axpy(lv, &mut want, wi, row(i));
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{level:?}/{lv:?} hd={hd} n={n} values"
                );
            }
        }
    }
}

/// The grouped-query kernels (`f16_scores_heads`, `f16_weighted_sum_heads`) give each of
/// their 1 to 4 queries bit for bit what the one-query kernels give it, at every level, for
/// head widths on and off the AVX-512 path, runs with and without a tail of keys, strided
/// rows and output rows wider than the run.
#[test]
fn grouped_attention_kernels_equal_one_query_kernels() {
    let mut rng = StdRng::seed_from_u64(13);
    for (hd, n) in [
        (128, 37),
        (128, 1),
        (32, 16),
        (64, 9),
        (40, 5),
        (16, 3),
        (256, 11),
    ] {
        let (stride, off, wide) = (3 * hd + 16, hd + 8, n + 3);
        let rows: Vec<f16> = (0..n * stride)
            .map(|_| f16::from_f32(rng.random_range(-4.0..4.0)))
            .collect();
        for g in 1..=MAX_HEADS {
            let q: Vec<f32> = (0..g * hd)
                .map(|_| f16::from_f32(rng.random_range(-3.0..3.0)).to_f32())
                .collect();
            let w: Vec<f32> = (0..g * wide).map(|_| rng.random_range(0.0..0.2)).collect();
            for level in levels() {
                let mut scores = vec![f32::NAN; g * wide];
                let keys = (&rows[off..], stride, n);
                f16_scores_heads(level, (&q, hd), keys, &mut scores, wide);
                let mut got = vec![0.25f32; g * hd];
                f16_weighted_sum_heads(level, (&w, wide), keys, &mut got, hd);
                for j in 0..g {
                    let mut want = vec![0f32; n];
                    f16_scores(level, &q[j * hd..][..hd], &rows[off..], stride, &mut want);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!("{level:?} hd={hd} n={n} g={g} query {j}");
                    assert_eq!(bits(&scores[j * wide..][..n]), bits(&want), "{what} scores");
                    let mut want = vec![0.25f32; hd];
                    let wj = &w[j * wide..][..n];
                    f16_weighted_sum(level, wj, &rows[off..], stride, &mut want);
                    assert_eq!(bits(&got[j * hd..][..hd]), bits(&want), "{what} values");
                }
            }
        }
    }
}

/// `round_f16` equals the `half` crate's conversion there and back at every level: ties,
/// subnormals, overflow to infinity, and every length of tail.
#[test]
fn round_f16_equals_the_scalar_conversion() {
    let mut rng = StdRng::seed_from_u64(12);
    let mut v: Vec<f32> = (0..200)
        .map(|i| match i % 5 {
            0 => rng.random_range(-70000.0..70000.0),
            1 => rng.random_range(-1e-6..1e-6),
            // An exact tie between two halves: 1 + 2^-11 (and its neighbours).
            2 => 1.0 + f32::powi(2.0, -11) * (1.0 + rng.random_range(-1..=1) as f32 * 1e-7),
            _ => rng.random_range(-3.0..3.0),
        })
        .collect();
    v.extend([
        65520.0,
        -65519.0,
        f32::INFINITY,
        0.0,
        -0.0,
        5.96e-8,
        2.98e-8,
    ]);
    for level in levels() {
        for n in [0, 1, 15, 16, 17, 33, v.len()] {
            let mut got = v[..n].to_vec();
            round_f16(level, &mut got);
            for (g, &x) in got.iter().zip(&v) {
                let want = f16::from_f32(x).to_f32();
                assert_eq!(g.to_bits(), want.to_bits(), "{level:?} n={n} x={x:e}");
            }
        }
    }
}

/// The per-token quantizer at every level equals the reference bit for bit: every tail
/// length, all-zero rows (the 1e-5 floor), values at the rounding ties, and rows with a
/// NaN or an infinity.
#[test]
fn per_token_quantizer_equals_the_reference() {
    let mut rng = StdRng::seed_from_u64(13);
    for n in [1, 15, 16, 17, 100, 2560, 6912] {
        let random: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();
        let ties: Vec<f32> = (0..n).map(|i| (i % 255) as f32 - 127.0 + 0.5).collect();
        let mut odd = random.clone();
        odd[n / 2] = f32::NAN;
        let mut inf = random.clone();
        inf[n - 1] = f32::INFINITY;
        for x in [random, ties, vec![0.0; n], vec![1e-7; n], odd, inf] {
            let mut want = vec![0i8; n];
            let p = quant::act::quantize_per_token(&x, &mut want);
            for level in levels() {
                let mut got = vec![0i8; n];
                let g = quantize_per_token(level, &x, &mut got);
                assert_eq!(got, want, "{level:?} n={n}");
                assert_eq!(
                    (g.scale.to_bits(), g.sum),
                    (p.scale.to_bits(), p.sum),
                    "{level:?}"
                );
            }
        }
    }
}

/// The Q8_K quantizer (and its block sums) at every level equals the reference bit for
/// bit: random rows, an all-zero block, the largest |x| twice with opposite signs (the
/// first one's sign wins), NaN and infinity.
#[test]
fn q8k_quantizer_equals_the_reference() {
    let mut rng = StdRng::seed_from_u64(15);
    let n = 4 * 256;
    let mut x: Vec<f32> = (0..n).map(|_| rng.random_range(-6.0..6.0)).collect();
    x[256..512].fill(0.0);
    x[600] = -9.5;
    x[700] = 9.5;
    // Ties of |x| (the first decides the sign): inside one group of sixteen, and across
    // groups.
    x[1000] = 8.0;
    x[1001] = -8.0;
    x[20] = -7.5;
    x[40] = 7.5;
    let mut special = x.clone();
    special[10] = f32::NAN;
    special[900] = f32::NEG_INFINITY;
    for x in [x, special] {
        let (mut want, mut wd) = (vec![0i8; n], vec![0f32; 4]);
        quant::act::quantize_q8k(&x, &mut want, &mut wd);
        let wsum: Vec<i32> = want
            .chunks(256)
            .map(|b| b.iter().map(|&v| i32::from(v)).sum())
            .collect();
        for level in levels() {
            let (mut q, mut d, mut bsum) = (vec![0i8; n], vec![0f32; 4], vec![0i32; 4]);
            quantize_q8k(level, &x, &mut q, &mut d, &mut bsum);
            assert_eq!(q, want, "{level:?}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&d), bits(&wd), "{level:?}");
            assert_eq!(bsum, wsum, "{level:?}");
        }
    }
}

#[test]
fn tq2_dot_is_bit_identical_to_reference() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(9);
    for k in [256, 768, 2560] {
        let w: Vec<f32> = (0..k)
            .map(|_| rng.random_range(-1i32..=1) as f32 * 0.37)
            .collect();
        let mut row = vec![0u8; k / 256 * 66];
        quant::tq2_0::quantize_row(&w, &mut row);
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; k / 256];
        quant::act::quantize_q8k(&x, &mut q, &mut d);
        let bsums: Vec<i32> = q
            .chunks(256)
            .map(|b| b.iter().map(|&v| i32::from(v)).sum())
            .collect();
        let want = quant::tq2_0::dot_q8k(&row, &q, &d);
        assert_eq!(
            tq2_dot_q8k(level, &row, &q, &d, &bsums).to_bits(),
            want.to_bits(),
            "k={k}"
        );
    }
}

#[test]
fn q8_0_dot_matches_reference() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(11);
    for k in [32, 96, 2560] {
        let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut row = vec![0u8; k / 32 * 34];
        quant::q8_0::quantize_row(&w, &mut row);
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; k / 32];
        quant::act::quantize_q8_0(&x, &mut q, &mut d);
        let want = quant::q8_0::dot_q8_0(&row, &q, &d);
        let got = q8_0_dot(level, &row, &q, &d);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "k={k}: {got} vs {want}"
        );
    }
}

/// Review finding (quant_blocks target): `f16_dot` is a safe function, but its AVX2 path
/// read `x.len()` halves from `w` without checking `w`'s length, an out-of-bounds read for
/// a short row. It now asserts the lengths on every level, as the scalar kernel does.
#[test]
#[should_panic(expected = "length mismatch")]
fn f16_dot_rejects_a_short_row() {
    f16_dot(Level::detect(), &[0u8; 2], &[1.0f32; 64]);
}

#[test]
fn q4_0_dot_matches_reference() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(13);
    for k in [32, 96, 2560] {
        let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut row = vec![0u8; k / 32 * 18];
        quant::q4_0::quantize_row(&w, &mut row);
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; k / 32];
        quant::act::quantize_q8_0(&x, &mut q, &mut d);
        let want = quant::q4_0::dot_q8_0(&row, &q, &d);
        let got = q4_0_dot(level, &row, &q, &d);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "k={k}: {got} vs {want}"
        );
    }
}

#[test]
fn q5_0_dot_matches_reference() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(15);
    for k in [32, 96, 2560] {
        let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut row = vec![0u8; k / 32 * 22];
        quant::q5_0::quantize_row(&w, &mut row);
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; k / 32];
        quant::act::quantize_q8_0(&x, &mut q, &mut d);
        let want = quant::q5_0::dot_q8_0(&row, &q, &d);
        let got = q5_0_dot(level, &row, &q, &d);
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "k={k}: {got} vs {want}"
        );
    }
}

#[test]
fn k_quant_dots_are_bit_identical_to_reference() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(14);
    for k in [256, 768, 2560] {
        let nb = k / 256;
        let mut r4: Vec<u8> = (0..nb * 144).map(|_| rng.random()).collect();
        let mut r6: Vec<u8> = (0..nb * 210).map(|_| rng.random()).collect();
        for b in 0..nb {
            r4[b * 144..b * 144 + 2].copy_from_slice(&f16::from_f32(0.031).to_le_bytes());
            r4[b * 144 + 2..b * 144 + 4].copy_from_slice(&f16::from_f32(0.017).to_le_bytes());
            r6[b * 210 + 208..b * 210 + 210].copy_from_slice(&f16::from_f32(0.009).to_le_bytes());
        }
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; nb];
        quant::act::quantize_q8k(&x, &mut q, &mut d);
        assert_eq!(
            q4_k_dot_q8k(level, &r4, &q, &d).to_bits(),
            quant::q4_k::dot_q8k(&r4, &q, &d).to_bits(),
            "q4_k k={k}"
        );
        // Q6_K at every level, also against activations at the int8 extremes.
        let extremes: Vec<i8> = (0..k).map(|i| [127, -128, -127][i % 3]).collect();
        for q in [&q, &extremes] {
            let want = quant::q6_k::dot_q8k(&r6, q, &d).to_bits();
            for lv in levels() {
                assert_eq!(
                    q6_k_dot_q8k(lv, &r6, q, &d).to_bits(),
                    want,
                    "q6_k {lv:?} k={k}"
                );
            }
        }
    }
}

#[test]
fn q6_k_quads_are_bit_identical_to_the_reference() {
    let mut rng = StdRng::seed_from_u64(15);
    for k in [256, 512, 2560] {
        let (nb, rb) = (k / 256, k / 256 * 210);
        // Six rows of random bytes (every code, every scale) with F16 block scales of both
        // signs and several sizes: one quad and two rows that stay plain.
        let mut rows: Vec<u8> = (0..6 * rb).map(|_| rng.random()).collect();
        for (i, b) in rows.chunks_exact_mut(210).enumerate() {
            let s = f16::from_f32([0.009, -0.013, 3.5e-5, -2.0, 0.5][i % 5]);
            b[208..].copy_from_slice(&s.to_le_bytes());
        }
        let mut quads = rows.clone();
        q6_k_interleave(&mut quads, rb);
        assert_eq!(
            quads[4 * rb..],
            rows[4 * rb..],
            "rows past the last quad stay"
        );
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; nb];
        quant::act::quantize_q8k(&x, &mut q, &mut d);
        let extremes: Vec<i8> = (0..k).map(|i| [127, -128, -127, 5][i % 4]).collect();
        for q in [&q, &extremes] {
            for lv in levels() {
                let got = q6_k_dot4_q8k(lv, &quads[..4 * rb], q, &d);
                for (r, row) in rows.chunks_exact(rb).take(4).enumerate() {
                    let want = quant::q6_k::dot_q8k(row, q, &d);
                    assert_eq!(got[r].to_bits(), want.to_bits(), "{lv:?} k={k} row {r}");
                }
            }
        }
    }
}

#[test]
fn q8_0_dot4_equals_four_dots() {
    let level = Level::detect();
    let mut rng = StdRng::seed_from_u64(12);
    let k = 2560;
    let w: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut row = vec![0u8; k / 32 * 34];
    quant::q8_0::quantize_row(&w, &mut row);
    let mut qs = vec![vec![0i8; k]; 4];
    let mut ds = vec![vec![0f32; k / 32]; 4];
    for t in 0..4 {
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        quant::act::quantize_q8_0(&x, &mut qs[t], &mut ds[t]);
    }
    let four = q8_0_dot4(
        level,
        &row,
        [&qs[0], &qs[1], &qs[2], &qs[3]],
        [&ds[0], &ds[1], &ds[2], &ds[3]],
    );
    for t in 0..4 {
        assert_eq!(
            four[t].to_bits(),
            q8_0_dot(level, &row, &qs[t], &ds[t]).to_bits()
        );
    }
}

/// At every level, `f16_dot4` equals four `f16_dot` calls bit for bit, for widths that end
/// after whole 32-half steps and widths with 8-wide steps and single halves left.
#[test]
fn f16_dot4_equals_four_dots() {
    let mut rng = StdRng::seed_from_u64(13);
    for k in [7, 40, 150, 264, 2560, 2563, 2576, 2600] {
        let row: Vec<u8> = (0..k)
            .flat_map(|_| f16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
            .collect();
        let xs: Vec<Vec<f32>> = (0..4)
            .map(|_| (0..k).map(|_| rng.random_range(-3.0..3.0)).collect())
            .collect();
        for level in levels() {
            let four = f16_dot4(level, &row, [&xs[0], &xs[1], &xs[2], &xs[3]]);
            for t in 0..4 {
                assert_eq!(
                    four[t].to_bits(),
                    f16_dot(level, &row, &xs[t]).to_bits(),
                    "{level:?} k={k} t={t}"
                );
            }
        }
    }
}

/// Every level this CPU can run, the portable one included.
fn levels() -> Vec<Level> {
    let mut v = vec![Level::Scalar];
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        v.push(Level::Avx2);
    }
    if !v.contains(&Level::detect()) {
        v.push(Level::detect());
    }
    v
}

/// `k / block_elems` random 18-byte blocks (every code, 3 included) with random positive
/// and negative F16 scales.
fn random_bits_row(rng: &mut StdRng, k: usize, block_elems: usize) -> Vec<u8> {
    let mut row: Vec<u8> = (0..k / block_elems * 18).map(|_| rng.random()).collect();
    for b in row.chunks_exact_mut(18) {
        b[..2].copy_from_slice(&f16::from_f32(rng.random_range(-0.2..0.2)).to_le_bytes());
    }
    row
}

/// Q8_0 activations of one token: quantized random floats, or raw int8 (−128 included)
/// with random scales.
fn random_q80(rng: &mut StdRng, k: usize, raw: bool) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
    let (mut q, mut d) = (vec![0i8; k], vec![0f32; k / 32]);
    if raw {
        q = random_q(rng, k);
        d.iter_mut().for_each(|v| *v = rng.random_range(0.001..0.1));
    } else {
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        quant::act::quantize_q8_0(&x, &mut q, &mut d);
    }
    let sum = q
        .chunks(32)
        .map(|b| b.iter().map(|&v| i32::from(v)).sum())
        .collect();
    (q, d, sum)
}

#[test]
fn q1_0_and_q2_0_dots_are_bit_identical_at_every_level() {
    type Reference = fn(&[u8], &[i8], &[f32]) -> f32;
    let mut rng = StdRng::seed_from_u64(41);
    let formats: [(usize, Reference, &[usize]); 2] = [
        (128, quant::q1_0::dot_q8_0, &[128, 384, 2048, 6144]),
        (64, quant::q2_0::dot_q8_0, &[64, 192, 320, 2048, 6144]),
    ];
    for level in levels() {
        for &(block, reference, widths) in &formats {
            for &k in widths {
                let row = random_bits_row(&mut rng, k, block);
                let acts: Vec<_> = (0..4)
                    .map(|t| random_q80(&mut rng, k, t % 2 == 1))
                    .collect();
                let rows: Vec<Q80Rows> = acts
                    .iter()
                    .map(|(q, d, sum)| Q80Rows { q, d, sum })
                    .collect();
                let x4: [Q80Rows; 4] = std::array::from_fn(|t| rows[t]);
                let four = if block == 128 {
                    q1_0_dots(level, &row, x4)
                } else {
                    q2_0_dots(level, &row, x4)
                };
                for (t, (q, d, ..)) in acts.iter().enumerate() {
                    let want = reference(&row, q, d);
                    let one = if block == 128 {
                        q1_0_dots(level, &row, [rows[t]])
                    } else {
                        q2_0_dots(level, &row, [rows[t]])
                    };
                    let ctx = format!("{level:?} block={block} k={k} t={t}");
                    assert_eq!(one[0].to_bits(), want.to_bits(), "{ctx}");
                    assert_eq!(four[t].to_bits(), want.to_bits(), "{ctx} (4 tokens)");
                }
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
#[path = "neon_tests.rs"]
mod neon;

/// One token against a 16-row group of any whole number of chunks, odd counts included
/// (the one-token kernel takes chunks in pairs and the last alone), against the layout's
/// scalar sum: bit 2s of byte 4r + i of chunk c holds row r's code at element 16c + 4s + i.
#[test]
fn one_token_group_products_are_exact_for_any_chunk_count() {
    let tiles = Vnni::get()
        .map(Tiles::Vnni)
        .into_iter()
        .chain(Tiles::avx2_present());
    for v in tiles {
        let mut rng = StdRng::seed_from_u64(21);
        for chunks in [1, 2, 3, 16, 161] {
            let k = chunks * CHUNK_ELEMS;
            let codes: Vec<[u8; 16]> = (0..k)
                .map(|_| std::array::from_fn(|_| rng.random_range(0..3u8)))
                .collect();
            let group: Vec<Chunk> = (0..chunks)
                .map(|c| {
                    Chunk(std::array::from_fn(|b| {
                        let (r, i) = (b / 4, b % 4);
                        (0..4).fold(0u8, |w, s| w | codes[16 * c + 4 * s + i][r] << (2 * s))
                    }))
                })
                .collect();
            let q = random_q(&mut rng, k);
            let sum: i32 = q.iter().map(|&x| i32::from(x)).sum();
            let mut out = [[f32::NAN; 16]; 1];
            v.per_token_dots(&group, &q, &[sum], &[1.0], 1.0, OutCols::tile(&mut out));
            for (r, got) in out[0].iter().enumerate() {
                let dot: i32 = (0..k)
                    .map(|e| i32::from(codes[e][r]) * i32::from(q[e]))
                    .sum();
                assert_eq!(
                    got.to_bits(),
                    ((dot - sum) as f32).to_bits(),
                    "{v:?} chunks={chunks} row={r}"
                );
            }
        }
    }
}
