//! aarch64 only: every NEON kernel equals its scalar reference bit for bit, on random
//! blocks (every byte value, so every code) with sane F16 scales, against quantized and
//! raw int8 activations (−128 included).

use super::super::neon_dot::{run_plain, run_sdot, Act, RowDot};
use super::super::{neon_kq2, neon_q81};
use super::*;
use crate::backend::cpu::linear::{simd_q8_0, simd_q8_1, simd_q8k};
use crate::quant::{GgmlType, RefDot};

/// `nb` blocks of random bytes with random F16 scales at the byte offsets `scales`.
fn random_blocks(rng: &mut StdRng, nb: usize, block_bytes: usize, scales: &[usize]) -> Vec<u8> {
    let mut row: Vec<u8> = (0..nb * block_bytes).map(|_| rng.random()).collect();
    for b in row.chunks_exact_mut(block_bytes) {
        for &o in scales {
            let s = f16::from_f32(rng.random_range(-0.2..0.2));
            b[o..o + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
    row
}

/// Activations of `k` elements in blocks of `block` (32: Q8_0 or, with `q8_1`, Q8_1; 256:
/// Q8_K): quantized random floats, or raw int8 with random scales; with the per-block sums
/// and Q8_1's d·Σq (empty unless `q8_1`).
fn activations_s(
    rng: &mut StdRng,
    k: usize,
    block: usize,
    raw: bool,
    q8_1: bool,
) -> (Vec<i8>, Vec<f32>, Vec<i32>, Vec<f32>) {
    let (mut q, mut d) = (vec![0i8; k], vec![0f32; k / block]);
    let mut s = vec![0f32; if q8_1 { k / block } else { 0 }];
    if raw {
        q = random_q(rng, k);
        d.iter_mut().for_each(|v| *v = rng.random_range(0.001..0.1));
        s.iter_mut().for_each(|v| *v = rng.random_range(-5.0..5.0));
    } else {
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-3.0..3.0)).collect();
        match (block, q8_1) {
            (32, true) => quant::act::quantize_q8_1(&x, &mut q, &mut d, &mut s),
            (32, false) => quant::act::quantize_q8_0(&x, &mut q, &mut d),
            _ => quant::act::quantize_q8k(&x, &mut q, &mut d),
        }
    }
    let sums = q
        .chunks(block)
        .map(|b| b.iter().map(|&v| i32::from(v)).sum())
        .collect();
    (q, d, sums, s)
}

/// [`activations_s`] without Q8_1's sums.
fn activations(
    rng: &mut StdRng,
    k: usize,
    block: usize,
    raw: bool,
) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
    let (q, d, sums, _) = activations_s(rng, k, block, raw, false);
    (q, d, sums)
}

/// The formats with a SIMD dot against Q8_0, Q8_1 or Q8_K activations, and where their
/// blocks hold F16 scales.
const SCALES: [(GgmlType, &[usize]); 14] = [
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::IQ4_NL, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_1, &[0, 2]),
    (GgmlType::TQ2_0, &[64]),
    (GgmlType::TQ1_0, &[52]),
    (GgmlType::Q2_K, &[80, 82]),
    (GgmlType::Q3_K, &[108]),
    (GgmlType::Q4_K, &[0, 2]),
    (GgmlType::Q5_K, &[0, 2]),
    (GgmlType::Q6_K, &[208]),
    (GgmlType::IQ4_XS, &[0]),
];

/// The kernels the linear layer dispatches for these formats, at `Level::Neon`, against
/// the registry's reference dots.
#[test]
fn neon_dots_are_bit_identical_to_reference() {
    assert_eq!(Level::detect(), Level::Neon, "NEON not detected");
    let mut rng = StdRng::seed_from_u64(61);
    for (ty, scales) in SCALES {
        let fmt = quant::format(ty).expect("registered format");
        for blocks in [1, 3, 10] {
            let k = fmt.block_elems * blocks;
            let row = random_blocks(&mut rng, blocks, fmt.block_bytes, scales);
            for raw in [false, true] {
                let (want, got) = match fmt.dot {
                    RefDot::Q8_0(reference) => {
                        let (q, d, _) = activations(&mut rng, k, 32, raw);
                        let kernel = simd_q8_0(ty).expect("Q8_0 kernel");
                        (reference(&row, &q, &d), kernel(Level::Neon, &row, &q, &d))
                    }
                    RefDot::Q8_1(reference) => {
                        let (q, d, _, s) = activations_s(&mut rng, k, 32, raw, true);
                        let kernel = simd_q8_1(ty).expect("Q8_1 kernel");
                        (
                            reference(&row, &q, &d, &s),
                            kernel(Level::Neon, &row, &q, &d, &s),
                        )
                    }
                    RefDot::Q8K(reference) => {
                        let (q, d, sums) = activations(&mut rng, k, 256, raw);
                        let kernel = simd_q8k(ty).expect("Q8_K kernel");
                        (
                            reference(&row, &q, &d),
                            kernel(Level::Neon, &row, &q, &d, &sums),
                        )
                    }
                    _ => panic!("{ty:?}: not a Q8_0 / Q8_1 / Q8_K format"),
                };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty:?} k={k} raw={raw}: {got} vs {want}"
                );
            }
        }
    }
}

/// A kernel built on `neon_dot`, with one dot step.
type Run = unsafe fn(&[u8], Act<'_>) -> f32;

/// `K` with plain NEON and with `sdot`.
fn steps<K: RowDot>() -> [Run; 2] {
    [run_plain::<K>, run_sdot::<K>]
}

/// Both dot steps of every kernel built on `neon_dot` (plain NEON always; `sdot` where this
/// CPU has `dotprod`, as qemu's default CPU does) equal the reference bit for bit.
#[test]
fn neon_dot_steps_are_bit_identical_to_reference() {
    let kernels: [(GgmlType, &[usize], [Run; 2]); 7] = [
        (GgmlType::Q4_1, &[0, 2], steps::<neon_q81::Q4_1>()),
        (GgmlType::Q5_1, &[0, 2], steps::<neon_q81::Q5_1>()),
        (GgmlType::IQ4_NL, &[0], steps::<neon_q81::Iq4Nl>()),
        (GgmlType::Q2_K, &[80, 82], steps::<neon_kq2::Q2K>()),
        (GgmlType::Q3_K, &[108], steps::<neon_kq2::Q3K>()),
        (GgmlType::Q5_K, &[0, 2], steps::<neon_kq2::Q5K>()),
        (GgmlType::IQ4_XS, &[0], steps::<neon_kq2::Iq4Xs>()),
    ];
    let sdot = std::arch::is_aarch64_feature_detected!("dotprod");
    let mut rng = StdRng::seed_from_u64(63);
    for (ty, scales, runs) in kernels {
        let fmt = quant::format(ty).expect("registered format");
        let act_block = fmt.block_elems.min(256);
        for blocks in [1, 2, 7] {
            let k = fmt.block_elems * blocks;
            let row = random_blocks(&mut rng, blocks, fmt.block_bytes, scales);
            for raw in [false, true] {
                let q8_1 = matches!(fmt.dot, RefDot::Q8_1(_));
                let (q, d, _, s) = activations_s(&mut rng, k, act_block, raw, q8_1);
                let want = match fmt.dot {
                    RefDot::Q8_0(f) | RefDot::Q8K(f) => f(&row, &q, &d),
                    RefDot::Q8_1(f) => f(&row, &q, &d, &s),
                    _ => panic!("{ty:?}: not a Q8_0 / Q8_1 / Q8_K format"),
                };
                let x = Act {
                    q: &q,
                    d: &d,
                    s: &s,
                };
                for (run, name) in runs
                    .iter()
                    .zip(["plain", "sdot"])
                    .take(1 + usize::from(sdot))
                {
                    // SAFETY: NEON is part of every aarch64 Linux target; `sdot` runs only
                    // where `dotprod` was detected.
                    let got = unsafe { run(&row, x) };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty:?} {name} k={k} raw={raw}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn neon_four_token_kernels_equal_single_dots() {
    let mut rng = StdRng::seed_from_u64(62);
    let k = 2560;
    let row = random_blocks(&mut rng, k / 32, 34, &[0]);
    let acts: Vec<_> = (0..4)
        .map(|t| activations(&mut rng, k, 32, t % 2 == 0))
        .collect();
    let four = q8_0_dot4(
        Level::Neon,
        &row,
        std::array::from_fn(|t| &acts[t].0[..]),
        std::array::from_fn(|t| &acts[t].1[..]),
    );
    for (t, (q, d, _)) in acts.iter().enumerate() {
        let want = quant::q8_0::dot_q8_0(&row, q, d);
        assert_eq!(four[t].to_bits(), want.to_bits(), "q8_0_dot4 t={t}");
    }
    // I2_S with every code (3 included) against raw activations.
    let codes: Vec<u8> = (0..k / 4).map(|_| rng.random()).collect();
    let qs: Vec<Vec<i8>> = (0..4).map(|_| random_q(&mut rng, k)).collect();
    let sums: [i32; 4] = std::array::from_fn(|t| qs[t].iter().map(|&v| i32::from(v)).sum());
    let four = i2s_dot4(
        Level::Neon,
        &codes,
        std::array::from_fn(|t| &qs[t][..]),
        sums,
    );
    for t in 0..4 {
        assert_eq!(four[t], quant::i2s::dot(&codes, &qs[t]), "i2s_dot4 t={t}");
        assert_eq!(
            i2s_dot(Level::Neon, &codes, &qs[t], sums[t]),
            four[t],
            "i2s_dot t={t}"
        );
    }
}

/// `fcvtl` widens every half (subnormals, infinities, NaNs) as `half` converts it.
#[test]
fn neon_widens_every_half_exactly() {
    use std::arch::aarch64::{vdupq_n_u16, vgetq_lane_f32};
    for bits in 0..=u16::MAX {
        // SAFETY: NEON is part of every aarch64 Linux target.
        let got =
            unsafe { vgetq_lane_f32::<0>(super::super::neon_float::widen(vdupq_n_u16(bits))[0]) };
        let want = f16::from_bits(bits).to_f32();
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "half {bits:#06x}: {got} vs {want}"
        );
    }
}

/// The BF16 and F32 dots equal the exact sum up to float rounding, at lengths with and
/// without tails (16-, 4- and 1-element steps), as their references do.
#[test]
fn neon_bf16_and_f32_dots_match_reference() {
    let mut rng = StdRng::seed_from_u64(64);
    for n in [1, 3, 4, 7, 16, 33, 100, 2560] {
        let w: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let x: Vec<f32> = (0..n)
            .map(|_| half::bf16::from_f32(rng.random_range(-2.0..2.0)).to_f32())
            .collect();
        let w32: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let wbf: Vec<u8> = w
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let exact = |row: &[u8], ty: GgmlType| -> f64 {
            let mut deq = vec![0f32; n];
            (quant::format(ty).expect("float format").dequantize)(row, &mut deq);
            deq.iter()
                .zip(&x)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        };
        let tol = 1e-5 * (n as f64).sqrt() + 1e-6;
        let cases = [
            (
                "f32",
                f32_dot(Level::Neon, &w32, &x),
                exact(&w32, GgmlType::F32),
            ),
            (
                "bf16",
                bf16_dot(Level::Neon, &wbf, &x),
                exact(&wbf, GgmlType::BF16),
            ),
            (
                "f32 ref",
                quant::float::dot_f32(&w32, &x),
                exact(&w32, GgmlType::F32),
            ),
            (
                "bf16 ref",
                quant::float::dot_bf16(&wbf, &x),
                exact(&wbf, GgmlType::BF16),
            ),
        ];
        for (name, got, want) in cases {
            assert!(
                (f64::from(got) - want).abs() < tol,
                "{name} n={n}: {got} vs {want}"
            );
        }
    }
}

/// The BF16 loads widen every pattern (NaNs aside) as `half` converts it.
#[test]
fn neon_widens_every_bf16_exactly() {
    use super::super::neon_float::{Bf16, Elem};
    use std::arch::aarch64::vst1q_f32;
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let mut lanes = [0f32; 12];
    for i in (0..bits.len()).step_by(8) {
        // SAFETY: NEON is part of every aarch64 Linux target; elements i..i + 8 exist and
        // `lanes` holds 12 values.
        unsafe {
            let [a, b] = Bf16::load8(bytes.as_ptr(), i);
            vst1q_f32(lanes.as_mut_ptr(), a);
            vst1q_f32(lanes.as_mut_ptr().add(4), b);
            vst1q_f32(lanes.as_mut_ptr().add(8), Bf16::load4(bytes.as_ptr(), i));
        }
        for (e, &got) in lanes.iter().enumerate() {
            let j = i + e % 8;
            // SAFETY: element j exists.
            let one = unsafe { Bf16::at(bytes.as_ptr(), j) };
            let want = half::bf16::from_bits(bits[j]).to_f32();
            for v in [got, one] {
                assert!(
                    v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()),
                    "bf16 {:#06x}: {v} vs {want}",
                    bits[j]
                );
            }
        }
    }
}
