//! A requantized Q6_K LM head (interleaved in quads where AVX-512 runs) against the scalar
//! reference dot of its rows, bit for bit, at row counts that leave partial quads and
//! partial tasks, for one and several tokens; a resident copy of a stored matrix against
//! the stored one, products and embedding rows.

use std::path::Path;
use std::sync::Arc;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::gguf::GgufWriter;

/// An F16 `[k × m]` tensor named `w` in an in-memory GGUF file.
fn f16_file(rng: &mut StdRng, k: usize, m: usize) -> Arc<GgufFile> {
    let bytes: Vec<u8> = (0..k * m)
        .flat_map(|_| f16::from_f32(rng.random_range(-0.5..0.5)).to_le_bytes())
        .collect();
    let mut w = GgufWriter::new();
    w.declare("w", GgmlType::F16, &[k as u64, m as u64])
        .unwrap();
    let file = w
        .to_bytes(Path::new("mem.gguf"), |_, _| Ok(bytes.clone()))
        .unwrap();
    Arc::new(GgufFile::from_bytes("mem.gguf", file).unwrap())
}

#[test]
fn q6_k_head_rows_equal_the_reference_dot() {
    let mut rng = StdRng::seed_from_u64(17);
    // 333 rows of 256: tasks of more than 16 rows on two or more threads
    // ([`rows_per_task`]), the last one partial and ending in a partial quad.
    let shapes = [
        (256, 1, 1),
        (512, 37, 1),
        (768, 16, 3),
        (2560, 53, 2),
        (256, 333, 1),
    ];
    for (k, m, tokens) in shapes {
        let file = f16_file(&mut rng, k, m);
        let head = Linear::load(&file, "w")
            .unwrap()
            .requantized(GgmlType::Q6_K)
            .unwrap();
        let x: Vec<f32> = (0..k * tokens)
            .map(|_| rng.random_range(-3.0..3.0))
            .collect();
        let mut qi = QuantInput::default();
        let mut out = vec![f32::NAN; m * tokens];
        head.forward(&x, &mut qi, &mut out);
        // The reference: each row requantized on its own, in the file's row layout.
        let rows: Vec<Vec<u8>> = (0..m)
            .map(|j| {
                let mut w = vec![0f32; k];
                head.dequantize_row(j, &mut w).unwrap();
                let mut row = vec![0u8; k / 256 * quant::q6_k::BLOCK_BYTES];
                quant::q6_k::quantize_row(&w, &mut row);
                row
            })
            .collect();
        let nb = k / 256;
        for t in 0..tokens {
            let (mut q, mut d) = (vec![0i8; k], vec![0f32; nb]);
            act::quantize_q8k(&x[t * k..(t + 1) * k], &mut q, &mut d);
            for (j, row) in rows.iter().enumerate() {
                let want = quant::q6_k::dot_q8k(row, &q, &d);
                assert_eq!(
                    out[t * m + j].to_bits(),
                    want.to_bits(),
                    "k={k} m={m} t={t} j={j}"
                );
            }
        }
    }
}

/// A task reads at least 256 KiB of weights where the product has rows enough: the 2B-4T
/// heads' 64 (F16) and 128 (Q6_K) rows on 2 threads; never fewer than 16 rows, never so
/// many that a thread gets fewer than 8 tasks (unless 16 rows already leave fewer), and
/// always a whole number of 16.
#[test]
fn tasks_read_enough_weights_and_stay_shared_out() {
    assert_eq!(rows_per_task(128_256, 5_120, 2), 64);
    assert_eq!(rows_per_task(128_256, 2_100, 2), 128);
    // Short rows, few of them: 8 tasks a thread bound the task (333 / 16 = 20 → 32).
    assert_eq!(rows_per_task(333, 210, 2), 32);
    assert_eq!(rows_per_task(2_560, 640, 4), 80);
    // Too few rows for 8 tasks a thread, or rows longer than the bytes: 16.
    for (m, row_bytes, threads) in [(8, 64, 2), (53, 5_120, 1), (1_000, 1 << 20, 2)] {
        assert_eq!(rows_per_task(m, row_bytes, threads), ROWS_PER_TASK);
    }
    assert_eq!(rows_per_task(0, 0, 0), ROWS_PER_TASK);
}

#[test]
fn a_resident_copy_gives_the_stored_products() {
    let mut rng = StdRng::seed_from_u64(18);
    let (k, m) = (512, 37);
    let file = f16_file(&mut rng, k, m);
    let stored = Linear::load(&file, "w").unwrap();
    let copy = stored
        .resident()
        .expect("an F16 matrix is streamed as stored");
    let x: Vec<f32> = (0..2 * k).map(|_| rng.random_range(-3.0..3.0)).collect();
    let (mut a, mut b) = (vec![0f32; 2 * m], vec![f32::NAN; 2 * m]);
    stored.forward(&x, &mut QuantInput::default(), &mut a);
    copy.forward(&x, &mut QuantInput::default(), &mut b);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // Embedding lookups: the copy's rows (read from the copy) are the stored ones, and a
    // requantized matrix still gives the file's rows, not its requantized values.
    let requantized = stored.requantized(GgmlType::Q6_K).unwrap();
    let row = |l: &Linear, r: usize| {
        let mut v = vec![f32::NAN; k];
        l.dequantize_row(r, &mut v).unwrap();
        v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    for r in [0, 1, m - 1] {
        assert_eq!(row(&copy, r), row(&stored, r), "row {r}");
        assert_eq!(row(&requantized, r), row(&stored, r), "row {r}");
    }
    // A requantized matrix is already in memory.
    assert!(requantized.resident().is_none());
}
