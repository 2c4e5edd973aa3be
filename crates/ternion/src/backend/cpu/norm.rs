//! RMSNorm, in ggml's order of operations: Σx² accumulated in f64, `1/sqrt(mean + eps)`
//! in f32, then `(x · scale) · w`.

/// Normalises each row of `x` (`rows × w.len()`) into `out`, multiplied by the weight `w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = xr.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
