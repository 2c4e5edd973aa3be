//! The ops of the Qwen3 / Gemma 3 graphs against the CPU reference (run on lavapipe in CI).
//!
//! Tolerances:
//! - head_rmsnorm: |Δ| ≤ 2e-6·|y| + 1e-7 (f32 sum vs the CPU's f64 sum), as rmsnorm.
//! - scale, add: exact.
//! - window attention: |Δ| ≤ 1e-4·max|v|, as full attention (decode rounds probabilities
//!   to F16 on both sides).

use rand::Rng;

use super::ops::{AttnDims, Elementwise, WindowAttention};
use super::tests::{cpu_attention, ctx_with, dims, random_kv, rng, run, PagedSeq, KV_TYPES};
use super::*;
use crate::backend::cpu::{rms_norm, Heads, QueryRow};
use crate::kv::KvType;

fn ctx() -> Option<GpuContext> {
    ctx_with(&GpuOptions::default())
}

#[test]
fn elementwise_ops_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(21);
    let (t, hd, heads) = (3usize, 40usize, 5usize);
    let n = hd * heads;
    let x: Vec<f32> = (0..t * n).map(|_| r.random_range(-4.0..4.0)).collect();
    let y: Vec<f32> = (0..t * n).map(|_| r.random_range(-4.0..4.0)).collect();
    let w: Vec<f32> = (0..hd).map(|_| r.random_range(0.5..1.5)).collect();
    let (xb, yb, wb) = (
        GpuBuffer::from_slice(&ctx, "x", &x).unwrap(),
        GpuBuffer::from_slice(&ctx, "y", &y).unwrap(),
        GpuBuffer::from_slice(&ctx, "w", &w).unwrap(),
    );
    let ob = GpuBuffer::zeroed(&ctx, "out", (t * n * 4) as u64).unwrap();

    let norm = Elementwise::head_rms_norm(&ctx, &xb, &wb, n, hd, 1e-6, &ob).unwrap();
    run(&ctx, |p| norm.record(p, t as u32));
    let got = ob.read::<f32>(&ctx).unwrap();
    let mut want = vec![0f32; t * n];
    rms_norm(&x, &w, 1e-6, &mut want);
    for (i, (&g, &c)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - c).abs() <= 2e-6 * c.abs() + 1e-7,
            "{i}: gpu {g} cpu {c}"
        );
    }

    let scale = Elementwise::scale(&ctx, &xb, n, 8.0).unwrap();
    run(&ctx, |p| scale.record(p, t as u32));
    let got = xb.read::<f32>(&ctx).unwrap();
    assert!(got.iter().zip(&x).all(|(&g, &v)| g == v * 8.0));

    let add = Elementwise::add(&ctx, &xb, &yb, n).unwrap();
    run(&ctx, |p| add.record(p, t as u32));
    let got = xb.read::<f32>(&ctx).unwrap();
    for (i, ((&g, &v), &u)) in got.iter().zip(&x).zip(&y).enumerate() {
        assert_eq!(g, v * 8.0 + u, "{i}");
    }
    assert!(Elementwise::head_rms_norm(&ctx, &xb, &wb, n + 1, hd, 1e-6, &ob).is_err());

    let before = xb.read::<f32>(&ctx).unwrap();
    let cap = Elementwise::softcap(&ctx, &xb, n, 3.0).unwrap();
    run(&ctx, |p| cap.record(p, t as u32));
    let got = xb.read::<f32>(&ctx).unwrap();
    for (i, (&g, &v)) in got.iter().zip(&before).enumerate() {
        let c = (v / 3.0).tanh() * 3.0;
        assert!(
            (g - c).abs() <= 1e-5 * c.abs().max(1.0),
            "{i}: gpu {g} cpu {c}"
        );
    }
}

/// `n` tokens after `pos0` cached positions (in a cache of `ty`), window `window`, against
/// the CPU.
fn window_case(
    ctx: &GpuContext,
    (d, ty): (AttnDims, KvType),
    window: usize,
    pos0: usize,
    n: usize,
) {
    let mut r = rng(22 + pos0 as u64);
    let (hq, kvd) = (d.n_head * d.head_dim, d.kv_dim());
    let n_ctx = pos0 + n + 3;
    let n_kv = pos0 + n;
    let kc = random_kv(&mut r, n_kv * kvd);
    let vc = random_kv(&mut r, n_kv * kvd);
    let q: Vec<f32> = (0..n * hq).map(|_| r.random_range(-3.0..3.0)).collect();
    let seq = PagedSeq::typed(ctx, ty, n_ctx, kvd, pos0, n);
    seq.write_rows(ctx, &kc, &vc);
    let step = ops::StepUniform::new(ctx).unwrap();
    step.write(ctx, n as u32, pos0 as u32);
    let qb = GpuBuffer::from_slice(ctx, "q", &q).unwrap();
    let out = GpuBuffer::zeroed(ctx, "att", (n * hq * 4) as u64).unwrap();
    let op = WindowAttention::new(ctx, d, window, &step, &qb, seq.both(), &out).unwrap();
    run(ctx, |p| op.record(p, n as u32));
    let got = out.read::<f32>(ctx).unwrap();

    let rows: Vec<QueryRow> = (0..n)
        .map(|t| QueryRow {
            seq: 0,
            pos: pos0 + t,
            round_probs: n == 1,
        })
        .collect();
    let heads = Heads {
        n_head: d.n_head,
        n_head_kv: d.n_head_kv,
        head_dim: d.head_dim,
        window: Some(window),
    };
    let want = cpu_attention(ty, &q, (&kc, &vc), &rows, heads, n_ctx);
    for (i, (&g, &c)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - c).abs() / 2.0 <= 1e-4,
            "{d:?} {ty:?} window {window} pos0 {pos0} n {n} out[{i}]: gpu {g} cpu {c}"
        );
    }
}

#[test]
fn window_attention_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    // Decode and batches, windows smaller and larger than the context, > 256 keys.
    for &(d, window, pos0, n) in &[
        (dims(4, 1, 64, 64, 1e4), 16usize, 40usize, 1usize),
        (dims(4, 1, 64, 64, 1e4), 16, 0, 30),
        (dims(6, 2, 40, 40, 1e4), 5, 7, 9),
        (dims(4, 2, 32, 32, 1e4), 300, 350, 1),
        (dims(4, 2, 32, 32, 1e4), 300, 10, 3),
        (dims(2, 1, 256, 256, 1e4), 512, 20, 4),
    ] {
        for ty in KV_TYPES {
            window_case(&ctx, (d, ty), window, pos0, n);
        }
    }
}

#[test]
fn quant_i8_is_bit_exact() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(23);
    let (t, n) = (5usize, 1028usize);
    let mut x: Vec<f32> = (0..t * n).map(|_| r.random_range(-3.0..3.0)).collect();
    // An all-zero row takes the 1e-5 floor.
    x[n..2 * n].fill(0.0);
    let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
    let q = ops::QuantAct::new(&ctx, n, t).unwrap();
    let op = Elementwise::quant_i8(&ctx, &xb, &q).unwrap();
    run(&ctx, |p| op.record(p, t as u32));
    let words = q.q.read::<u32>(&ctx).unwrap();
    let meta = q.meta.read::<u32>(&ctx).unwrap();
    for row in 0..t {
        let mut want = vec![0i8; n];
        let pt = crate::quant::act::quantize_per_token(&x[row * n..][..n], &mut want);
        let got: Vec<i8> = words[row * n / 4..][..n / 4]
            .iter()
            .flat_map(|w| w.to_le_bytes().map(|b| b as i8))
            .collect();
        assert_eq!(got, want, "row {row}");
        assert_eq!(f32::from_bits(meta[2 * row]), pt.scale, "row {row} scale");
        assert_eq!(meta[2 * row + 1] as i32, pt.sum, "row {row} Σq");
    }
    assert!(Elementwise::quant_i8(&ctx, &xb, &ops::QuantAct::new(&ctx, 6, 1).unwrap()).is_err());
}
