//! Activation quantizers: BitNet's per-token int8 (for I2_S), ggml's Q8_K (for TQ1_0/TQ2_0)
//! and ggml's Q8_0 / Q8_1 (for the 32-element block formats), each with ggml's exact
//! rounding. Which weight format reads which: its [`super::format::RefDot`].

use super::float::{f16_at, f16_bytes};

/// Elements per Q8_K block (one scale each).
pub const Q8K_BLOCK: usize = 256;
/// Elements per Q8_0 block (one scale each).
pub const Q8_0_BLOCK: usize = 32;

/// ggml's `nearest_int`: adds 1.5·2^23 and reads the mantissa, which rounds half to even
/// for |v| ≤ 2^22 (activations here are at most 128 in magnitude). Plain arithmetic, so it
/// vectorises where `round_ties_even` would be a library call.
pub(crate) fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `nearest_int(v)` clamped to the i8 range (the per-token quantizer's rounding, which
/// the SIMD quantizers' tails share).
pub fn round_clamp_i8(v: f32) -> i8 {
    nearest_int(v).clamp(-128, 127) as i8
}

/// Result of [`quantize_per_token`]: a token's activations are `q_i / scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerToken {
    /// s = 127 / max|x| (max floored at 1e-5); the int8 values are round(x·s).
    pub scale: f32,
    /// Σ q_i, used by kernels that multiply unsigned codes and subtract it.
    pub sum: i32,
}

/// BitNet's per-token int8 quantizer (docs/FORMATS.md, activation formats): m = max|x_i| in f64 floored at 1e-5,
/// s = (127/m) as f32, q_i = clamp(round_half_even(x_i·s), −128, 127) with an f32 product.
///
/// # Panics
/// If `q.len() != x.len()`.
pub fn quantize_per_token(x: &[f32], q: &mut [i8]) -> PerToken {
    assert_eq!(q.len(), x.len(), "per-token quantizer: output length");
    let m = x.iter().fold(1e-5f64, |m, &v| m.max(f64::from(v).abs()));
    let scale = (127.0 / m) as f32;
    let mut sum = 0i32;
    for (qi, &xi) in q.iter_mut().zip(x) {
        *qi = round_clamp_i8(xi * scale);
        sum += i32::from(*qi);
    }
    PerToken { scale, sum }
}

/// ggml's Q8_K reference quantizer, per block of 256: `max` is the first element of largest
/// |x| (sign kept); an all-zero block gets d = 0 and q = 0; otherwise iscale = −127/max,
/// q = min(127, nearest_int(iscale·x)) and d = 1/iscale. The value of q is q·d.
///
/// # Panics
/// If `x.len()` is not a multiple of 256, `q.len() != x.len()` or `d.len() != x.len()/256`.
pub fn quantize_q8k(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert_eq!(x.len() % Q8K_BLOCK, 0, "Q8_K: length not a multiple of 256");
    assert_eq!(q.len(), x.len(), "Q8_K: output length");
    assert_eq!(d.len(), x.len() / Q8K_BLOCK, "Q8_K: scale count");
    for ((xb, qb), db) in x
        .chunks_exact(Q8K_BLOCK)
        .zip(q.chunks_exact_mut(Q8K_BLOCK))
        .zip(d.iter_mut())
    {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *db = 0.0;
            qb.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (qi, &v) in qb.iter_mut().zip(xb) {
            *qi = nearest_int(iscale * v).min(127) as i8;
        }
        *db = 1.0 / iscale;
    }
}

/// ggml's Q8_0 reference quantizer, per block of 32: d = max|x|/127, q = round(x/d) (half
/// away from zero, via x·(1/d); 0 when d = 0). `d` receives the scale rounded through F16,
/// as it is stored in a Q8_0 block and used by the dot product.
///
/// # Panics
/// If `x.len()` is not a multiple of 32, `q.len() != x.len()` or `d.len() != x.len()/32`.
pub fn quantize_q8_0(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    assert_eq!(x.len() % Q8_0_BLOCK, 0, "Q8_0: length not a multiple of 32");
    assert_eq!(q.len(), x.len(), "Q8_0: output length");
    assert_eq!(d.len(), x.len() / Q8_0_BLOCK, "Q8_0: scale count");
    for ((xb, qb), db) in x
        .chunks_exact(Q8_0_BLOCK)
        .zip(q.chunks_exact_mut(Q8_0_BLOCK))
        .zip(d.iter_mut())
    {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = amax / 127.0;
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (qi, &v) in qb.iter_mut().zip(xb) {
            *qi = (v * id).round() as i8;
        }
        *db = f16_at(&f16_bytes(scale), 0);
    }
}

/// ggml's Q8_1 reference quantizer (`quantize_row_q8_1_ref`), per block of 32: the Q8_0
/// codes and scale (`q`, `d` as [`quantize_q8_0`]), and `s` = F16(Σq · d) with the f32 d
/// before its F16 rounding, as stored in a Q8_1 block.
///
/// # Panics
/// If `x.len()` is not a multiple of 32, `q.len() != x.len()` or `d.len()`, `s.len()` are
/// not `x.len()/32`.
pub fn quantize_q8_1(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    assert_eq!(s.len(), x.len() / Q8_0_BLOCK, "Q8_1: sum count");
    quantize_q8_0(x, q, d);
    for ((xb, qb), sb) in x
        .chunks_exact(Q8_0_BLOCK)
        .zip(q.chunks_exact(Q8_0_BLOCK))
        .zip(s.iter_mut())
    {
        let scale = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        let sum: i32 = qb.iter().map(|&v| i32::from(v)).sum();
        *sb = f16_at(&f16_bytes(sum as f32 * scale), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// ggml's nearest_int written out with the magic constant.
    fn ggml_nearest_int(v: f32) -> i32 {
        v.round_ties_even() as i32
    }

    #[test]
    fn nearest_int_is_round_half_even() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..100_000 {
            let v: f32 = rng.random_range(-300.0..300.0);
            assert_eq!(nearest_int(v), ggml_nearest_int(v), "v = {v}");
        }
        for k in -300..300 {
            let v = k as f32 + 0.5;
            assert_eq!(nearest_int(v), ggml_nearest_int(v), "v = {v}");
        }
    }

    #[test]
    fn round_clamp_saturates() {
        assert_eq!(round_clamp_i8(-128.4), -128);
        assert_eq!(round_clamp_i8(-129.0), -128);
        assert_eq!(round_clamp_i8(-1000.0), -128);
        assert_eq!(round_clamp_i8(127.6), 127);
        assert_eq!(round_clamp_i8(128.0), 127);
        assert_eq!(round_clamp_i8(-127.5), -128);
        assert_eq!(round_clamp_i8(126.5), 126);
    }

    #[test]
    fn per_token_all_zeros() {
        let x = [0f32; 7];
        let mut q = [1i8; 7];
        let p = quantize_per_token(&x, &mut q);
        assert_eq!(q, [0; 7]);
        assert_eq!(p.sum, 0);
        assert_eq!(p.scale, (127.0f64 / 1e-5) as f32);
    }

    #[test]
    fn per_token_half_boundaries_round_to_even() {
        // m = 127 gives s = 1 exactly, so q = round_half_even(x).
        let x = [127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -126.5, 3.4999998];
        let mut q = [0i8; 9];
        let p = quantize_per_token(&x, &mut q);
        assert_eq!(p.scale, 1.0);
        assert_eq!(q, [127, 0, 2, 2, 0, -2, -2, -126, 3]);
        assert_eq!(p.sum, q.iter().map(|&v| i32::from(v)).sum::<i32>());
    }

    #[test]
    fn per_token_scale_in_f64_and_extremes() {
        let x = [-3.0f32, 1.0, 0.75, 0.0];
        let mut q = [0i8; 4];
        let p = quantize_per_token(&x, &mut q);
        assert_eq!(p.scale, (127.0f64 / 3.0) as f32);
        // The max element maps to ±127, never beyond.
        assert_eq!(q[0], -127);
        assert_eq!(q[1], (1.0f32 * p.scale).round_ties_even() as i8);
        assert_eq!(q[3], 0);
        assert_eq!(p.sum, q.iter().map(|&v| i32::from(v)).sum::<i32>());
        // Tiny activations: the 1e-5 floor bounds the scale, so q stays small.
        let tiny = [1e-7f32, -2e-7];
        let mut qt = [0i8; 2];
        quantize_per_token(&tiny, &mut qt);
        assert_eq!(qt, [1, -3]);
    }

    #[test]
    fn q8k_blocks() {
        let mut x = vec![0f32; 512];
        // Block 0: largest |x| is negative (-4), so iscale = -127/-4 = 31.75 (exact) and the
        // max maps to -127. Block 1 stays all zero.
        x[0] = 1.0; // 31.75 → 32
        x[1] = -4.0;
        x[2] = 2.0; // 63.5 → 64 (half to even)
        x[3] = -2.0; // -63.5 → -64
        x[4] = 4.0; // 127
        let mut q = vec![5i8; 512];
        let mut d = [9f32; 2];
        quantize_q8k(&x, &mut q, &mut d);
        assert_eq!(d[0], 1.0 / 31.75);
        assert_eq!(&q[..6], &[32, -127, 64, -64, 127, 0]);
        assert_eq!(d[1], 0.0);
        assert!(q[256..].iter().all(|&v| v == 0));
        // An equal-magnitude opposite-sign element lands on +127 (min(127, ·) keeps it there).
        let mut y = vec![0f32; 256];
        y[0] = 1.0;
        y[1] = -1.0;
        let mut qy = vec![0i8; 256];
        let mut dy = [0f32];
        quantize_q8k(&y, &mut qy, &mut dy);
        assert_eq!((qy[0], qy[1], dy[0]), (-127, 127, -1.0 / 127.0));
    }

    #[test]
    fn q8k_reconstruction_error_is_half_a_step() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let x: Vec<f32> = (0..768).map(|_| rng.random_range(-3.0..3.0)).collect();
        let mut q = vec![0i8; 768];
        let mut d = vec![0f32; 3];
        quantize_q8k(&x, &mut q, &mut d);
        for (i, (&xv, &qv)) in x.iter().zip(&q).enumerate() {
            let db = d[i / 256];
            assert!(
                (f32::from(qv) * db - xv).abs() <= db.abs() * 0.5001,
                "i = {i}"
            );
        }
    }

    #[test]
    fn q8_0_blocks() {
        let mut x = [0f32; 64];
        x[0] = 127.0; // d = 1 exactly
        x[1] = 2.5; // roundf: half away from zero
        x[2] = -2.5;
        x[3] = -127.0;
        // Block 1: amax = 1, d = 1/127 rounded through F16.
        x[32] = 1.0;
        x[33] = -0.5;
        let mut q = [0i8; 64];
        let mut d = [0f32; 2];
        quantize_q8_0(&x, &mut q, &mut d);
        assert_eq!(d[0], 1.0);
        assert_eq!(&q[..4], &[127, 3, -3, -127]);
        assert_eq!(d[1], half::f16::from_f32(1.0 / 127.0).to_f32());
        assert_ne!(d[1], 1.0 / 127.0);
        assert_eq!(q[32], 127);
        assert_eq!(q[33], -64); // -0.5·127 = -63.5 → -64 (away from zero)
        let mut zero_q = [1i8; 32];
        let mut zero_d = [1f32];
        quantize_q8_0(&[0.0; 32], &mut zero_q, &mut zero_d);
        assert_eq!((zero_q, zero_d), ([0; 32], [0.0]));
    }
    #[test]
    fn q8_1_sum_uses_unrounded_scale() {
        let mut x = [0f32; 64];
        x[0] = 1.0; // d = 1/127 (not an F16), q = 127
        x[1] = 0.5; // 63.5 → 64
        x[40] = -3.0;
        let (mut q, mut d, mut s) = ([0i8; 64], [0f32; 2], [0f32; 2]);
        quantize_q8_1(&x, &mut q, &mut d, &mut s);
        let (mut q0, mut d0) = ([0i8; 64], [0f32; 2]);
        quantize_q8_0(&x, &mut q0, &mut d0);
        assert_eq!((q, d), (q0, d0));
        assert_eq!(s[0], half::f16::from_f32(191.0 * (1.0 / 127.0)).to_f32());
        assert_eq!(s[1], half::f16::from_f32(-127.0 * (3.0 / 127.0)).to_f32());
    }
}
