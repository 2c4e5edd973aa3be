//! RMSNorm's sums of squares for many rows at once: `Σ_e f64(x_e · x_e)` of each row, in
//! element order from 0 (ggml's order). One row's chain of f64 additions cannot be split
//! without changing its roundings, so the rows go side by side instead: AVX-512 holds
//! eight rows' sums in one register and adds each row's next square to its own lane,
//! after an 8 × 8 transpose of eight rows' next eight squares — the same f32 products,
//! the same exact conversions and the same f64 additions in the same order per row as
//! the scalar chain, bit for bit.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::Level;

/// Rows per block of [`squares_rows`] (the lanes of one f64 register, twice).
pub const SQUARE_ROWS: usize = 16;

/// `sums[r] = Σ_e f64(x[r·n + e]²)`, summed in element order from 0, for the
/// `sums.len()` rows of `n` values in `x` — the scalar chain's result bit for bit.
///
/// # Panics
/// If `x.len() != sums.len() · n`.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn squares_rows(level: Level, x: &[f32], n: usize, sums: &mut [f64]) {
    assert_eq!(x.len(), sums.len() * n, "squares_rows: rows × width");
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && n >= 8 {
        let mut done = 0;
        for (xs, s) in x
            .chunks_exact(SQUARE_ROWS * n)
            .zip(sums.chunks_exact_mut(SQUARE_ROWS))
        {
            // SAFETY: the level proves AVX-512 F; `xs` holds 16 rows of `n` values.
            unsafe { squares16(xs, n, s) };
            done += SQUARE_ROWS;
        }
        return squares_scalar(&x[done * n..], n, &mut sums[done..]);
    }
    squares_scalar(x, n, sums)
}

/// The chains four rows side by side, so that the four independent chains overlap (the
/// same sums as one row after the other, bit for bit), and one by one for the rest.
fn squares_scalar(x: &[f32], n: usize, sums: &mut [f64]) {
    let first = sums.len() / 4 * 4;
    let mut rows4 = sums.chunks_exact_mut(4);
    for (s, x4) in (&mut rows4).zip(x.chunks_exact(4 * n)) {
        let [a, b, c, d]: [&[f32]; 4] = std::array::from_fn(|r| &x4[r * n..(r + 1) * n]);
        let mut acc = [0f64; 4];
        for (((&a, &b), &c), &d) in a.iter().zip(b).zip(c).zip(d) {
            for (acc, v) in acc.iter_mut().zip([a, b, c, d]) {
                *acc += f64::from(v * v);
            }
        }
        s.copy_from_slice(&acc);
    }
    let rest = rows4.into_remainder();
    for (sum, xr) in rest.iter_mut().zip(x[first * n..].chunks_exact(n)) {
        *sum = xr.iter().map(|&v| f64::from(v * v)).sum();
    }
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

    /// Every level's sums equal the one-row-at-a-time chain bit for bit: widths with and
    /// without a tail of eight, row counts around the 16-row and 4-row blocks, values over
    /// many magnitudes (so that the chains round), zeros and subnormal squares.
    #[test]
    fn sums_equal_the_row_chain() {
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
            let want: Vec<u64> = x
                .chunks_exact(n)
                .map(|r| r.iter().map(|&v| f64::from(v * v)).sum::<f64>().to_bits())
                .collect();
            for level in [Level::Scalar, Level::detect()] {
                let mut sums = vec![f64::NAN; rows];
                squares_rows(level, &x, n, &mut sums);
                let got: Vec<u64> = sums.iter().map(|s| s.to_bits()).collect();
                assert_eq!(got, want, "{level:?} rows {rows} n {n}");
            }
        }
    }
}
