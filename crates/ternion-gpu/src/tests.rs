//! Every kernel against the CPU reference, on random inputs of odd sizes (run on lavapipe
//! in CI). Without an adapter these tests fail, unless `TERNION_SKIP_GPU_TESTS=1`.
//!
//! Tolerances:
//! - embed: exact (F16 → f32 is exact).
//! - rmsnorm (f32 out): |Δ| ≤ 2e-6·|y| + 1e-7 (f32 tree sum vs the f64 sum).
//! - rmsnorm_quant: given the GPU's own normalised values, q, s and Σq equal the CPU
//!   quantizer's bit for bit; against the full CPU reference, s within 1e-5 relative and at
//!   most 1 per 1000 q values differ, by at most 1 (a .5 boundary moved by an ulp).
//! - ternary: the integer dot is exact; y within 1e-6 relative (f32 division precision).
//! - f16_matvec: |Δ| ≤ 1e-5 · Σ|w·x| (f32 accumulation order).
//! - top-k / argmax: exact (values and ids, ties → lowest id).
//! - rope_kv: q within 1e-5 of the pair's magnitude |x0|+|x1| (measured ≤ 2e-7 on
//!   lavapipe up to position 4093, own Cody–Waite sin/cos); cached k within 1 F16 ulp of the
//!   CPU's rounding (measured: equal); cached v bit-exact, F16 rounding edge cases included.
//! - attention: |Δ| ≤ 1e-4·max|v| (measured 5e-7 for batches, 4e-6 for decode with F16
//!   probabilities, up to 3 chunks).
//! - glu: ReLU² bit-exact; SiLU within 1e-6 relative.

use half::f16;
use rand::{Rng, SeedableRng};

use super::*;
use crate::backend::cpu::{attention, pool, rms_norm, rope_neox, scratch_per_thread, AttnShape};
use crate::kv::PAGE_POSITIONS;
use crate::quant::{act, i2s};

pub(super) fn ctx_with(opts: &GpuOptions) -> Option<GpuContext> {
    match GpuContext::new(opts) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("TERNION_SKIP_GPU_TESTS").as_deref() == Ok("1") {
                eprintln!("skipping GPU test (TERNION_SKIP_GPU_TESTS=1): {e}");
                None
            } else {
                panic!(
                    "no usable GPU adapter: {e}. Install Mesa's lavapipe \
                     (mesa-vulkan-drivers) or set TERNION_SKIP_GPU_TESTS=1 to skip"
                );
            }
        }
    }
}

pub(super) fn ctx() -> Option<GpuContext> {
    ctx_with(&GpuOptions::default())
}

pub(super) fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Runs `f` inside one compute pass and submits once.
pub(super) fn run(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.encoder();
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        f(&mut pass);
    }
    ctx.submit(enc);
    ctx.wait().expect("gpu work");
}

/// The variants worth testing for a kernel with `tpr` lanes per row.
pub(super) fn variants(ctx: &GpuContext, tpr: u32) -> Vec<Variant> {
    let best = ctx.variant(tpr);
    let mut v = vec![Variant::default()];
    if best != Variant::default() {
        v.push(best);
    }
    v
}

#[test]
fn context_reports_caps() {
    let Some(ctx) = ctx() else { return };
    let c = ctx.caps();
    eprintln!("{c:?}");
    assert!(c.max_binding >= 1 << 27, "binding limit {}", c.max_binding);
    assert!(!list_adapters(wgpu::Backends::PRIMARY).is_empty());
    let bad = GpuContext::new(&GpuOptions {
        device_index: Some(999),
        ..GpuOptions::default()
    });
    assert!(matches!(
        bad,
        Err(crate::Error::NoSuchAdapter { index: 999, found }) if found >= 1
    ));
}

#[test]
fn embed_matches_f16_rows() {
    let Some(ctx) = ctx() else { return };
    let (vocab, dim) = (1007usize, 70usize);
    let mut r = rng(1);
    let table: Vec<f16> = (0..vocab * dim)
        .map(|_| f16::from_f32(r.random_range(-2.0..2.0)))
        .collect();
    let ids: Vec<u32> = (0..13).map(|_| r.random_range(0..vocab as u32)).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&table);
    // Shards of 300 rows: 4 dispatches, the last one partial.
    let sharded = Sharded::from_rows(&ctx, "embd", bytes, dim * 2, Some(300 * 140)).unwrap();
    assert_eq!(sharded.shards.len(), 4);
    let idb = GpuBuffer::from_slice(&ctx, "ids", &ids).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "x", (ids.len() * dim * 4) as u64).unwrap();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&id| table[id as usize * dim..][..dim].iter().map(|h| h.to_f32()))
        .collect();
    for v in variants(&ctx, 1) {
        let op = Embed::new(&ctx, v, &sharded, &idb, &out).unwrap();
        run(&ctx, |p| op.record(p, ids.len() as u32));
        assert_eq!(out.read::<f32>(&ctx).unwrap(), want, "{v:?}");
    }
}

fn random_rows(r: &mut impl Rng, rows: usize, n: usize) -> Vec<f32> {
    (0..rows * n)
        .map(|i| {
            let row = i / n;
            match row {
                0 => 0.0,                           // all zero: scale floored
                1 => r.random_range(-1e-7..1e-7),   // tiny
                2 => r.random_range(-300.0..300.0), // large
                _ => r.random_range(-3.0f32..3.0) * if i % 17 == 0 { 8.0 } else { 1.0 },
            }
        })
        .collect()
}

#[test]
fn rmsnorm_f32_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(2);
    for &n in &[641usize, 2560] {
        let rows = 6;
        let x = random_rows(&mut r, rows, n);
        let w: Vec<f32> = (0..n).map(|_| r.random_range(0.1..2.0)).collect();
        let mut want = vec![0f32; rows * n];
        rms_norm(&x, &w, 1e-5, &mut want);
        let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
        let wb = GpuBuffer::from_slice(&ctx, "w", &w).unwrap();
        let out = GpuBuffer::zeroed(&ctx, "y", (rows * n * 4) as u64).unwrap();
        let op = RmsNorm::new(
            &ctx,
            Variant::default(),
            &xb,
            &wb,
            n,
            1e-5,
            NormOut::F32(&out),
        )
        .unwrap();
        run(&ctx, |p| op.record(p, rows as u32));
        let got = out.read::<f32>(&ctx).unwrap();
        for (i, (&g, &c)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - c).abs() <= 2e-6 * c.abs() + 1e-7,
                "n {n} elem {i}: gpu {g} cpu {c}"
            );
        }
    }
}

fn unpack_q(words: &[u32]) -> Vec<i8> {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes().map(|b| b as i8))
        .collect()
}

#[test]
fn rmsnorm_quant_matches_cpu_quantizer() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(3);
    let (mut diffs, mut total) = (0usize, 0usize);
    for (&n, v) in [644usize, 2560, 6912]
        .iter()
        .flat_map(|n| variants(&ctx, 1).into_iter().map(move |v| (n, v)))
    {
        let rows = 7;
        let x = random_rows(&mut r, rows, n);
        let w: Vec<f32> = (0..n).map(|_| r.random_range(0.1..2.0)).collect();
        let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
        let wb = GpuBuffer::from_slice(&ctx, "w", &w).unwrap();
        let yb = GpuBuffer::zeroed(&ctx, "y", (rows * n * 4) as u64).unwrap();
        let qa = QuantAct::new(&ctx, n, rows).unwrap();
        let plain = RmsNorm::new(&ctx, v, &xb, &wb, n, 1e-5, NormOut::F32(&yb)).unwrap();
        let quant = RmsNorm::new(&ctx, v, &xb, &wb, n, 1e-5, NormOut::Quant(&qa)).unwrap();
        run(&ctx, |p| {
            plain.record(p, rows as u32);
            quant.record(p, rows as u32);
        });
        let y_gpu = yb.read::<f32>(&ctx).unwrap();
        let q_gpu = unpack_q(&qa.q.read::<u32>(&ctx).unwrap());
        let meta = qa.meta.read::<u32>(&ctx).unwrap();
        let mut y_cpu = vec![0f32; rows * n];
        rms_norm(&x, &w, 1e-5, &mut y_cpu);
        for t in 0..rows {
            let (s_gpu, sum_gpu) = (f32::from_bits(meta[2 * t]), meta[2 * t + 1] as i32);
            let qg = &q_gpu[t * n..][..n];
            // 1. Exact against the CPU quantizer fed the GPU's own normalised row.
            let mut q_ref = vec![0i8; n];
            let p = act::quantize_per_token(&y_gpu[t * n..][..n], &mut q_ref);
            assert_eq!(
                s_gpu.to_bits(),
                p.scale.to_bits(),
                "{v:?} n {n} row {t}: scale"
            );
            assert_eq!(qg, &q_ref[..], "{v:?} n {n} row {t}: q");
            assert_eq!(sum_gpu, p.sum, "{v:?} n {n} row {t}: sum");
            // 2. Close to the full CPU reference.
            let mut q_cpu = vec![0i8; n];
            let pc = act::quantize_per_token(&y_cpu[t * n..][..n], &mut q_cpu);
            assert!(
                (s_gpu - pc.scale).abs() <= 1e-5 * pc.scale,
                "n {n} row {t}: scale {s_gpu} vs {}",
                pc.scale
            );
            for (&a, &b) in qg.iter().zip(&q_cpu) {
                assert!((i32::from(a) - i32::from(b)).abs() <= 1);
                diffs += usize::from(a != b);
            }
            total += n;
        }
    }
    eprintln!("rmsnorm_quant: {diffs} of {total} q values differ from the f64-sum reference");
    assert!(diffs * 1000 <= total, "{diffs} of {total} differ");
}

/// A random ternary I2_S tensor (codes + tail) of `rows × k`.
pub(super) fn ternary_tensor(r: &mut impl Rng, rows: usize, k: usize) -> Vec<u8> {
    let s = 0.37f32;
    let w: Vec<f32> = (0..rows * k)
        .map(|_| (r.random_range(0..3) - 1) as f32 * s)
        .collect();
    let mut t = vec![0u8; rows * k / 4 + i2s::TAIL_BYTES];
    i2s::quantize_tensor(&w, &mut t);
    t
}

/// Quantized activations for `x` (`t × k`) as the CPU makes them, uploaded.
pub(super) fn cpu_act(
    ctx: &GpuContext,
    x: &[f32],
    k: usize,
) -> (QuantAct, Vec<i8>, Vec<act::PerToken>) {
    let t = x.len() / k;
    let mut q = vec![0i8; x.len()];
    let mut per = Vec::new();
    let mut meta = Vec::new();
    for (xr, qr) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
        let p = act::quantize_per_token(xr, qr);
        meta.extend([p.scale.to_bits(), p.sum as u32]);
        per.push(p);
    }
    let qa = QuantAct::new(ctx, k, t).unwrap();
    qa.q.write(ctx, 0, bytemuck::cast_slice(&q));
    qa.meta.write(ctx, 0, bytemuck::cast_slice(&meta));
    (qa, q, per)
}

/// The CPU reference of an I2_S product: `rows` outputs per token of the I2_S tensor
/// `data` (rows × `k`) against the int8 activations `q` with per-token scales `per`.
pub(super) fn cpu_ternary(
    data: &[u8],
    q: &[i8],
    per: &[act::PerToken],
    rows: usize,
    k: usize,
) -> Vec<f32> {
    let scale = i2s::tensor_scale(data, rows * k);
    (0..per.len() * rows)
        .map(|i| {
            let (t, j) = (i / rows, i % rows);
            let d = i2s::dot(&data[j * k / 4..][..k / 4], &q[t * k..][..k]);
            (d as f32 / per[t].scale) * scale
        })
        .collect()
}

/// The fused q/k/v launch stores exactly what three separate matvecs store.
#[test]
fn ternary3_equals_three_matvecs() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(41);
    let (k, tokens) = (384usize, 2usize);
    let rows = [40usize, 13, 13];
    let ws: Vec<TernaryWeights> = rows
        .iter()
        .map(|&m| TernaryWeights::upload(&ctx, "w", &ternary_tensor(&mut r, m, k), k, m).unwrap())
        .collect();
    let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
    let (qa, _, _) = cpu_act(&ctx, &x, k);
    let outs: Vec<GpuBuffer> = rows
        .iter()
        .map(|&m| GpuBuffer::zeroed(&ctx, "y", (tokens * m * 4) as u64).unwrap())
        .collect();
    for v in variants(&ctx, 32) {
        let mut want = Vec::new();
        for (w, o) in ws.iter().zip(&outs) {
            let op = TernaryMatvec::new(&ctx, v, 32, w, &qa, o, Epilogue::Store, None).unwrap();
            run(&ctx, |p| op.record(p, tokens as u32, false));
            want.push(o.read::<f32>(&ctx).unwrap());
        }
        for o in &outs {
            o.write(&ctx, 0, &vec![0u8; o.size as usize]);
        }
        let op = Ternary3::new(
            &ctx,
            v,
            32,
            [&ws[0], &ws[1], &ws[2]],
            &qa,
            [&outs[0], &outs[1], &outs[2]],
        )
        .unwrap();
        run(&ctx, |p| op.record(p, tokens as u32));
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(o.read::<f32>(&ctx).unwrap(), want[i], "{v:?} part {i}");
        }
    }
}

#[test]
fn ternary_matvec_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(4);
    for &(rows, k, tokens) in &[(37usize, 384usize, 1usize), (641, 2560, 5), (70, 6912, 3)] {
        let data = ternary_tensor(&mut r, rows, k);
        let w = TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap();
        let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, q, per) = cpu_act(&ctx, &x, k);
        let resid: Vec<f32> = (0..tokens * rows)
            .map(|_| r.random_range(-5.0..5.0))
            .collect();
        let want = cpu_ternary(&data, &q, &per, rows, k);
        let step = StepUniform::new(&ctx).unwrap();
        step.write(&ctx, tokens as u32, 0);
        let out = GpuBuffer::zeroed(&ctx, "y", (tokens * rows * 4) as u64).unwrap();
        for tpr in [8u32, 32] {
            for v in variants(&ctx, tpr) {
                for epi in [Epilogue::Store, Epilogue::Add] {
                    for batched in [false, true] {
                        let op = TernaryMatvec::new(&ctx, v, tpr, &w, &qa, &out, epi, Some(&step))
                            .unwrap();
                        out.write(&ctx, 0, bytemuck::cast_slice(&resid));
                        run(&ctx, |p| op.record(p, tokens as u32, batched));
                        let got = out.read::<f32>(&ctx).unwrap();
                        for i in 0..tokens * rows {
                            let (g, c) = match epi {
                                Epilogue::Store => (got[i], want[i]),
                                Epilogue::Add => (got[i] - resid[i], want[i]),
                            };
                            let tol = 1e-6 * want[i].abs()
                                + if epi == Epilogue::Add {
                                    1e-6 * resid[i].abs()
                                } else {
                                    0.0
                                };
                            assert!(
                                (g - c).abs() <= tol,
                                "{rows}x{k} t{tokens} tpr {tpr} {v:?} {epi:?} batched \
                                 {batched} elem {i}: gpu {g} cpu {c}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn f16_matvec_matches_cpu_over_shards() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(5);
    let (vocab, k, tokens) = (1007usize, 200usize, 11usize);
    let w: Vec<f16> = (0..vocab * k)
        .map(|_| f16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-3.0..3.0)).collect();
    let sharded = Sharded::from_rows(
        &ctx,
        "head",
        bytemuck::cast_slice(&w),
        k * 2,
        Some(333 * 400),
    )
    .unwrap();
    assert_eq!(sharded.shards.len(), 4);
    let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "logits", (tokens * vocab * 4) as u64).unwrap();
    for round_x in [false, true] {
        let xs: Vec<f32> = x
            .iter()
            .map(|&v| {
                if round_x {
                    f16::from_f32(v).to_f32()
                } else {
                    v
                }
            })
            .collect();
        for tpr in [8u32, 32] {
            for v in variants(&ctx, tpr) {
                let op = F16Matvec::new(&ctx, v, tpr, &sharded, &xb, &out, round_x).unwrap();
                run(&ctx, |p| op.record(p, tokens as u32));
                let mut got = out.read::<f32>(&ctx).unwrap();
                // The last-row entry writes row tokens−1's logits into row 0.
                let step = StepUniform::new(&ctx).unwrap();
                step.write(&ctx, tokens as u32, 0);
                let last =
                    F16Matvec::last_row(&ctx, v, tpr, &sharded, &xb, &out, round_x, &step).unwrap();
                run(&ctx, |p| last.record(p, tokens as u32));
                let lr = out.read::<f32>(&ctx).unwrap();
                assert_eq!(lr[..vocab], got[(tokens - 1) * vocab..], "last row");
                // One token with the hidden state in workgroup memory: row 0's sums.
                let one = F16Matvec::one_token(&ctx, v, tpr, &sharded, &xb, &out, round_x);
                run(&ctx, |p| one.as_ref().unwrap().record(p, 1));
                assert_eq!(
                    out.read::<f32>(&ctx).unwrap()[..vocab],
                    got[..vocab],
                    "one token"
                );
                if !round_x {
                    // Eight tokens per workgroup: the same rows, bit for bit (a partial group
                    // of tokens % 8 at the end).
                    let eight = F16Matvec::rows8(&ctx, v, tpr, &sharded, &xb, &out, &step).unwrap();
                    run(&ctx, |p| eight.record(p, tokens as u32));
                    assert_eq!(out.read::<f32>(&ctx).unwrap(), got, "rows8 {tpr} {v:?}");
                }
                got.truncate(tokens * vocab);
                for t in 0..tokens {
                    for j in 0..vocab {
                        let (mut dot, mut mag) = (0f64, 0f64);
                        for i in 0..k {
                            let p = f64::from(w[j * k + i].to_f32()) * f64::from(xs[t * k + i]);
                            dot += p;
                            mag += p.abs();
                        }
                        let g = f64::from(got[t * vocab + j]);
                        assert!(
                            (g - dot).abs() <= 1e-5 * mag,
                            "round {round_x} tpr {tpr} {v:?} t{t} row {j}: gpu {g} cpu {dot}"
                        );
                    }
                }
            }
        }
    }
}

fn cpu_topk(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..v.len() as u32)
        .filter(|&i| !v[i as usize].is_nan())
        .collect();
    idx.sort_by(|&a, &b| {
        v[b as usize]
            .partial_cmp(&v[a as usize])
            .unwrap()
            .then(a.cmp(&b))
    });
    idx.iter().take(k).map(|&i| (i, v[i as usize])).collect()
}

#[test]
fn topk_and_argmax_match_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(6);
    for &n in &[1007usize, 128_256 + 7] {
        // Values on a coarse grid so that ties are common; a NaN is never selected.
        let mut v: Vec<f32> = (0..n)
            .map(|_| r.random_range(-200..200) as f32 / 8.0)
            .collect();
        v[5] = f32::NAN;
        v[n - 1] = 30.0; // the maximum, in the last (partial) chunk
        v[n / 2] = 30.0; // tied: the lower id wins
        let vb = GpuBuffer::from_slice(&ctx, "logits", &v).unwrap();
        for k in [1u32, 5, 64] {
            let op = TopK::new(&ctx, &vb, n as u32, k).unwrap();
            let mut enc = ctx.encoder();
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                op.record(&mut pass);
            }
            op.record_download(&mut enc);
            ctx.submit(enc);
            let got = op.read(&ctx).unwrap();
            assert_eq!(got, cpu_topk(&v, k as usize), "n {n} k {k}");
        }
    }
    // Fewer candidates than k: the rest are (u32::MAX, -inf).
    let vb = GpuBuffer::from_slice(&ctx, "few", &[1.0f32, 3.0, 2.0]).unwrap();
    let op = TopK::new(&ctx, &vb, 3, 5).unwrap();
    let mut enc = ctx.encoder();
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        op.record(&mut pass);
    }
    op.record_download(&mut enc);
    ctx.submit(enc);
    let got = op.read(&ctx).unwrap();
    assert_eq!(&got[..3], &[(1, 3.0), (2, 2.0), (0, 1.0)]);
    assert_eq!(got[3], (u32::MAX, f32::NEG_INFINITY));
}

pub(super) fn dims(
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_rot: usize,
    base: f32,
) -> AttnDims {
    AttnDims {
        n_head,
        n_head_kv,
        head_dim,
        n_rot,
        rope_base: base,
    }
}

/// Values whose F16 rounding is delicate: ties, the overflow edge, subnormals, signed zero.
const F16_EDGES: [f32; 14] = [
    1.0 + 1.0 / 2048.0, // tie → 1.0 (even)
    1.0 + 3.0 / 2048.0, // tie → 1 + 2/1024 (even)
    -(1.0 + 1.0 / 2048.0),
    65504.0,
    65519.99,       // below the overflow tie: 65504
    65520.0,        // the tie rounds to inf
    1e-7,           // F16 subnormal
    2.980_232_2e-8, // 2^-25: tie → 0
    4.470_348_4e-8, // 1.5·2^-25 → 2^-24
    6.097_555e-5,   // just below the smallest normal
    -0.0,
    1e-30,
    -7e4, // → -inf
    0.333_333_34,
];

#[test]
fn rope_kv_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(9);
    let mut worst = 0f32;
    for &(d, pos0, n) in &[
        (dims(6, 2, 40, 24, 10000.0), 3usize, 5usize),
        (dims(4, 1, 64, 64, 500_000.0), 1000, 3),
        (dims(20, 5, 128, 128, 500_000.0), 4090, 1),
    ] {
        let (hq, kvd) = (d.n_head * d.head_dim, d.kv_dim());
        let n_ctx = pos0 + n + 3;
        let q: Vec<f32> = (0..n * hq).map(|_| r.random_range(-3.0..3.0)).collect();
        let k: Vec<f32> = (0..n * kvd).map(|_| r.random_range(-3.0..3.0)).collect();
        let mut v: Vec<f32> = (0..n * kvd).map(|_| r.random_range(-3.0..3.0)).collect();
        for (x, &e) in v.iter_mut().zip(&F16_EDGES) {
            *x = e;
        }
        let (qb, kb, vb) = (
            GpuBuffer::from_slice(&ctx, "q", &q).unwrap(),
            GpuBuffer::from_slice(&ctx, "k", &k).unwrap(),
            GpuBuffer::from_slice(&ctx, "v", &v).unwrap(),
        );
        let seq = PagedSeq::new(&ctx, n_ctx, kvd, pos0, n);
        let step = StepUniform::new(&ctx).unwrap();
        step.write(&ctx, n as u32, pos0 as u32);
        let op = RopeKv::new(&ctx, d, &step, &qb, &kb, &vb, seq.both()).unwrap();
        run(&ctx, |p| op.record(p, n as u32));

        let (mut qc, mut kc) = (q.clone(), k.clone());
        rope_neox(&mut qc, n, pos0, d.head_dim, d.n_rot, d.rope_base);
        rope_neox(&mut kc, n, pos0, d.head_dim, d.n_rot, d.rope_base);
        let qg = qb.read::<f32>(&ctx).unwrap();
        let half = d.n_rot / 2;
        let mag = |x: &[f32], i: usize| {
            let j = i % d.head_dim;
            if j < d.n_rot {
                let b = i - j + j % half;
                x[b].abs() + x[b + half].abs()
            } else {
                x[i].abs()
            }
        };
        for i in 0..qc.len() {
            let err = (qg[i] - qc[i]).abs() / mag(&q, i).max(1e-30);
            worst = worst.max(err);
            assert!(err <= 1e-5, "{d:?} q[{i}]: gpu {} cpu {}", qg[i], qc[i]);
        }
        let (kcache, vcache) = seq.read_rows(&ctx);
        assert!(
            kcache[..pos0 * kvd].iter().all(|&b| b == 0),
            "rows before pos0"
        );
        assert!(
            kcache[(pos0 + n) * kvd..].iter().all(|&b| b == 0),
            "rows after"
        );
        for i in 0..n * kvd {
            let want = f16::from_f32(kc[i]);
            let got = f16::from_bits(kcache[pos0 * kvd + i]);
            // At most one F16 ulp apart (a rotated value within ~1e-7 of a rounding tie).
            assert!(
                (got.to_bits() as i32 - want.to_bits() as i32).abs() <= 1,
                "{d:?} k[{i}]: gpu {got} cpu {want}"
            );
            let err = (got.to_f32() - kc[i]).abs() / mag(&k, i).max(1e-30);
            assert!(err <= 1e-3, "{d:?} k[{i}]");
            assert_eq!(
                vcache[pos0 * kvd + i],
                f16::from_f32(v[i]).to_bits(),
                "{d:?} v[{i}] = {}",
                v[i]
            );
        }
    }
    eprintln!("rope_kv: worst |gpu − cpu| / (|x0| + |x1|) = {worst:e}");
}

/// One sequence in slot 1 of a two-slot [`KvIndex`], its pages in reverse order after a
/// spare page 0 (so the page-table indirection is exercised), with its `n` new tokens at
/// positions `pos0..`: position-ordered rows go in and come out through its page table.
pub(super) struct PagedSeq {
    pub kv: GpuKv,
    pub index: KvIndex,
    pages: Vec<u32>,
    kvd: usize,
    n_ctx: usize,
}

impl PagedSeq {
    pub fn new(ctx: &GpuContext, n_ctx: usize, kvd: usize, pos0: usize, n: usize) -> PagedSeq {
        let n_pages = n_ctx.div_ceil(PAGE_POSITIONS);
        let pages: Vec<u32> = (0..n_pages).map(|i| (n_pages - i) as u32).collect();
        let kv = GpuKv::new(ctx, n_pages + 1, kvd).unwrap();
        let index = KvIndex::new(ctx, n.max(1), 2, n_ctx).unwrap();
        let at = (index.pps * 4) as u64;
        index.pages.write(ctx, at, bytemuck::cast_slice(&pages));
        let toks: Vec<[u32; 2]> = (pos0..pos0 + n).map(|p| [p as u32, 1]).collect();
        index.toks.write(ctx, 0, bytemuck::cast_slice(&toks));
        PagedSeq {
            kv,
            index,
            pages,
            kvd,
            n_ctx,
        }
    }

    fn row(&self, pos: usize) -> usize {
        self.pages[pos / PAGE_POSITIONS] as usize * PAGE_POSITIONS + pos % PAGE_POSITIONS
    }

    /// Writes keys and values of positions `0..k.len() / kvd`.
    pub fn write_rows(&self, ctx: &GpuContext, k: &[f16], v: &[f16]) {
        for (pos, (kr, vr)) in k.chunks(self.kvd).zip(v.chunks(self.kvd)).enumerate() {
            let at = (self.row(pos) * self.kvd * 2) as u64;
            self.kv.k.write(ctx, at, bytemuck::cast_slice(kr));
            self.kv.v.write(ctx, at, bytemuck::cast_slice(vr));
        }
    }

    /// Keys and values (F16 bits) of positions `0..n_ctx`, in position order.
    pub fn read_rows(&self, ctx: &GpuContext) -> (Vec<u16>, Vec<u16>) {
        let (k, v) = (
            self.kv.k.read::<u16>(ctx).unwrap(),
            self.kv.v.read::<u16>(ctx).unwrap(),
        );
        let gather = |c: &[u16]| {
            (0..self.n_ctx)
                .flat_map(|p| c[self.row(p) * self.kvd..][..self.kvd].iter().copied())
                .collect()
        };
        (gather(&k), gather(&v))
    }

    pub fn both(&self) -> (&GpuKv, &KvIndex) {
        (&self.kv, &self.index)
    }
}

pub(super) fn random_kv(r: &mut impl Rng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f32(r.random_range(-2.0..2.0)))
        .collect()
}

/// Runs [`Attention`] for `n` tokens after `pos0` cached positions of random F16 keys and
/// values in [−2, 2] and checks it against the CPU: |Δ| ≤ 1e-4·max|v| per output (decode
/// rounds probabilities to F16 like the reference); with the `fast` numerics a single
/// token keeps its probabilities in f32 (split over KV pages), so |Δ| ≤ 2e-3·max|v|, the
/// F16 rounding's own size; a prompt step (the tiled kernel for head widths 64 and 128)
/// stays within 1e-4·max|v|. Returns the worst |Δ|/max|v|.
pub(super) fn attention_case(
    ctx: &GpuContext,
    r: &mut impl Rng,
    d: AttnDims,
    (pos0, n): (usize, usize),
    fast: bool,
) -> f32 {
    let (hq, kvd) = (d.n_head * d.head_dim, d.kv_dim());
    let n_ctx = pos0 + n + 5;
    let n_kv = pos0 + n;
    let kc = random_kv(r, n_kv * kvd);
    let vc = random_kv(r, n_kv * kvd);
    let seq = PagedSeq::new(ctx, n_ctx, kvd, pos0, n);
    seq.write_rows(ctx, &kc, &vc);
    let qb = GpuBuffer::zeroed(ctx, "q", (n * hq * 4) as u64).unwrap();
    let out = GpuBuffer::zeroed(ctx, "att", (n * hq * 4) as u64).unwrap();
    let round = n == 1;
    let step = StepUniform::new(ctx).unwrap();
    step.write(ctx, n as u32, pos0 as u32);
    seq.index
        .write_blocks(ctx, std::iter::once(n), &mut Vec::new());
    let opts = AttnOpts {
        round_p: round,
        fast: fast.then_some(&step),
        rope: None,
    };
    let op = Attention::new(ctx, d, &qb, seq.both(), &out, opts).unwrap();
    let shape = AttnShape {
        n_head: d.n_head,
        n_head_kv: d.n_head_kv,
        head_dim: d.head_dim,
        pos0,
        round_probs: round,
        capacity: n_ctx,
    };
    let mut scratch =
        vec![0f32; scratch_per_thread(n_ctx, d.head_dim) * pool::global().n_threads()];
    // Twice with other queries: the fast split's merge counters must be back at zero.
    let mut worst = 0f32;
    for _ in 0..2 {
        // Spread scores so that the softmax is far from uniform.
        let q: Vec<f32> = (0..n * hq).map(|_| r.random_range(-3.0..3.0)).collect();
        qb.write(ctx, 0, bytemuck::cast_slice(&q));
        run(ctx, |p| op.record(p, n as u32, n_kv as u32, false));
        let got = out.read::<f32>(ctx).unwrap();
        let mut want = vec![0f32; n * hq];
        attention(&q, &kc, &vc, &shape, &mut want, &mut scratch);
        worst = worst.max(attention_error(
            &got,
            &want,
            fast && round,
            (d, pos0, n, fast),
        ));
    }
    worst
}

/// Worst |gpu − cpu| / 2 of an attention output, asserted within the tolerance of its
/// numerics (`fast_decode`: the fast split's F16 probabilities).
fn attention_error(
    got: &[f32],
    want: &[f32],
    fast_decode: bool,
    case: (AttnDims, usize, usize, bool),
) -> f32 {
    let (d, pos0, n, fast) = case;
    // Outputs are convex combinations of values in [−2, 2]: compare against that scale.
    let tol = if fast_decode { 2e-3 } else { 1e-4 };
    let mut worst = 0f32;
    for i in 0..want.len() {
        let err = (got[i] - want[i]).abs() / 2.0;
        worst = worst.max(err);
        assert!(
            err <= tol,
            "{d:?} pos0 {pos0} n {n} fast {fast} out[{i}]: gpu {} cpu {}",
            got[i],
            want[i]
        );
    }
    worst
}

#[test]
fn attention_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(10);
    let mut worst = [0f32; 3];
    // (dims, pos0, tokens): decode across 1..3 chunks, batches crossing a chunk boundary.
    let cases = [
        (dims(6, 2, 40, 40, 1e4), 0usize, 1usize),
        (dims(6, 2, 40, 40, 1e4), 4, 1),
        (dims(6, 2, 40, 40, 1e4), 300, 1),
        (dims(4, 1, 64, 64, 1e4), 700, 1),
        (dims(20, 5, 128, 128, 1e4), 600, 1),
        // 16 query heads a kv head (the fast merge stages 8 at a time), 47 pages.
        (dims(32, 2, 32, 32, 1e4), 1500, 1),
        (dims(6, 2, 40, 40, 1e4), 0, 7),
        (dims(4, 1, 64, 64, 1e4), 250, 9),
        (dims(3, 3, 6, 4, 1e4), 517, 2),
    ];
    for &(d, pos0, n) in &cases {
        let round = n == 1;
        let err = attention_case(&ctx, &mut r, d, (pos0, n), false);
        worst[usize::from(round)] = worst[usize::from(round)].max(err);
    }
    // The fast numerics' split decode (within a page, across pages, a partial last page)
    // and tiled prompts (blocks and tiles cut anywhere, after cached positions or none).
    let tiled = [
        (dims(8, 2, 128, 128, 1e4), 0usize, 37usize),
        (dims(4, 1, 64, 64, 1e4), 45, 20),
        (dims(20, 5, 128, 128, 1e4), 3, 16),
    ];
    for &(d, pos0, n) in cases.iter().filter(|c| c.2 == 1).chain(&tiled) {
        worst[2] = worst[2].max(attention_case(&ctx, &mut r, d, (pos0, n), true));
    }
    eprintln!(
        "attention: worst |gpu − cpu| / max|v|: batch {:e}, decode (F16 probs) {:e}, fast \
         decode {:e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn glu_matches_cpu() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(11);
    let (n, t) = (777usize, 3usize);
    let g: Vec<f32> = (0..n * t).map(|_| r.random_range(-6.0..6.0)).collect();
    let u: Vec<f32> = (0..n * t).map(|_| r.random_range(-3.0..3.0)).collect();
    let ub = GpuBuffer::from_slice(&ctx, "up", &u).unwrap();
    let gb = GpuBuffer::zeroed(&ctx, "gate", (n * t * 4) as u64).unwrap();
    for act in [GluAct::ReluSqr, GluAct::Silu, GluAct::GeluTanh] {
        gb.write(&ctx, 0, bytemuck::cast_slice(&g));
        let op = Glu::new(&ctx, act, &gb, &ub, n).unwrap();
        run(&ctx, |p| op.record(p, t as u32));
        let got = gb.read::<f32>(&ctx).unwrap();
        for i in 0..n * t {
            let want = match act {
                GluAct::ReluSqr => {
                    let x = g[i].max(0.0);
                    (x * x) * u[i]
                }
                GluAct::Silu => (g[i] / (1.0 + (-g[i]).exp())) * u[i],
                GluAct::GeluTanh => crate::backend::cpu::gelu_ggml(g[i]) * u[i],
            };
            match act {
                GluAct::ReluSqr => assert_eq!(got[i].to_bits(), want.to_bits(), "{i}"),
                GluAct::Silu => assert!(
                    (got[i] - want).abs() <= 1e-6 * want.abs() + 1e-30,
                    "{i}: gpu {} cpu {want}",
                    got[i]
                ),
                // One F16 ulp of the GELU value (rowops.wgsl's bound), times |u|.
                GluAct::GeluTanh => assert!(
                    (got[i] - want).abs() <= (want.abs() / 1024.0 + 1e-6 * u[i].abs()) * 1.01,
                    "{i}: gpu {} cpu {want}",
                    got[i]
                ),
            }
        }
    }
}

/// embed → rmsnorm_quant → ternary (+= residual) → rmsnorm → f16 head → argmax, recorded
/// into one pass and submitted once; recording it 100 more times creates no GPU object.
#[test]
fn one_pass_chain_and_nothing_created_per_record() {
    let Some(ctx) = ctx() else { return };
    let mut r = rng(7);
    let (vocab, d) = (1007usize, 256usize);
    let table: Vec<f16> = (0..vocab * d)
        .map(|_| f16::from_f32(r.random_range(-1.0..1.0)))
        .collect();
    let norm_w: Vec<f32> = (0..d).map(|_| r.random_range(0.5..1.5)).collect();
    let wdata = ternary_tensor(&mut r, d, d);
    let ids = [17u32];

    let v = ctx.variant(32);
    let embd = Sharded::from_rows(&ctx, "embd", bytemuck::cast_slice(&table), d * 2, None).unwrap();
    let idb = GpuBuffer::from_slice(&ctx, "ids", &ids).unwrap();
    let x = GpuBuffer::zeroed(&ctx, "x", (d * 4) as u64).unwrap();
    let h = GpuBuffer::zeroed(&ctx, "h", (d * 4) as u64).unwrap();
    let nw = GpuBuffer::from_slice(&ctx, "norm", &norm_w).unwrap();
    let qa = QuantAct::new(&ctx, d, 1).unwrap();
    let w = TernaryWeights::upload(&ctx, "w", &wdata, d, d).unwrap();
    let logits = GpuBuffer::zeroed(&ctx, "logits", (vocab * 4) as u64).unwrap();
    let embed = Embed::new(&ctx, v, &embd, &idb, &x).unwrap();
    let norm_q = RmsNorm::new(&ctx, v, &x, &nw, d, 1e-5, NormOut::Quant(&qa)).unwrap();
    let mm = TernaryMatvec::new(&ctx, v, 32, &w, &qa, &x, Epilogue::Add, None).unwrap();
    let norm = RmsNorm::new(&ctx, v, &x, &nw, d, 1e-5, NormOut::F32(&h)).unwrap();
    let head = F16Matvec::new(&ctx, v, 32, &embd, &h, &logits, true).unwrap();
    let argmax = TopK::new(&ctx, &logits, vocab as u32, 1).unwrap();

    let step = |ctx: &GpuContext| {
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            embed.record(&mut pass, 1);
            norm_q.record(&mut pass, 1);
            mm.record(&mut pass, 1, false);
            norm.record(&mut pass, 1);
            head.record(&mut pass, 1);
            argmax.record(&mut pass);
        }
        argmax.record_download(&mut enc);
        ctx.submit(enc);
        argmax.read(ctx).unwrap()
    };
    let got = step(&ctx);

    // CPU chain.
    let mut xc: Vec<f32> = table[17 * d..][..d].iter().map(|h| h.to_f32()).collect();
    let mut hc = vec![0f32; d];
    rms_norm(&xc, &norm_w, 1e-5, &mut hc);
    let mut q = vec![0i8; d];
    let p = act::quantize_per_token(&hc, &mut q);
    let ws = i2s::tensor_scale(&wdata, d * d);
    for (j, xv) in xc.iter_mut().enumerate() {
        *xv += (i2s::dot(&wdata[j * d / 4..][..d / 4], &q) as f32 / p.scale) * ws;
    }
    rms_norm(&xc, &norm_w, 1e-5, &mut hc);
    let xr: Vec<f32> = hc.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let lc: Vec<f32> = (0..vocab)
        .map(|j| (0..d).map(|i| table[j * d + i].to_f32() * xr[i]).sum())
        .collect();
    let lg = logits.read::<f32>(&ctx).unwrap();
    let best = cpu_topk(&lg, 1)[0];
    assert_eq!(got[0], best, "GPU argmax of its own logits");
    let cpu_best = cpu_topk(&lc, 1)[0];
    assert_eq!(got[0].0, cpu_best.0, "argmax vs CPU chain");
    for (g, c) in lg.iter().zip(&lc) {
        assert!(
            (g - c).abs() <= 1e-3 * (1.0 + c.abs()),
            "logit gpu {g} cpu {c}"
        );
    }

    // Recording again creates nothing.
    let before = ctx.counters();
    let n_pipelines = ctx.pipelines.len();
    for _ in 0..100 {
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            embed.record(&mut pass, 1);
            norm_q.record(&mut pass, 1);
            mm.record(&mut pass, 1, false);
            norm.record(&mut pass, 1);
            head.record(&mut pass, 1);
            argmax.record(&mut pass);
        }
        argmax.record_download(&mut enc);
        ctx.submit(enc);
        let _ = argmax.read(&ctx).unwrap();
    }
    assert_eq!(ctx.counters(), before);
    assert_eq!(ctx.pipelines.len(), n_pipelines);
    ctx.check().unwrap();
}

#[test]
fn f32_only_context_runs_the_fallbacks() {
    let Some(ctx) = ctx_with(&GpuOptions {
        disable_f16: true,
        disable_subgroups: true,
        ..GpuOptions::default()
    }) else {
        return;
    };
    assert!(!ctx.caps().f16 && !ctx.caps().subgroups);
    assert_eq!(ctx.variant(8), Variant::default());
}

/// Prints the wall-clock time per launch of `f` recorded 200 times into one pass, after
/// one warm-up pass, and the rate at which it reads `bytes` per launch.
pub(super) fn time_launches(
    ctx: &GpuContext,
    label: &str,
    bytes: f64,
    f: &dyn Fn(&mut wgpu::ComputePass<'_>),
) {
    let reps = 200u32;
    run(ctx, |p| f(p));
    let t = std::time::Instant::now();
    run(ctx, |p| {
        for _ in 0..reps {
            f(p)
        }
    });
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
    eprintln!("{label}: {us:.2} µs/launch, {:.0} GB/s", bytes / us / 1e3);
}

/// Wall-clock per dispatch of the decode kernels at BitNet 2B-4T shapes, each recorded 200
/// times into one pass (consecutive dispatches write the same buffer, so each waits for the
/// previous one, as in a forward pass). Run with `--ignored --nocapture` on a real GPU.
#[test]
#[ignore]
fn bench_decode_kernels() {
    let Some(ctx) = ctx() else { return };
    eprintln!("{:?}", ctx.caps());
    let time = |label: &str, bytes: f64, f: &dyn Fn(&mut wgpu::ComputePass<'_>)| {
        time_launches(&ctx, label, bytes, f)
    };
    let mut r = rng(8);
    let step = StepUniform::new(&ctx).unwrap();
    for &(rows, k) in &[
        (2560usize, 2560usize),
        (640, 2560),
        (6912, 2560),
        (2560, 6912),
    ] {
        let data = ternary_tensor(&mut r, rows, k);
        let w = TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap();
        let x: Vec<f32> = (0..8 * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, _, _) = cpu_act(&ctx, &x, k);
        let out = GpuBuffer::zeroed(&ctx, "y", (8 * rows * 4) as u64).unwrap();
        for tpr in [16u32, 32, 64] {
            let v = ctx.variant(tpr);
            let op = TernaryMatvec::new(&ctx, v, tpr, &w, &qa, &out, Epilogue::Store, Some(&step))
                .unwrap();
            let b = (rows * k / 4) as f64;
            time(&format!("ternary {rows}x{k} tpr {tpr} {v:?}"), b, &|p| {
                op.record(p, 1, false)
            });
            step.write(&ctx, 8, 0);
            time(&format!("ternary4 {rows}x{k} T=8 tpr {tpr}"), b, &|p| {
                op.record(p, 8, true)
            });
        }
    }
    let (vocab, d) = (128_256usize, 2560usize);
    let head: Vec<u16> = (0..vocab * d)
        .map(|i| (0x3000 + (i * 7919) % 0x0800) as u16)
        .collect();
    let sh = Sharded::from_rows(&ctx, "head", bytemuck::cast_slice(&head), d * 2, None).unwrap();
    drop(head);
    let x = GpuBuffer::from_slice(&ctx, "x", &vec![0.5f32; d]).unwrap();
    let logits = GpuBuffer::zeroed(&ctx, "logits", (vocab * 4) as u64).unwrap();
    for tpr in [32u32, 64] {
        let v = ctx.variant(tpr);
        let op = F16Matvec::new(&ctx, v, tpr, &sh, &x, &logits, true).unwrap();
        time(
            &format!("lm head tpr {tpr} {v:?} ({} shards)", sh.shards.len()),
            (vocab * d * 2) as f64,
            &|p| op.record(p, 1),
        );
    }
    let topk = TopK::new(&ctx, &logits, vocab as u32, 40).unwrap();
    let argmax = TopK::new(&ctx, &logits, vocab as u32, 1).unwrap();
    time("top-40", (vocab * 4) as f64, &|p| topk.record(p));
    time("argmax", (vocab * 4) as f64, &|p| argmax.record(p));
    let nw = GpuBuffer::from_slice(&ctx, "nw", &vec![1.0f32; 6912]).unwrap();
    let xs = GpuBuffer::from_slice(&ctx, "xs", &vec![0.3f32; 6912]).unwrap();
    let qa = QuantAct::new(&ctx, 6912, 1).unwrap();
    let n = RmsNorm::new(
        &ctx,
        Variant::default(),
        &xs,
        &nw,
        6912,
        1e-5,
        NormOut::Quant(&qa),
    )
    .unwrap();
    time("rmsnorm_quant 6912", 6912.0 * 4.0, &|p| n.record(p, 1));
}
