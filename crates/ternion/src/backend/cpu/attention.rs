//! Causal multi-head attention over the F16 KV cache, with grouped-query heads.
//!
//! Numerics follow the reference engines: Q is rounded to F16 for QKᵀ, scores are scaled
//! by 1/√head_dim, the softmax sums in f64, and for single-token decode the
//! probabilities are rounded to F16 before P·V (a batch keeps them in f32).

use half::f16;
use rayon::prelude::*;

use super::simd;

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
}

/// `q` holds one row of `n_head · head_dim` per new token; `k`/`v` hold the cached rows for
/// positions `0..pos0 + n_tokens`. Writes the concatenated head outputs to `out`.
pub fn attention(q: &[f32], k: &[f16], v: &[f16], s: &AttnShape, out: &mut [f32]) {
    let hd = s.head_dim;
    let kv_dim = s.n_head_kv * hd;
    let group = s.n_head / s.n_head_kv;
    let scale = 1.0 / (hd as f32).sqrt();
    let level = simd::Level::detect();
    out.par_chunks_mut(hd).enumerate().for_each_init(
        || (Vec::new(), vec![0f32; hd]),
        |(scores, qh), (i, o)| {
            let (t, h) = (i / s.n_head, i % s.n_head);
            let n_keys = s.pos0 + t + 1;
            let kvh = h / group;
            for (d, &x) in qh.iter_mut().zip(&q[i * hd..(i + 1) * hd]) {
                *d = f16::from_f32(x).to_f32();
            }
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for p in 0..n_keys {
                let kr = &k[p * kv_dim + kvh * hd..][..hd];
                let dot = simd::f16_dot_halves(level, kr, qh);
                let sc = dot * scale;
                max = max.max(sc);
                scores.push(sc);
            }
            let mut sum = 0f64;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                sum += f64::from(*sc);
            }
            let inv = (1.0 / sum) as f32;
            for sc in scores.iter_mut() {
                *sc *= inv;
                if s.round_probs {
                    *sc = f16::from_f32(*sc).to_f32();
                }
            }
            o.fill(0.0);
            for (p, &w) in scores.iter().enumerate() {
                simd::f16_axpy(level, o, w, &v[p * kv_dim + kvh * hd..][..hd]);
            }
        },
    );
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
        };
        attention(&q, &k, &v, &s, &mut out);
        assert_eq!(out, vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
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
        };
        attention(&q, &k, &v, &s, &mut out);
        assert_eq!(out, vec![2.0, 4.0, 4.0, 6.0]);
    }
}
