//! RMSNorm's mean squares, `(Σ_e f64(x_e · x_e) / n) as f32` of each row with the sum in
//! element order from 0 (ggml's order), bit for bit. One row's chain of f64 additions
//! cannot be split without changing its roundings, so:
//! - blocks of sixteen rows (a prompt's) go side by side: AVX-512 holds eight rows' sums
//!   in one register and adds each row's next square to its own lane, after an 8 × 8
//!   transpose of eight rows' next eight squares — the same f32 products, exact
//!   conversions and f64 additions in the same order per row as the chain;
//! - every other row (a decode step's, the rest of a prompt's, every row below AVX-512) is
//!   summed in independent chains, and the element-order chain's mean is proved to be the
//!   same f32 ([`certified_mean_square`]); the chain runs only where that fails.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::Level;

/// Rows per side-by-side block of [`mean_squares`] (the lanes of one f64 register, twice).
pub const SQUARE_ROWS: usize = 16;

/// `means[r] = (Σ_e f64(x[r·n + e]²) / n) as f32`, the sum in element order from 0, for
/// the `means.len()` rows of `n` values in `x` — the chain's result bit for bit.
///
/// # Panics
/// If `x.len() != means.len() · n`.
pub fn mean_squares(level: Level, x: &[f32], n: usize, means: &mut [f32]) {
    assert_eq!(x.len(), means.len() * n, "mean_squares: rows × width");
    #[cfg(target_arch = "x86_64")]
    let done = if level == Level::Avx512 && n >= 8 {
        // SAFETY: the level proves AVX-512 F.
        unsafe { blocks16(x, n, means) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (m, xr) in means[done..].iter_mut().zip(x[done * n..].chunks_exact(n)) {
        *m = certified_mean_square(level, xr)
            .unwrap_or_else(|| mean_of(xr.iter().map(|&v| f64::from(v * v)).sum(), n));
    }
}

/// The means of the whole 16-row blocks of `x` (rows of `n ≥ 8` values) from their
/// side-by-side sums ([`squares16`]); returns the rows done.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn blocks16(x: &[f32], n: usize, means: &mut [f32]) -> usize {
    let mut done = 0;
    for (xs, m) in x
        .chunks_exact(SQUARE_ROWS * n)
        .zip(means.chunks_exact_mut(SQUARE_ROWS))
    {
        let mut sums = [0f64; SQUARE_ROWS];
        squares16(xs, n, &mut sums);
        for (m, &s) in m.iter_mut().zip(&sums) {
            *m = mean_of(s, n);
        }
        done += SQUARE_ROWS;
    }
    done
}

/// The mean from a row's sum of squares: the division in f64, rounded once to f32.
fn mean_of(sum: f64, n: usize) -> f32 {
    (sum / n as f64) as f32
}

/// The element-order chain's f32 mean of squares without running the chain, where that
/// can be proved. The same squares are summed in [`CHAINS`] independent chains, whose sum
/// `s` differs from the chain's by at most `2γ/(1 − γ)·s` (both are orderings of the
/// same non-negative terms, each within `γ = (n − 1)·u/(1 − (n − 1)·u)` of their exact
/// sum, u = 2⁻⁵³; Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2). The
/// bound used, `4n·u·s`, is larger (it also covers the roundings of `s ± bound`). Division
/// by n in f64 and rounding to f32 are monotone, so when both ends of that interval give
/// the same f32 mean, so does the chain's sum inside it. `None` where they differ, and
/// for NaN (an infinite interval end gives NaN, so infinities are `None` too).
fn certified_mean_square(level: Level, x: &[f32]) -> Option<f32> {
    let s = chain_sums(level, x);
    let bound = s * (4.0 * x.len() as f64 * f64::EPSILON / 2.0);
    let (lo, hi) = (mean_of(s - bound, x.len()), mean_of(s + bound, x.len()));
    (lo == hi).then_some(lo)
}

/// Independent f64 chains of [`certified_mean_square`]: element e goes to chain
/// `e mod CHAINS` (four AVX-512 registers' lanes).
const CHAINS: usize = 32;

/// `Σ_e f64(x_e²)` in [`CHAINS`] chains, then the chains' sum.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn chain_sums(level: Level, x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the level proves the features.
        Level::Avx512 => return unsafe { chain_sums_avx512(x) },
        Level::Avx2 => return unsafe { chain_sums_avx2(x) },
        _ => {}
    }
    chain_sums_portable(x)
}

/// [`chain_sums_portable`] compiled for AVX-512.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chain_sums_avx512(x: &[f32]) -> f64 {
    chain_sums_portable(x)
}

/// [`chain_sums_portable`] compiled for AVX2.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chain_sums_avx2(x: &[f32]) -> f64 {
    chain_sums_portable(x)
}

#[inline(always)]
fn chain_sums_portable(x: &[f32]) -> f64 {
    let mut acc = [0f64; CHAINS];
    let mut blocks = x.chunks_exact(CHAINS);
    for b in &mut blocks {
        for (a, &v) in acc.iter_mut().zip(b) {
            *a += f64::from(v * v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(blocks.remainder()) {
        *a += f64::from(v * v);
    }
    acc.iter().sum()
}

/// Sixteen rows (`x` = 16 × `n`, `n ≥ 8`): two registers of eight rows' sums; every step
/// squares eight values of each of the sixteen rows in f32, transposes each eight rows'
/// squares and adds them to the sums column by column (each lane's chain in element
/// order); the last `n mod 8` values continue each row's chain in scalar code.
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn squares16(x: &[f32], n: usize, sums: &mut [f64]) {
    assert!(x.len() == SQUARE_ROWS * n && sums.len() == SQUARE_ROWS && n >= 8);
    let n8 = n / 8 * 8;
    let mut acc = [_mm512_setzero_pd(); 2];
    for e in (0..n8).step_by(8) {
        for (g, acc) in acc.iter_mut().enumerate() {
            let p = x.as_ptr().add(g * 8 * n + e);
            // SAFETY (loads): row g·8 + i's values e..e + 8 lie inside `x` (e + 8 ≤ n).
            let sq: [__m256; 8] = std::array::from_fn(|i| {
                let v = _mm256_loadu_ps(p.add(i * n));
                _mm256_mul_ps(v, v)
            });
            for col in transpose8(sq) {
                *acc = _mm512_add_pd(*acc, _mm512_cvtps_pd(col));
            }
        }
    }
    _mm512_storeu_pd(sums.as_mut_ptr(), acc[0]);
    _mm512_storeu_pd(sums.as_mut_ptr().add(8), acc[1]);
    for (sum, xr) in sums.iter_mut().zip(x.chunks_exact(n)) {
        for &v in &xr[n8..] {
            *sum += f64::from(v * v);
        }
    }
}

/// The 8 × 8 transpose: `out[j]` holds element j of rows `r[0..8]`, in row order.
///
/// # Safety
/// AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved: t[2k] = r(2k)0 r(2k+1)0 r(2k)1 r(2k+1)1 | elements 4, 5.
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // Four rows' element j | element j + 4: s[0] = columns 0 | 4, s[1] = 1 | 5, s[2] =
    // 2 | 6, s[3] = 3 | 7 of rows 0..4; s[4..8] the same of rows 4..8.
    let s: [__m256; 8] = std::array::from_fn(|i| {
        let h = i / 4 * 4;
        let (a, b) = (t[h + (i % 4) / 2], t[h + 2 + (i % 4) / 2]);
        if i % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    std::array::from_fn(|j| {
        let (a, b) = (s[j % 4], s[4 + j % 4]);
        if j < 4 {
            _mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            _mm256_permute2f128_ps::<0x31>(a, b)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain_mean(x: &[f32]) -> f32 {
        let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
        (sum / x.len() as f64) as f32
    }

    /// One row through [`mean_squares`].
    fn mean_square(level: Level, x: &[f32]) -> f32 {
        let mut m = [f32::NAN];
        mean_squares(level, x, x.len(), &mut m);
        m[0]
    }

    /// Every level this CPU runs.
    fn levels() -> Vec<Level> {
        match Level::detect() {
            Level::Avx512 => vec![Level::Scalar, Level::Avx2, Level::Avx512],
            l => vec![Level::Scalar, l],
        }
    }

    /// One row's mean equals the element-order chain's bit for bit, proved or not: widths
    /// from 1 to 8192 with and without a partial block of chains, magnitudes over many
    /// decades (the chains round), zeros, subnormal squares, infinities and NaN.
    #[test]
    fn one_rows_mean_equals_the_chain() {
        let (mut proved, widths) = (0, [1, 2, 7, 31, 32, 33, 100, 2048, 2560, 6912, 8192]);
        for n in widths {
            for seed in 0..40u32 {
                let x: Vec<f32> = (0..n)
                    .map(|i| {
                        let j = i as u32 ^ seed.wrapping_mul(2_654_435_761);
                        match j % 89 {
                            0 => 0.0,
                            1 => 1e-23,
                            _ => (j as f32 * 0.731).sin() * 10f32.powi((j % 11) as i32 - 5),
                        }
                    })
                    .collect();
                for level in levels() {
                    assert_eq!(
                        mean_square(level, &x).to_bits(),
                        chain_mean(&x).to_bits(),
                        "{level:?} n {n} seed {seed}"
                    );
                    // Few terms often sum to a rounding tie (n = 2 here); model widths do not.
                    if n >= 32 {
                        proved += usize::from(certified_mean_square(level, &x).is_some());
                    }
                }
            }
        }
        // Every row of 32 values or more is proved: the chain is not the common path.
        let wide = widths.iter().filter(|&&n| n >= 32).count();
        assert_eq!(proved, wide * 40 * levels().len());
        for special in [f32::INFINITY, f32::NAN, f32::MAX] {
            let x = [1.0, special, 2.0];
            for level in levels() {
                assert_eq!(mean_square(level, &x).to_bits(), chain_mean(&x).to_bits());
            }
        }
    }

    /// A mean exactly halfway between two f32 values: the chains' interval straddles the
    /// rounding boundary, nothing is proved, and the chain decides (ties to even).
    #[test]
    fn a_mean_on_a_rounding_boundary_runs_the_chain() {
        // (1 + 2⁻²⁴) / 2 = 0.5 + 2⁻²⁵: halfway between 0.5 and the next f32 up.
        let x = [1.0, 2f32.powi(-12)];
        for level in levels() {
            assert_eq!(certified_mean_square(level, &x), None, "{level:?}");
            assert_eq!(mean_square(level, &x), 0.5);
            assert_eq!(mean_square(level, &x).to_bits(), chain_mean(&x).to_bits());
        }
    }

    /// Every level's means equal the one-row-at-a-time chain's bit for bit, and the
    /// side-by-side blocks' f64 sums equal the chains' sums: widths with and without a tail
    /// of eight, row counts around the 16-row blocks, values over many magnitudes (so that
    /// the chains round), zeros and subnormal squares.
    #[test]
    fn means_equal_the_row_chain() {
        for (rows, n) in [
            (16, 8),
            (16, 2560),
            (17, 13),
            (33, 40),
            (35, 6912),
            (5, 7),
            (3, 1),
        ] {
            let x: Vec<f32> = (0..rows * n)
                .map(|i| match i % 97 {
                    0 => 0.0,
                    1 => 1e-23,
                    _ => (i as f32 * 0.731).sin() * 10f32.powi(i as i32 % 9 - 4),
                })
                .collect();
            let sums: Vec<f64> = x
                .chunks_exact(n)
                .map(|r| r.iter().map(|&v| f64::from(v * v)).sum::<f64>())
                .collect();
            let want: Vec<u32> = sums.iter().map(|&s| mean_of(s, n).to_bits()).collect();
            for level in levels() {
                let mut means = vec![f32::NAN; rows];
                mean_squares(level, &x, n, &mut means);
                let got: Vec<u32> = means.iter().map(|m| m.to_bits()).collect();
                assert_eq!(got, want, "{level:?} rows {rows} n {n}");
            }
            #[cfg(target_arch = "x86_64")]
            if Level::detect() == Level::Avx512 && n >= 8 {
                for (xs, want) in x
                    .chunks_exact(SQUARE_ROWS * n)
                    .zip(sums.chunks(SQUARE_ROWS))
                {
                    let mut got = [f64::NAN; SQUARE_ROWS];
                    // SAFETY: AVX-512 F detected; `xs` holds 16 rows of `n` values.
                    unsafe { squares16(xs, n, &mut got) };
                    let bits = |v: &[f64]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(want), "rows {rows} n {n}");
                }
            }
        }
    }
}
