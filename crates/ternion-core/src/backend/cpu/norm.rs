//! RMSNorm, in ggml's order of operations: Σx² accumulated in f64, `1/sqrt(mean + eps)`
//! in f32, then `(x · scale) · w`; and LayerNorm, as ggml's `norm` then `mul` and `add`:
//! the mean in f64, `y = x − mean`, Σy² in f64, `y · 1/sqrt(var + eps)`, then `· w + b`.

use super::simd::{self, Level, SQUARE_ROWS};

/// Rows normalised by one parallel task (rows are independent: the result does not depend
/// on the thread count): one block of the side-by-side sums of squares where there are at
/// least two such blocks, else four (so that a few rows still spread over the threads).
const ROWS_PER_TASK: [usize; 2] = [4, SQUARE_ROWS];

/// Normalises each row of `x` (`rows × w.len()`) into `out`, multiplied by the weight `w`;
/// several rows run in parallel.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    if out.len() <= n {
        return rms_norm_rows(x, w, eps, out);
    }
    let per_task = n * ROWS_PER_TASK[usize::from(out.len() >= 2 * SQUARE_ROWS * n)];
    super::pool::global().for_each_chunk_mut(out, per_task, |c, o, _| {
        rms_norm_rows(&x[c * per_task..][..o.len()], w, eps, o)
    });
}

fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    let rows = out.len() / n;
    let level = Level::detect();
    // The weight was last read a token ago (a gigabyte of weights has streamed by since):
    // asked for whole before the mean squares, it arrives while they run (a 2B-4T decode
    // token's 120 norms 185 -> 130 µs, BENCHMARKS.md session 30).
    simd::prefetch_all(w);
    let mut means = [0f32; SQUARE_ROWS];
    simd::mean_squares(level, &x[..rows * n], n, &mut means[..rows]);
    for ((xr, or), &mean) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)).zip(&means) {
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx512 {
            // SAFETY: the level proves AVX-512 F.
            unsafe { scale_row_avx512(xr, or, w, eps, mean) };
            continue;
        }
        scale_row(xr, or, w, eps, mean);
    }
}

/// [`scale_row`] compiled for AVX-512 (the same operations on 16 lanes).
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_row_avx512(xr: &[f32], or: &mut [f32], w: &[f32], eps: f32, mean: f32) {
    scale_row(xr, or, w, eps, mean)
}

/// One row normalised from its mean square.
#[inline(always)]
fn scale_row(xr: &[f32], or: &mut [f32], w: &[f32], eps: f32, mean: f32) {
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
        *o = (v * scale) * g;
    }
}

/// LayerNorm of each row of `x` (`rows × w.len()`) into `out`: `(x − μ)/√(σ² + eps)·w + b`
/// with the biased variance.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v)).sum();
        let mean = (sum / n as f64) as f32;
        let mut sum2 = 0f64;
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = v - mean;
            sum2 += f64::from(*o * *o);
        }
        let var = (sum2 / n as f64) as f32;
        let scale = 1.0 / (var + eps).sqrt();
        for ((o, &g), &bias) in or.iter_mut().zip(w).zip(b) {
            *o = (*o * scale) * g + bias;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_matches_f64_reference() {
        let (rows, n) = (3, 10);
        let x: Vec<f32> = (0..rows * n)
            .map(|i| (i as f32 * 0.37).sin() * 3.0 + 1.5)
            .collect();
        let w: Vec<f32> = (0..n).map(|i| 1.0 + 0.1 * i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.05 * i as f32 - 0.2).collect();
        let mut out = vec![0.0; rows * n];
        layer_norm(&x, &w, &b, 1e-5, &mut out);
        for r in 0..rows {
            let xr: Vec<f64> = x[r * n..][..n].iter().map(|&v| f64::from(v)).collect();
            let mean = xr.iter().sum::<f64>() / n as f64;
            let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            for i in 0..n {
                let want = (xr[i] - mean) / (var + 1e-5).sqrt() * f64::from(w[i]) + f64::from(b[i]);
                assert!((f64::from(out[r * n + i]) - want).abs() < 1e-5, "r{r} i{i}");
            }
        }
    }

    /// Rows normalised sixteen or four side by side (and the rest one by one, on any
    /// number of threads) equal the row-at-a-time formula bit for bit.
    #[test]
    fn rows_side_by_side_equal_one_row_at_a_time() {
        for (rows, n) in [
            (1, 9),
            (3, 16),
            (4, 2560),
            (9, 40),
            (13, 7),
            (37, 2560),
            (21, 44),
        ] {
            let x: Vec<f32> = (0..rows * n)
                .map(|i| (i as f32 * 0.731).sin() * 10f32.powi(i as i32 % 7 - 3))
                .collect();
            let w: Vec<f32> = (0..n).map(|i| 0.5 + 0.01 * i as f32).collect();
            let mut out = vec![0.0; rows * n];
            rms_norm(&x, &w, 1e-5, &mut out);
            for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact(n)) {
                let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
                let scale = 1.0 / ((sum / n as f64) as f32 + 1e-5).sqrt();
                for ((&o, &v), &g) in or.iter().zip(xr).zip(&w) {
                    assert_eq!(
                        o.to_bits(),
                        ((v * scale) * g).to_bits(),
                        "rows {rows} n {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn unit_rms_after_norm() {
        let x: Vec<f32> = (0..14).map(|i| i as f32 - 6.5).collect();
        let w = vec![1.0; 7];
        let mut out = vec![0.0; 14];
        rms_norm(&x, &w, 1e-6, &mut out);
        for row in out.chunks(7) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 7.0;
            assert!((ms - 1.0).abs() < 1e-4, "mean square {ms}");
        }
        let w2 = vec![2.0; 7];
        let mut out2 = vec![0.0; 14];
        rms_norm(&x, &w2, 1e-6, &mut out2);
        assert!(out
            .iter()
            .zip(&out2)
            .all(|(a, b)| (2.0 * a - b).abs() < 1e-6));
    }
}
