//! Timing of the fused single-token kernels (`ternary_decode.wgsl`) at BitNet 2B-4T shapes:
//! norm + q/k/v, norm + gate/up/GLU, norm + o and norm + down, each recorded 200 times into
//! one pass (every launch writes the buffer the next one reads, as in a forward pass).
//! Run with `--ignored --nocapture` on a real GPU; `TERNION_EXP_TPR` sets lanes per row.

use super::ops::{NormIn, NormMatvec, NormMatvecKind, NormQuant};
use super::tests::{ctx, rng, run, ternary_tensor, time_launches};
use super::*;
use rand::Rng;

#[test]
#[ignore]
fn bench_fused_decode_kernels() {
    let Some(ctx) = ctx() else { return };
    eprintln!("{:?}", ctx.caps());
    let mut r = rng(9);
    let mut weights = |rows: usize, k: usize| {
        let data = ternary_tensor(&mut r, rows, k);
        TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap()
    };
    let (d, ff, kv) = (2560usize, 6912usize, 640usize);
    let (q, kw, vw) = (weights(d, d), weights(kv, d), weights(kv, d));
    let (gate, up, down) = (weights(ff, d), weights(ff, d), weights(d, ff));
    let mut r = rng(10);
    let mut norm_in = |k: usize| {
        let x: Vec<f32> = (0..k).map(|_| r.random_range(-2.0..2.0)).collect();
        NormIn {
            x: GpuBuffer::from_slice(&ctx, "x", &x).unwrap(),
            w: GpuBuffer::from_slice(&ctx, "nw", &vec![1.0f32; k]).unwrap(),
            k,
            eps: 1e-5,
        }
    };
    let (nd, nff) = (norm_in(d), norm_in(ff));
    // Each launch writes the other's input buffer: dependent launches.
    let out = |n: usize| GpuBuffer::zeroed(&ctx, "y", (n * 4) as u64).unwrap();
    let (oq, ok, ov, og) = (out(d), out(kv), out(kv), out(ff));
    let bytes = |rows: usize, k: usize| (rows * k / 4) as f64;
    let qkv = NormMatvec::new(
        &ctx,
        &NormIn {
            x: og.clone(),
            ..nd.clone()
        },
        NormMatvecKind::Three {
            w: [&q, &kw, &vw],
            out: [&nd.x, &ok, &ov],
        },
    )
    .unwrap();
    // The GPU idles at a low clock: 1.5 s of load first.
    let warm = std::time::Instant::now();
    while warm.elapsed().as_secs_f32() < 1.5 {
        run(&ctx, |p| (0..200).for_each(|_| qkv.record(p)));
    }
    time_launches(&ctx, "norm + q/k/v 3840x2560", bytes(d + 2 * kv, d), &|p| {
        qkv.record(p)
    });
    let glu = NormMatvec::new(
        &ctx,
        &nd,
        NormMatvecKind::Glu {
            gate: &gate,
            up: &up,
            out: &nff.x,
            act: GluAct::ReluSqr,
        },
    )
    .unwrap();
    time_launches(&ctx, "norm + gate/up 2x6912x2560", bytes(2 * ff, d), &|p| {
        glu.record(p)
    });
    let o = NormMatvec::new(
        &ctx,
        &nd,
        NormMatvecKind::One {
            w: &q,
            out: &oq,
            epilogue: Epilogue::Store,
        },
    )
    .unwrap();
    time_launches(&ctx, "norm + o 2560x2560", bytes(d, d), &|p| o.record(p));
    let dn = NormMatvec::new(
        &ctx,
        &nff,
        NormMatvecKind::One {
            w: &down,
            out: &nd.x,
            epilogue: Epilogue::Add,
        },
    )
    .unwrap();
    time_launches(&ctx, "norm + down 2560x6912", bytes(d, ff), &|p| {
        dn.record(p)
    });
    let qa = QuantAct::new(&ctx, ff, 1).unwrap();
    let nq = NormQuant::new(&ctx, &nff, &qa).unwrap();
    time_launches(
        &ctx,
        "norm_quant 6912 (prologue alone)",
        (ff * 4) as f64,
        &|p| nq.record(p, 1),
    );
    let qa = QuantAct::new(&ctx, d, 1).unwrap();
    let nq = NormQuant::new(&ctx, &nd, &qa).unwrap();
    time_launches(
        &ctx,
        "norm_quant 2560 (prologue alone)",
        (d * 4) as f64,
        &|p| nq.record(p, 1),
    );
}
