//! A requantized Q6_K LM head (interleaved in quads where AVX-512 runs) against the scalar
//! reference dot of its rows, bit for bit, at row counts that leave partial quads and
//! partial tasks, for one and several tokens; a resident copy of a stored matrix against
//! the stored one.

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
    for (k, m, tokens) in [(256, 1, 1), (512, 37, 1), (768, 16, 3), (2560, 53, 2)] {
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
    // A requantized matrix is already in memory.
    assert!(stored
        .requantized(GgmlType::Q6_K)
        .unwrap()
        .resident()
        .is_none());
}
