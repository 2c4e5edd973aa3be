//! The repacked AVX-512 products against the file formats' scalar reference dots, bit for
//! bit, on random weights and activations of odd sizes (row counts that leave a partial
//! group, token counts that leave partial tiles).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::backend::cpu::simd::{self, Level};
use crate::quant::act;

/// The token, or None after checking that this CPU indeed lacks (or was told not to use)
/// the AVX-512 kernels.
fn vnni() -> Option<simd::Vnni> {
    let v = simd::Vnni::get();
    assert_eq!(v.is_some(), Level::detect() == Level::Avx512);
    v
}

/// Every set of interleaved-layout kernels this CPU runs (AVX-512 VNNI, AVX2), whichever
/// level was chosen.
fn all_tiles() -> Vec<Tiles> {
    let tiles: Vec<Tiles> = vnni()
        .map(Tiles::Vnni)
        .into_iter()
        .chain(Tiles::avx2_present())
        .collect();
    #[cfg(target_arch = "x86_64")]
    assert!(
        !tiles.is_empty() || !is_x86_feature_detected!("avx2"),
        "an AVX2 CPU runs the AVX2 tiles"
    );
    tiles
}

fn random_x(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect()
}

/// `rows × k` ternary weights of the given format, some rows holding code 3 (read as +2).
fn random_tensor(rng: &mut StdRng, ty: GgmlType, k: usize, m: usize) -> Vec<u8> {
    let w = random_x(rng, k * m);
    let mut data = match ty {
        GgmlType::I2_S => {
            let mut t = vec![0u8; k * m / 4 + quant::i2s::TAIL_BYTES];
            let ternary: Vec<f32> = w.iter().map(|v| v.round().clamp(-1.0, 1.0)).collect();
            quant::i2s::quantize_tensor(&ternary, &mut t);
            t
        }
        _ => {
            let rb = ty.row_bytes(k as u64).expect("whole blocks") as usize;
            let mut t = vec![0u8; rb * m];
            for (src, dst) in w.chunks_exact(k).zip(t.chunks_exact_mut(rb)) {
                match ty {
                    GgmlType::TQ2_0 => quant::tq2_0::quantize_row(src, dst),
                    _ => quant::tq1_0::quantize_row(src, dst),
                }
            }
            t
        }
    };
    if ty != GgmlType::TQ1_0 {
        // TQ1_0 cannot hold code 3; the 2-bit formats can.
        data[0] = 0xFF;
        data[5] |= 0b11;
    }
    data
}

/// Asserts that `out` (`rows × m`) equals `want(t, j)` bit for bit at every token t and
/// row j.
fn assert_bits(out: &[f32], m: usize, want: impl Fn(usize, usize) -> f32, what: &str) {
    for (t, o) in out.chunks_exact(m).enumerate() {
        for (j, got) in o.iter().enumerate() {
            assert_eq!(got.to_bits(), want(t, j).to_bits(), "{what} t={t} j={j}");
        }
    }
}

/// `q` (rows of `k`) in the kernels' token tiles of at most `cap`.
fn tiled(q: &[i8], k: usize, cap: usize) -> Vec<i8> {
    let mut out = vec![0i8; q.len()];
    simd::interleave_tokens(q, k, cap, &mut out);
    out
}

/// Rows of `k` quantized per token: the int8 values, the scales and the sums.
fn per_token(x: &[f32], k: usize) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
    let mut q = vec![0i8; x.len()];
    let p: Vec<act::PerToken> = x
        .chunks_exact(k)
        .zip(q.chunks_exact_mut(k))
        .map(|(x, q)| act::quantize_per_token(x, q))
        .collect();
    let (scale, sum) = p.iter().map(|p| (p.scale, p.sum)).unzip();
    (q, scale, sum)
}

#[test]
fn i2s_products_equal_the_reference() {
    for tiles in all_tiles() {
        i2s_products(tiles);
    }
}

/// [`i2s_products_equal_the_reference`] with one set of kernels.
fn i2s_products(v: Tiles) {
    let mut rng = StdRng::seed_from_u64(16);
    // 2100 rows: 132 groups, the last one partial; a decode step runs them several groups a
    // task (8 on 2 threads, the last task 4 groups).
    for (k, m) in [(128, 16), (384, 37), (2560, 21), (128, 2100)] {
        let data = random_tensor(&mut rng, GgmlType::I2_S, k, m);
        let pack = TernaryPack::new(v, GgmlType::I2_S, &data, (k, m), &|_| {}).expect("I2_S packs");
        for rows in [1, 3, 16, 21, 40] {
            let (q, scale, sum) = per_token(&random_x(&mut rng, rows * k), k);
            let post = 0.73f32;
            let mut out = vec![f32::NAN; rows * m];
            let x = PackInput::PerToken {
                q: &tiled(&q, k, pack.token_tile()),
                scale: &scale,
                sum: &sum,
            };
            pack.forward(x, post, &mut out);
            let want = |t: usize, j: usize| {
                let dot = quant::i2s::dot(&data[j * k / 4..(j + 1) * k / 4], &q[t * k..][..k]);
                (dot as f32 / scale[t]) * post
            };
            assert_bits(&out, m, want, &format!("{v:?} k={k} m={m} rows={rows}"));
        }
    }
}

/// The largest sums the kernels meet: every code 3 (read as +2) against activations of
/// −128 and 127, over a width whose 16-bit partial sums would overflow if they ran too
/// long before widening.
#[test]
fn i2s_extreme_sums_are_exact() {
    let (k, m) = (6912, 16);
    let data = vec![0xFFu8; k * m / 4 + quant::i2s::TAIL_BYTES];
    for v in all_tiles() {
        let pack = TernaryPack::new(v, GgmlType::I2_S, &data, (k, m), &|_| {}).expect("I2_S packs");
        for (rows, fill) in [(1, -128i8), (4, -128), (16, 127), (5, -128)] {
            let q = vec![fill; rows * k];
            let sum = vec![i32::from(fill) * k as i32; rows];
            let scale = vec![1.0f32; rows];
            let mut out = vec![f32::NAN; rows * m];
            let x = PackInput::PerToken {
                q: &tiled(&q, k, pack.token_tile()),
                scale: &scale,
                sum: &sum,
            };
            pack.forward(x, 1.0, &mut out);
            let want = |t: usize, j: usize| {
                quant::i2s::dot(&data[j * k / 4..(j + 1) * k / 4], &q[t * k..][..k]) as f32
            };
            assert_bits(&out, m, want, &format!("{v:?} rows={rows} q={fill}"));
        }
    }
}

/// A decode step's tasks take up to eight groups while that leaves eight tasks a thread;
/// a prompt's take one.
#[test]
fn decode_tasks_take_several_groups() {
    assert_eq!(groups_per_task(864, 1, 2), 8);
    assert_eq!(groups_per_task(160, 1, 2), 8);
    assert_eq!(groups_per_task(100, 1, 2), 6);
    assert_eq!(groups_per_task(10, 1, 2), 1);
    assert_eq!(groups_per_task(160, 1, 16), 1);
    assert_eq!(groups_per_task(864, 1, 0), 8);
    assert_eq!(groups_per_task(864, 2, 2), 1);
}

#[test]
fn fused_products_equal_the_single_ones() {
    for tiles in all_tiles() {
        fused_products(tiles);
    }
}

/// [`fused_products_equal_the_single_ones`] with one set of kernels.
fn fused_products(v: Tiles) {
    let mut rng = StdRng::seed_from_u64(18);
    let k = 640;
    // Q, K, V-like shapes: partial groups, and a product whose chunks sit between others.
    let ms = [75, 16, 37];
    let datas = ms.map(|m| random_tensor(&mut rng, GgmlType::I2_S, k, m));
    let mut packs = Vec::new();
    for (data, m) in datas.iter().zip(ms) {
        packs.push(TernaryPack::new(v, GgmlType::I2_S, data, (k, m), &|_| {}).expect("I2_S packs"));
    }
    for rows in [1, 5, 17] {
        let (q, scale, sum) = per_token(&random_x(&mut rng, rows * k), k);
        let q = tiled(&q, k, v.token_tile());
        let x = PackInput::PerToken {
            q: &q,
            scale: &scale,
            sum: &sum,
        };
        let posts = [0.5f32, 1.25, 3.0];
        let mut single = ms.map(|m| vec![f32::NAN; rows * m]);
        for ((pack, out), post) in packs.iter().zip(&mut single).zip(posts) {
            pack.forward(x, post, out);
        }
        let mut fused = ms.map(|m| vec![f32::NAN; rows * m]);
        let [a, b, c] = fused.each_mut();
        TernaryPack::forward_fused(
            x,
            [
                Product {
                    pack: &packs[0],
                    post: posts[0],
                    out: a,
                },
                Product {
                    pack: &packs[1],
                    post: posts[1],
                    out: b,
                },
                Product {
                    pack: &packs[2],
                    post: posts[2],
                    out: c,
                },
            ],
        );
        for (i, (f, s)) in fused.iter().zip(&single).enumerate() {
            assert_bits(
                f,
                ms[i],
                |t, j| s[t * ms[i] + j],
                &format!("product {i} rows={rows}"),
            );
        }
    }
}

/// The packed products of `ty` (TQ2_0, TQ1_0) against `reference`, with every set of
/// kernels.
fn check_q8k(ty: GgmlType, reference: fn(&[u8], &[i8], &[f32]) -> f32) {
    for tiles in all_tiles() {
        check_q8k_with(tiles, ty, reference);
    }
}

fn check_q8k_with(v: Tiles, ty: GgmlType, reference: fn(&[u8], &[i8], &[f32]) -> f32) {
    let mut rng = StdRng::seed_from_u64(17);
    for (k, m) in [(256, 16), (768, 21), (2560, 35)] {
        let data = random_tensor(&mut rng, ty, k, m);
        let rb = ty.row_bytes(k as u64).expect("whole blocks") as usize;
        let pack = TernaryPack::new(v, ty, &data, (k, m), &|_| {}).expect("ternary packs");
        let nb = k / 256;
        for rows in [1, 2, 7, 8, 19, 40] {
            let x = random_x(&mut rng, rows * k);
            let (mut q, mut d) = (vec![0i8; rows * k], vec![0f32; rows * nb]);
            for ((x, q), d) in x
                .chunks_exact(k)
                .zip(q.chunks_exact_mut(k))
                .zip(d.chunks_exact_mut(nb))
            {
                act::quantize_q8k(x, q, d);
            }
            let bsum: Vec<i32> = q
                .chunks_exact(256)
                .map(|b| b.iter().map(|&v| i32::from(v)).sum())
                .collect();
            let mut out = vec![f32::NAN; rows * m];
            let (mut dt, mut bt) = (d.clone(), bsum.clone());
            simd::interleave_blocks(&d, nb, pack.token_tile(), &mut dt);
            simd::interleave_blocks(&bsum, nb, pack.token_tile(), &mut bt);
            let x = Q8kRows {
                q: &tiled(&q, k, pack.token_tile()),
                d: &dt,
                bsum: &bt,
            };
            pack.forward(PackInput::Q8K(x), 1.5, &mut out);
            let want = |t: usize, j: usize| {
                reference(&data[j * rb..][..rb], &q[t * k..][..k], &d[t * nb..][..nb]) * 1.5
            };
            assert_bits(
                &out,
                m,
                want,
                &format!("{v:?} {ty} k={k} m={m} rows={rows}"),
            );
        }
    }
}

#[test]
fn tq2_0_products_equal_the_reference() {
    check_q8k(GgmlType::TQ2_0, quant::tq2_0::dot_q8k);
}

#[test]
fn tq1_0_products_equal_the_reference() {
    check_q8k(GgmlType::TQ1_0, quant::tq1_0::dot_q8k);
}

/// Products against Q8_0 activations (Q1_0, Q2_0, Q8_0, Q4_0 weights) and the reference
/// dot, bit for bit: Q1_0 random sign bits with quantized scales; the others random bytes
/// (Q2_0 codes 3 included) with random F16 scales of both signs.
/// The packed products of `ty` (Q8_0-paired) against `reference`, with every set of
/// kernels that takes it.
fn check_q8_0(ty: GgmlType, reference: fn(&[u8], &[i8], &[f32]) -> f32, sizes: &[(usize, usize)]) {
    for tiles in all_tiles().into_iter().filter(|t| t.take(ty)) {
        check_q8_0_with(tiles, ty, reference, sizes);
    }
}

fn check_q8_0_with(
    v: Tiles,
    ty: GgmlType,
    reference: fn(&[u8], &[i8], &[f32]) -> f32,
    sizes: &[(usize, usize)],
) {
    let mut rng = StdRng::seed_from_u64(19);
    for &(k, m) in sizes {
        let rb = ty.row_bytes(k as u64).expect("whole blocks") as usize;
        let data: Vec<u8> = match ty {
            GgmlType::Q1_0 => {
                let mut t = vec![0u8; rb * m];
                let w = random_x(&mut rng, k * m);
                for (src, dst) in w.chunks_exact(k).zip(t.chunks_exact_mut(rb)) {
                    quant::q1_0::quantize_row(src, dst);
                }
                t
            }
            _ => {
                let mut t: Vec<u8> = (0..rb * m).map(|_| rng.random()).collect();
                for b in t.chunks_exact_mut(ty.block_bytes()) {
                    let d = half::f16::from_f32(rng.random_range(-0.2f32..0.2));
                    b[..2].copy_from_slice(&d.to_le_bytes());
                }
                t
            }
        };
        let pack = TernaryPack::new(v, ty, &data, (k, m), &|_| {}).expect("the format packs");
        let ns = k / 32;
        for rows in [1, 2, 3, 7, 8, 9, 19, 30, 40] {
            let x = random_x(&mut rng, rows * k);
            let (mut q, mut d) = (vec![0i8; rows * k], vec![0f32; rows * ns]);
            act::quantize_q8_0(&x, &mut q, &mut d);
            let sum: Vec<i32> = q
                .chunks_exact(32)
                .map(|b| b.iter().map(|&v| i32::from(v)).sum())
                .collect();
            let mut out = vec![f32::NAN; rows * m];
            let (mut dt, mut st) = (d.clone(), sum.clone());
            simd::interleave_blocks(&d, ns, pack.token_tile(), &mut dt);
            simd::interleave_blocks(&sum, ns, pack.token_tile(), &mut st);
            let x = Q80Rows {
                q: &tiled(&q, k, pack.token_tile()),
                d: &dt,
                sum: &st,
            };
            pack.forward(PackInput::Q8_0(x), 0.625, &mut out);
            let want = |t: usize, j: usize| {
                reference(&data[j * rb..][..rb], &q[t * k..][..k], &d[t * ns..][..ns]) * 0.625
            };
            assert_bits(
                &out,
                m,
                want,
                &format!("{v:?} {ty} k={k} m={m} rows={rows}"),
            );
        }
    }
}

#[test]
fn q1_0_products_equal_the_reference() {
    let sizes = [(128, 16), (384, 21), (2048, 35)];
    check_q8_0(GgmlType::Q1_0, quant::q1_0::dot_q8_0, &sizes);
}

#[test]
fn q2_0_products_equal_the_reference() {
    let sizes = [(64, 5), (192, 16), (320, 21), (2048, 35)];
    check_q8_0(GgmlType::Q2_0, quant::q2_0::dot_q8_0, &sizes);
}

#[test]
fn q8_0_products_equal_the_reference() {
    // Random bytes: every value −128..=127 (−128 included, which ggml's quantizer never
    // writes) with random F16 scales of both signs.
    let sizes = [(32, 5), (96, 16), (320, 21), (2048, 35)];
    check_q8_0(GgmlType::Q8_0, quant::q8_0::dot_q8_0, &sizes);
}

#[test]
fn q4_0_products_equal_the_reference() {
    let sizes = [(32, 5), (96, 16), (320, 21), (2048, 35)];
    check_q8_0(GgmlType::Q4_0, quant::q4_0::dot_q8_0, &sizes);
}

#[test]
fn other_formats_and_widths_are_not_packed() {
    let Some(v) = vnni() else { return };
    assert!(TernaryPack::new(Tiles::Vnni(v), GgmlType::Q4_1, &[0; 20], (32, 1), &|_| {}).is_none());
    // TQ2_0 rows must be whole 256-element blocks.
    assert!(
        TernaryPack::new(Tiles::Vnni(v), GgmlType::TQ2_0, &[0; 66], (128, 1), &|_| {}).is_none()
    );
    // Q1_0 rows must be whole 128-element blocks.
    assert!(TernaryPack::new(Tiles::Vnni(v), GgmlType::Q1_0, &[0; 18], (64, 1), &|_| {}).is_none());
}

/// The AVX2 kernels take the 2-bit I2_S, TQ2_0, TQ1_0 and Q2_0 only: the other formats
/// keep their row kernels there.
#[test]
fn avx2_tiles_take_two_bit_codes_only() {
    for v in Tiles::avx2_present() {
        let i2s = vec![0x55u8; 256 * 16 / 4 + quant::i2s::TAIL_BYTES];
        assert!(TernaryPack::new(v, GgmlType::I2_S, &i2s, (256, 16), &|_| {}).is_some());
        for ty in [GgmlType::TQ2_0, GgmlType::TQ1_0, GgmlType::Q2_0] {
            let data = vec![0u8; ty.row_bytes(256).expect("whole blocks") as usize * 16];
            assert!(
                TernaryPack::new(v, ty, &data, (256, 16), &|_| {}).is_some(),
                "{ty:?}"
            );
        }
        for ty in [GgmlType::Q1_0, GgmlType::Q8_0, GgmlType::Q4_0] {
            let data = vec![0u8; ty.row_bytes(256).expect("whole blocks") as usize * 16];
            assert!(
                TernaryPack::new(v, ty, &data, (256, 16), &|_| {}).is_none(),
                "{ty:?}"
            );
        }
    }
}

#[test]
fn packed_codes_sit_where_the_layout_says() {
    // Row r, element e: chunk e / 16, byte 4r + e % 4, bits 2·((e % 16) / 4).
    let Some(v) = vnni() else { return };
    let mut rng = StdRng::seed_from_u64(18);
    let (k, m) = (256, 19);
    let data = random_tensor(&mut rng, GgmlType::I2_S, k, m);
    let pack = TernaryPack::new(Tiles::Vnni(v), GgmlType::I2_S, &data, (k, m), &|_| {})
        .expect("I2_S packs");
    let mut codes = vec![0u8; k];
    for j in 0..32 {
        let (g, r) = (j / 16, j % 16);
        if j < m {
            quant::i2s::codes_row(&data[j * k / 4..(j + 1) * k / 4], &mut codes);
        } else {
            codes.fill(1);
        }
        for (e, &c) in codes.iter().enumerate() {
            let byte = pack.codes(g)[e / 16].0[4 * r + e % 4];
            assert_eq!((byte >> (2 * ((e % 16) / 4))) & 3, c, "row {j} element {e}");
        }
    }
}

#[test]
fn q1_0_bits_sit_where_the_layout_says() {
    // Row r, element e: chunk e / 32, 64-bit word (e % 32) / 4, bit 4r + e % 4.
    let Some(v) = vnni() else { return };
    let mut rng = StdRng::seed_from_u64(20);
    let (k, m) = (256, 19);
    let rb = GgmlType::Q1_0.row_bytes(k as u64).expect("whole blocks") as usize;
    let mut data = vec![0u8; rb * m];
    let w = random_x(&mut rng, k * m);
    for (src, dst) in w.chunks_exact(k).zip(data.chunks_exact_mut(rb)) {
        quant::q1_0::quantize_row(src, dst);
    }
    let pack = TernaryPack::new(Tiles::Vnni(v), GgmlType::Q1_0, &data, (k, m), &|_| {})
        .expect("Q1_0 packs");
    let (mut codes, mut scales) = (vec![0u8; k], vec![0f32; k / 128]);
    for j in 0..m {
        let (g, r) = (j / 16, j % 16);
        quant::q1_0::codes_row(&data[j * rb..(j + 1) * rb], &mut codes, &mut scales);
        for (e, &c) in codes.iter().enumerate() {
            let chunk = &pack.codes(g)[e / 32].0;
            let word = (e % 32) / 4;
            let bits = u64::from_le_bytes(chunk[8 * word..8 * word + 8].try_into().unwrap());
            assert_eq!(
                (bits >> (4 * r + e % 4)) & 1 == 1,
                c == 2,
                "row {j} element {e}"
            );
        }
    }
}

#[test]
fn token_tiles_sit_where_the_layout_says() {
    // Tiles: runs of `cap` from token 0, each split into powers of two (21 = 16 + 4 + 1 in
    // runs of 16, 8 + 8 + 4 + 1 in runs of 8); within a tile of tn tokens starting at
    // `first`, element e of token first + t sits at first·k + ((e / 16)·tn + t)·16 + e % 16.
    let k = 64;
    for cap in [simd::AVX2_TOKEN_TILE, simd::TOKEN_TILE, simd::SUB_TILE] {
        for n in [1usize, 2, 3, 16, 21, 40] {
            let q: Vec<i8> = (0..n * k).map(|i| (i % 251) as i8).collect();
            let out = tiled(&q, k, cap);
            let mut first = 0;
            let mut seen = 0;
            while first < n {
                let left = (n - first).min(cap - first % cap);
                let tn = 1 << left.ilog2();
                for t in 0..tn {
                    for e in 0..k {
                        let at = first * k + ((e / 16) * tn + t) * 16 + e % 16;
                        let want = q[(first + t) * k + e];
                        assert_eq!(
                            out[at],
                            want,
                            "cap={cap} n={n} token {} element {e}",
                            first + t
                        );
                        seen += 1;
                    }
                }
                first += tn;
            }
            assert_eq!(seen, n * k, "cap={cap} n={n}: every value placed");
        }
    }
}

#[test]
fn block_values_sit_where_the_layout_says() {
    // The same tiles as token_tiles_sit_where_the_layout_says; within a tile of tn tokens
    // starting at `first`, block b's value of token first + t sits at first·nb + b·tn + t.
    let nb = 5;
    for cap in [simd::AVX2_TOKEN_TILE, simd::TOKEN_TILE, simd::SUB_TILE] {
        for n in [1usize, 2, 3, 16, 21, 40] {
            let v: Vec<i32> = (0..(n * nb) as i32).collect();
            let mut out = vec![-1; v.len()];
            simd::interleave_blocks(&v, nb, cap, &mut out);
            let mut first = 0;
            while first < n {
                let left = (n - first).min(cap - first % cap);
                let tn = 1 << left.ilog2();
                for t in 0..tn {
                    for b in 0..nb {
                        let want = v[(first + t) * nb + b];
                        let at = first * nb + b * tn + t;
                        assert_eq!(
                            out[at],
                            want,
                            "cap={cap} n={n} token {} block {b}",
                            first + t
                        );
                    }
                }
                first += tn;
            }
            let mut sorted = out.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, v, "cap={cap} n={n}: every value placed once");
        }
    }
}
