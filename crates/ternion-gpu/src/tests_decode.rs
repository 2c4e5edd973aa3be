//! Timing of the fused single-token kernels (`ternary_decode.wgsl`) at BitNet 2B-4T shapes:
//! norm + q/k/v, norm + gate/up/GLU, norm + o and norm + down, each recorded 200 times into
//! one pass (every launch writes the buffer the next one reads, as in a forward pass).
//! Run with `--ignored --nocapture` on a real GPU; `TERNION_EXP_TPR` sets lanes per row.

use super::ops::{NormIn, NormMatvec, NormMatvecKind, NormQuant};
use super::tests::{ctx, rng, run, ternary_tensor, time_launches};
use super::*;
use crate::quant::i2s;
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

/// Wall-clock per launch of the fast decode attention (`attention_fast.wgsl`) at BitNet
/// 2B-4T's shape (20 query heads, 5 kv heads of 128) for contexts of 128, 640 and 2,048
/// keys, without and with the fused RoPE + KV store (the single-token decode launch), each
/// recorded 200 times into one pass. Run with `--ignored --nocapture`.
#[test]
#[ignore]
fn bench_decode_attention() {
    use super::tests::{dims, random_kv, PagedSeq};
    let Some(ctx) = ctx() else { return };
    let mut r = rng(11);
    let d = dims(20, 5, 128, 128, 5e5);
    let kvd = d.kv_dim();
    let step = StepUniform::new(&ctx).unwrap();
    let warm = std::time::Instant::now();
    for (i, n_kv) in [640usize, 128, 640, 2048].into_iter().enumerate() {
        let seq = PagedSeq::new(&ctx, n_kv + 5, kvd, n_kv - 1, 1);
        seq.write_rows(
            &ctx,
            &random_kv(&mut r, n_kv * kvd),
            &random_kv(&mut r, n_kv * kvd),
        );
        seq.index
            .write_blocks(&ctx, std::iter::once(1), &mut Vec::new());
        step.write(&ctx, 1, (n_kv - 1) as u32);
        let mut rnd = |n: usize| {
            let x: Vec<f32> = (0..n).map(|_| r.random_range(-3.0..3.0)).collect();
            GpuBuffer::from_slice(&ctx, "x", &x).unwrap()
        };
        let (qb, kb, vb) = (rnd(d.n_head * d.head_dim), rnd(kvd), rnd(kvd));
        let out = GpuBuffer::zeroed(&ctx, "att", (d.n_head * d.head_dim * 4) as u64).unwrap();
        let rope = RopeKv::new(&ctx, d, &step, &qb, &kb, &vb, seq.both()).unwrap();
        for fused in [false, true] {
            let opts = AttnOpts {
                round_p: true,
                fast: Some(&step),
                rope: fused.then(|| rope.fused_inputs()),
            };
            let op = Attention::new(&ctx, d, &qb, seq.both(), &out, opts).unwrap();
            let rec = |p: &mut wgpu::ComputePass<'_>| op.record(p, 1, n_kv as u32, (false, false));
            // The first context warms the GPU up to its clock.
            while i == 0 && warm.elapsed().as_secs_f32() < 1.5 {
                run(&ctx, |p| (0..200).for_each(|_| rec(p)));
            }
            let bytes = (2 * n_kv * kvd * 2) as f64;
            let label = format!("fast attention, {n_kv} keys, fused rope {fused}");
            time_launches(&ctx, &label, bytes, &rec);
        }
    }
}

/// The fast fused norm + I2_S matvec (`ternary_decode.wgsl` `matvec_n`) at 2B-4T's widths,
/// 2,560 and 6,912 (every thread of the prologue holding one, then two groups of sixteen
/// values), against the CPU: RMSNorm in f64, the CPU's int8 quantizer, the I2_S dot.
/// Within two int8 steps of the token's scale (the fast norm may round a value the other
/// way, each such flip moving a row by one step; lavapipe shows none: worst 0.002 steps)
/// plus 1e-5 relative.
#[test]
fn fused_norm_matvec_matches_cpu_at_real_widths() {
    use super::tests::{cpu_act, cpu_ternary};
    let Some(ctx) = ctx() else { return };
    let mut r = rng(12);
    let rows = 70usize;
    for k in [2560usize, 6912] {
        let data = ternary_tensor(&mut r, rows, k);
        let w = TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap();
        let x: Vec<f32> = (0..k).map(|_| r.random_range(-2.0..2.0)).collect();
        let g: Vec<f32> = (0..k).map(|_| r.random_range(0.5..1.5)).collect();
        let input = NormIn {
            x: GpuBuffer::from_slice(&ctx, "x", &x).unwrap(),
            w: GpuBuffer::from_slice(&ctx, "nw", &g).unwrap(),
            k,
            eps: 1e-5,
        };
        let out = GpuBuffer::zeroed(&ctx, "y", (rows * 4) as u64).unwrap();
        let kind = NormMatvecKind::One {
            w: &w,
            out: &out,
            epilogue: Epilogue::Store,
        };
        let op = NormMatvec::new(&ctx, &input, kind).unwrap();
        run(&ctx, |p| op.record(p));
        let got = out.read::<f32>(&ctx).unwrap();

        let ms = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / k as f64;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        let xn: Vec<f32> = x
            .iter()
            .zip(&g)
            .map(|(&v, &gw)| (f64::from(v) * inv) as f32 * gw)
            .collect();
        let (_, q, per) = cpu_act(&ctx, &xn, k);
        let want = cpu_ternary(&data, &q, &per, rows, k);
        let step = i2s::tensor_scale(&data, rows * k) / per[0].scale;
        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 2.0 * step + 1e-5 * b.abs(),
                "k {k} row {i}: gpu {a} cpu {b} (one int8 step {step})"
            );
        }
    }
}
