//! Q6_K: ggml's 6-bit k-quant (dequantization, the dot product against Q8_K, and the
//! reference quantizer, used for the opt-in Q6_K LM head). 256-element super-blocks of 210
//! bytes: `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (i8), F16 `d`.
//! Each 128-element half h uses ql[64h..64h+64], qh[32h..32h+32] and scales[8h..8h+8];
//! within it, for l < 32, elements l, l+32, l+64, l+96 take the low nibbles of ql[l] and
//! ql[l+32], then their high nibbles, with bits 0-1, 2-3, 4-5, 6-7 of qh[l] on top.
//! Element value = d·scale·(q − 32), the scale indexed by element / 16.
//! Sources: docs/FORMATS.md.

use super::act::nearest_int;
use super::float::{f16_at, f16_bytes};
use super::format::{block_format, RefDot};

/// Elements per super-block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per super-block.
pub const BLOCK_BYTES: usize = 210;

/// Dequantizes a row of whole super-blocks.
///
/// # Panics
/// If `dst.len()` is not a multiple of 256 or `src` is not `dst.len()/256` super-blocks.
pub fn dequantize_row(src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        dst.len() % BLOCK_ELEMS,
        0,
        "Q6_K: {} elements is not whole blocks",
        dst.len()
    );
    assert_eq!(
        src.len(),
        dst.len() / BLOCK_ELEMS * BLOCK_BYTES,
        "Q6_K: {} bytes do not hold {} elements",
        src.len(),
        dst.len()
    );
    for (block, out) in src
        .chunks_exact(BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = f16_at(block, 208);
        for (h, half) in out.chunks_exact_mut(128).enumerate() {
            let ql = &block[64 * h..64 * h + 64];
            let qh = &block[128 + 32 * h..128 + 32 * h + 32];
            let sc = &block[192 + 8 * h..192 + 8 * h + 8];
            for l in 0..32 {
                let q = [
                    (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    let scale = f32::from(sc[l / 16 + 2 * k] as i8);
                    half[l + 32 * k] = d * scale * f32::from(qk as i8 - 32);
                }
            }
        }
    }
}

/// The 256 signed values q − 32 of one super-block, in element order.
fn values(block: &[u8]) -> [i8; BLOCK_ELEMS] {
    let mut v = [0i8; BLOCK_ELEMS];
    for (h, half) in v.chunks_exact_mut(128).enumerate() {
        let ql = &block[64 * h..64 * h + 64];
        let qh = &block[128 + 32 * h..128 + 32 * h + 32];
        for l in 0..32 {
            half[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            half[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            half[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            half[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

/// Dot product against Q8_K activations (`q` int8, `d` one f32 scale per 256), as ggml's
/// `vec_dot_q6_K_q8_K`: per super-block the integer Σ_g scale_g·Σ (q6 − 32)·q over the
/// sixteen 16-element groups, times `d·d_act`, summed over super-blocks.
///
/// # Panics
/// If `q.len()` is not a multiple of 256, `row` is not `q.len()/256` super-blocks or
/// `d.len() != q.len()/256`.
pub fn dot_q8k(row: &[u8], q: &[i8], d: &[f32]) -> f32 {
    assert_eq!(q.len() % BLOCK_ELEMS, 0, "Q6_K: length not whole blocks");
    assert_eq!(
        row.len(),
        q.len() / BLOCK_ELEMS * BLOCK_BYTES,
        "Q6_K: row bytes"
    );
    assert_eq!(
        d.len(),
        q.len() / BLOCK_ELEMS,
        "Q6_K: activation scale count"
    );
    let mut sum = 0f32;
    for ((block, qb), &da) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(q.chunks_exact(BLOCK_ELEMS))
        .zip(d)
    {
        let v = values(block);
        let isum: i32 = v
            .chunks_exact(16)
            .zip(qb.chunks_exact(16))
            .zip(&block[192..208])
            .map(|((w, a), &s)| {
                let g: i32 = w
                    .iter()
                    .zip(a)
                    .map(|(&w, &a)| i32::from(w) * i32::from(a))
                    .sum();
                i32::from(s as i8) * g
            })
            .sum();
        sum += f16_at(block, 208) * da * isum as f32;
    }
    sum
}

/// Sub-blocks whose largest |x| is below this quantize to zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Inverse scales tried by [`make_qx_quants`]: −(32 + 0.1·is)/max for is = 0, then
/// −9..=−1 and 1..=9, in ggml's order.
fn trial_iscales(max: f32) -> [f32; 19] {
    std::array::from_fn(|j| {
        let is = match j {
            0 => 0,
            1..=9 => j as i32 - 10,
            _ => j as i32 - 9,
        };
        if is == 0 {
            -32.0 / max
        } else {
            -(32.0 + 0.1 * is as f32) / max
        }
    })
}

/// ggml's `make_qx_quants` for 6 bits without importance weights (`nmax` = 32, rmse type
/// 1: errors weighted by x²): the codes l + 32 (l ∈ −32..=31) of one 16-element sub-block
/// and its scale, the best of 19 trial scales around −32/max. The sums of all trials are
/// accumulated side by side (each in element order, as ggml's loop), then compared in
/// ggml's order.
fn make_qx_quants(x: &[f32], codes: &mut [i8]) -> f32 {
    const NMAX: i32 = 32;
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-NMAX, NMAX - 1);
    let iscales = trial_iscales(max);
    let (mut lx, mut l2) = ([0f32; 19], [0f32; 19]);
    for &v in x {
        let w = v * v;
        for ((sx, s2), &is) in lx.iter_mut().zip(&mut l2).zip(&iscales) {
            let l = quant(is, v) as f32;
            *sx += w * v * l;
            *s2 += w * l * l;
        }
    }
    let mut chosen = 0;
    let mut scale = if l2[0] != 0.0 { lx[0] / l2[0] } else { 0.0 };
    let mut best = scale * lx[0];
    for j in 1..19 {
        if l2[j] > 0.0 && lx[j] * lx[j] > best * l2[j] {
            chosen = j;
            scale = lx[j] / l2[j];
            best = scale * lx[j];
        }
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = (quant(iscales[chosen], v) + NMAX) as i8;
    }
    scale
}

/// ggml's reference quantizer (`quantize_row_q6_K_ref`, no importance matrix): per
/// sub-block of 16 a scale from [`make_qx_quants`]; the super-block scale d maps the
/// largest one to −128; sub-block scales are round(scale·(−128/max)) ≤ 127 (i8), and the
/// codes are round(x / (d·scale)) clamped to −32..=31, stored + 32.
///
/// # Panics
/// If `src.len()` is not a multiple of 256 or `dst` is not `src.len()/256` super-blocks.
pub fn quantize_row(src: &[f32], dst: &mut [u8]) {
    assert_eq!(
        src.len() % BLOCK_ELEMS,
        0,
        "Q6_K: length not a multiple of 256"
    );
    assert_eq!(
        dst.len(),
        src.len() / BLOCK_ELEMS * BLOCK_BYTES,
        "Q6_K: output is not whole blocks"
    );
    for (x, block) in src
        .chunks_exact(BLOCK_ELEMS)
        .zip(dst.chunks_exact_mut(BLOCK_BYTES))
    {
        let mut codes = [0i8; BLOCK_ELEMS];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs) = (0f32, 0f32);
        for ((xs, cs), s) in x
            .chunks_exact(16)
            .zip(codes.chunks_exact_mut(16))
            .zip(&mut scales)
        {
            *s = make_qx_quants(xs, cs);
            if s.abs() > max_abs {
                max_abs = s.abs();
                max_scale = *s;
            }
        }
        block.fill(0);
        if max_abs < GROUP_MAX_EPS {
            continue;
        }
        let iscale = -128.0 / max_scale;
        block[208..210].copy_from_slice(&f16_bytes(1.0 / iscale));
        let d = f16_at(block, 208);
        for (j, &s) in scales.iter().enumerate() {
            let sc = nearest_int(iscale * s).min(127) as i8;
            block[192 + j] = sc as u8;
            let dj = d * f32::from(sc);
            if dj == 0.0 {
                continue;
            }
            for (c, &v) in codes[16 * j..16 * (j + 1)].iter_mut().zip(&x[16 * j..]) {
                *c = (nearest_int(v / dj).clamp(-32, 31) + 32) as i8;
            }
        }
        for (h, half) in codes.chunks_exact(128).enumerate() {
            let c = |i: usize| half[i] as u8;
            for l in 0..32 {
                block[64 * h + l] = (c(l) & 0xF) | ((c(l + 64) & 0xF) << 4);
                block[64 * h + l + 32] = (c(l + 32) & 0xF) | ((c(l + 96) & 0xF) << 4);
                block[128 + 32 * h + l] = (c(l) >> 4)
                    | ((c(l + 32) >> 4) << 2)
                    | ((c(l + 64) >> 4) << 4)
                    | ((c(l + 96) >> 4) << 6);
            }
        }
    }
}

block_format!(
    /// The Q6_K format for the registry ([`super::format`]).
    Q6K,
    Q6_K,
    RefDot::Q8K(dot_q8k),
    Some(quantize_row),
    Some(include_str!("wgsl/q6_k.wgsl"))
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::float::f16_bytes;

    #[test]
    fn trials_side_by_side_equal_trials_one_by_one() {
        use rand::{Rng, SeedableRng};
        // ggml's loop: one trial after the other, the codes rewritten at each improvement.
        fn one_by_one(x: &[f32], codes: &mut [i8]) -> f32 {
            let max = x
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            let quant = |is: f32, v: f32| nearest_int(is * v).clamp(-32, 31);
            let sums = |is: f32| {
                x.iter().fold((0f32, 0f32), |(lx, l2), &v| {
                    let (l, w) = (quant(is, v) as f32, v * v);
                    (lx + w * v * l, l2 + w * l * l)
                })
            };
            let set = |c: &mut [i8], is: f32| {
                c.iter_mut()
                    .zip(x)
                    .for_each(|(c, &v)| *c = (quant(is, v) + 32) as i8)
            };
            set(codes, -32.0 / max);
            let (lx, l2) = sums(-32.0 / max);
            let mut scale = if l2 != 0.0 { lx / l2 } else { 0.0 };
            let mut best = scale * lx;
            for is in (-9..=9).filter(|&i| i != 0) {
                let iscale = -(32.0 + 0.1 * is as f32) / max;
                let (lx, l2) = sums(iscale);
                if l2 > 0.0 && lx * lx > best * l2 {
                    set(codes, iscale);
                    scale = lx / l2;
                    best = scale * lx;
                }
            }
            scale
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let spread = rng.random_range(0.01f32..10.0);
            let x: Vec<f32> = (0..16).map(|_| rng.random_range(-spread..spread)).collect();
            let (mut a, mut b) = ([0i8; 16], [0i8; 16]);
            let (sa, sb) = (make_qx_quants(&x, &mut a), one_by_one(&x, &mut b));
            assert_eq!((sa.to_bits(), a), (sb.to_bits(), b), "{x:?}");
        }
    }

    #[test]
    fn quantize_round_trip_is_within_one_step() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let mut x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        x[300..316].fill(0.0); // an all-zero sub-block
        let mut b = vec![0u8; 2 * BLOCK_BYTES];
        quantize_row(&x, &mut b);
        let mut y = vec![0f32; 512];
        dequantize_row(&b, &mut y);
        for (i, (&a, &v)) in x.iter().zip(&y).enumerate() {
            let block = &b[(i / 256) * BLOCK_BYTES..];
            let step = f16_at(block, 208) * f32::from(block[192 + (i % 256) / 16] as i8);
            assert!(
                (a - v).abs() <= 1.01 * step.abs() + 1e-7,
                "element {i}: {a} → {v}"
            );
        }
        assert!(y[300..316].iter().all(|&v| v == 0.0));
        quantize_row(&[0.0; 256], &mut b[..BLOCK_BYTES]);
        assert!(b[..BLOCK_BYTES].iter().all(|&v| v == 0));
    }

    #[test]
    fn dot_matches_dequantized_product() {
        use crate::quant::act::quantize_q8k;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let n = 512;
        let mut row: Vec<u8> = (0..n / BLOCK_ELEMS * BLOCK_BYTES)
            .map(|_| rng.random())
            .collect();
        for b in row.chunks_exact_mut(BLOCK_BYTES) {
            b[208..].copy_from_slice(&f16_bytes(0.01));
        }
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        let mut q = vec![0i8; n];
        let mut d = vec![0f32; n / 256];
        quantize_q8k(&x, &mut q, &mut d);
        let mut w = vec![0f32; n];
        dequantize_row(&row, &mut w);
        let want: f64 = (0..n)
            .map(|i| f64::from(w[i]) * f64::from(q[i]) * f64::from(d[i / 256]))
            .sum();
        let got = f64::from(dot_q8k(&row, &q, &d));
        assert!(
            (got - want).abs() < 1e-3 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
    }

    #[test]
    fn known_block() {
        // All q = 32 (value 0): ql nibbles 0, qh pairs 2 (0b10101010).
        let mut block = [0u8; BLOCK_BYTES];
        block[128..192].fill(0xAA);
        block[208..].copy_from_slice(&f16_bytes(0.5));
        for (i, s) in block[192..208].iter_mut().enumerate() {
            *s = (i as i8 - 4) as u8; // scales −4..11
        }
        // Element 17 (l = 17, k = 0): ql[17] low = 5, qh[17] bits 0-1 = 3 → q = 53 → 21.
        block[17] = 0x05;
        block[128 + 17] = 0b1010_1011;
        // Element 128 + 96 + 20 (half 1, l = 20, k = 3): ql[64 + 52] high = 0, qh[32 + 20]
        // bits 6-7 = 0 → q = 0 → −32.
        block[128 + 32 + 20] = 0b0010_1010;
        let mut out = [9f32; 256];
        dequantize_row(&block, &mut out);
        // Element 17 uses scale index 17/16 = 1 → scale −3.
        assert_eq!(out[17], 0.5 * -3.0 * 21.0);
        // Element 244 uses half 1, scale index 20/16 + 6 = 7 → scales[15] = 11.
        assert_eq!(out[244], 0.5 * 11.0 * -32.0);
        let nonzero: Vec<usize> = (0..256).filter(|&i| out[i] != 0.0).collect();
        assert_eq!(nonzero, [17, 244]);
    }
}
