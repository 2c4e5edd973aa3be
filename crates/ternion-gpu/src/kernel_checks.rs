//! Kernel test bodies written once and run by both test runners: this crate's native tests
//! (lavapipe in CI, `tests.rs`) block on them, the browser's (`ternion-web/tests/kernels.rs`,
//! WebGPU in headless Chromium) await them. Each checks one kernel against the CPU
//! reference on random inputs of odd sizes, on whatever [`GpuContext`] it is given, for
//! every kernel variant that context has; it returns the device's errors and panics on a
//! wrong result. Built for this crate's tests and, with the `test-bodies` feature, for
//! other crates' test runners; the engine does not use it.
//!
//! Tolerances:
//! - embed: exact (F16 → f32 is exact).
//! - rmsnorm (f32 out): |Δ| ≤ 2e-6·|y| + 1e-7 (f32 tree sum vs the f64 sum).
//! - rmsnorm_quant: given the GPU's own normalised values, q, s and Σq equal the CPU
//!   quantizer's bit for bit; against the full CPU reference, s within 1e-5 relative and at
//!   most 1 per 1000 q values differ, by at most 1 (a .5 boundary moved by an ulp).
//! - ternary: the integer dot is exact; y within 1e-6 relative (f32 division precision).
//! - top-k / argmax: exact (values and ids, ties → lowest id), masked rows too.

use half::f16;
use rand::{Rng, SeedableRng};

use ternion_core::backend::cpu::rms_norm;

use crate::quant::{act, i2s};
use crate::{
    Embed, Epilogue, GpuBuffer, GpuContext, NormOut, QuantAct, Result, RmsNorm, Sharded,
    StepUniform, TernaryMatvec, TernaryWeights, TopK, Variant,
};

/// Expands `$runner!(body)` for every kernel test body of this module: each test runner
/// defines its own `$runner` macro (how to await a body and on which contexts) and lists
/// the bodies through this one list, so a new body reaches both runners at once.
#[macro_export]
macro_rules! each_kernel_check {
    ($runner:ident) => {
        $runner!(embed_matches_f16_rows);
        $runner!(rmsnorm_f32_matches_cpu);
        $runner!(rmsnorm_quant_matches_cpu_quantizer);
        $runner!(ternary_matvec_matches_cpu);
        $runner!(topk_and_argmax_match_cpu);
        $runner!(masked_topk_matches_cpu);
    };
}

/// A seeded generator, so that every run (and both runners) sees the same inputs.
pub fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Records `f` in one compute pass and submits it (a later read-back waits for it).
pub fn submit_pass(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.encoder();
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        f(&mut pass);
    }
    ctx.submit(enc);
}

/// The variants worth testing for a kernel with `tpr` lanes per row: the portable one and
/// the best this context has, when that differs.
pub fn variants(ctx: &GpuContext, tpr: u32) -> Vec<Variant> {
    let best = ctx.variant(tpr);
    let mut v = vec![Variant::default()];
    if best != Variant::default() {
        v.push(best);
    }
    v
}

/// `rows × n` values with the hard rows first: all zero (the scale is floored), tiny, large.
pub fn random_rows(r: &mut impl Rng, rows: usize, n: usize) -> Vec<f32> {
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

/// A random ternary I2_S tensor (codes + tail) of `rows × k`.
pub fn ternary_tensor(r: &mut impl Rng, rows: usize, k: usize) -> Vec<u8> {
    let s = 0.37f32;
    let w: Vec<f32> = (0..rows * k)
        .map(|_| (r.random_range(0..3) - 1) as f32 * s)
        .collect();
    let mut t = vec![0u8; rows * k / 4 + i2s::TAIL_BYTES];
    i2s::quantize_tensor(&w, &mut t);
    t
}

/// Quantized activations for `x` (`t × k`) as the CPU makes them, uploaded.
pub fn cpu_act(ctx: &GpuContext, x: &[f32], k: usize) -> (QuantAct, Vec<i8>, Vec<act::PerToken>) {
    let t = x.len() / k;
    let mut q = vec![0i8; x.len()];
    let mut per = Vec::new();
    let mut meta = Vec::new();
    for (xr, qr) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
        let p = act::quantize_per_token(xr, qr);
        meta.extend([p.scale.to_bits(), p.sum as u32]);
        per.push(p);
    }
    let qa = QuantAct::new(ctx, k, t).expect("quantized activation buffers");
    qa.q.write(ctx, 0, bytemuck::cast_slice(&q));
    qa.meta.write(ctx, 0, bytemuck::cast_slice(&meta));
    (qa, q, per)
}

/// The CPU reference of an I2_S product: `rows` outputs per token of the I2_S tensor
/// `data` (rows × `k`) against the int8 activations `q` with per-token scales `per`.
pub fn cpu_ternary(
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

/// Packed int8 activations as the kernels store them, four to a word.
pub fn unpack_q(words: &[u32]) -> Vec<i8> {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes().map(|b| b as i8))
        .collect()
}

/// The `k` largest values with their ids, ties to the lowest id, NaN never chosen.
pub fn cpu_topk(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..v.len() as u32)
        .filter(|&i| !v[i as usize].is_nan())
        .collect();
    idx.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    idx.iter().take(k).map(|&i| (i, v[i as usize])).collect()
}

/// Runs a top-k and reads back its candidates.
async fn run_topk(ctx: &GpuContext, op: &TopK) -> Result<Vec<(u32, f32)>> {
    let mut enc = ctx.encoder();
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        op.record(&mut pass);
    }
    op.record_download(&mut enc);
    ctx.submit(enc);
    op.read_async(ctx).await
}

/// Embedding rows from an F16 table split into shards (four dispatches, the last partial).
pub async fn embed_matches_f16_rows(ctx: &GpuContext) -> Result<()> {
    let (vocab, dim) = (1007usize, 70usize);
    let mut r = rng(1);
    let table: Vec<f16> = (0..vocab * dim)
        .map(|_| f16::from_f32(r.random_range(-2.0..2.0)))
        .collect();
    let ids: Vec<u32> = (0..13).map(|_| r.random_range(0..vocab as u32)).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&table);
    // Shards of 300 rows: 4 dispatches, the last one partial.
    let sharded = Sharded::from_rows(ctx, "embd", bytes, dim * 2, Some(300 * 140))?;
    assert_eq!(sharded.shards.len(), 4);
    let idb = GpuBuffer::from_slice(ctx, "ids", &ids)?;
    let out = GpuBuffer::zeroed(ctx, "x", (ids.len() * dim * 4) as u64)?;
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&id| table[id as usize * dim..][..dim].iter().map(|h| h.to_f32()))
        .collect();
    for v in variants(ctx, 1) {
        let op = Embed::new(ctx, v, &sharded, &idb, &out)?;
        submit_pass(ctx, |p| op.record(p, ids.len() as u32));
        assert_eq!(out.read_async::<f32>(ctx).await?, want, "{v:?}");
    }
    ctx.check()
}

/// RMSNorm with f32 output against the CPU's (f64-sum) RMSNorm.
pub async fn rmsnorm_f32_matches_cpu(ctx: &GpuContext) -> Result<()> {
    let mut r = rng(2);
    for &n in &[641usize, 2560] {
        let rows = 6;
        let x = random_rows(&mut r, rows, n);
        let w: Vec<f32> = (0..n).map(|_| r.random_range(0.1..2.0)).collect();
        let mut want = vec![0f32; rows * n];
        rms_norm(&x, &w, 1e-5, &mut want);
        let xb = GpuBuffer::from_slice(ctx, "x", &x)?;
        let wb = GpuBuffer::from_slice(ctx, "w", &w)?;
        let out = GpuBuffer::zeroed(ctx, "y", (rows * n * 4) as u64)?;
        let op = RmsNorm::new(
            ctx,
            Variant::default(),
            &xb,
            &wb,
            n,
            1e-5,
            NormOut::F32(&out),
        )?;
        submit_pass(ctx, |p| op.record(p, rows as u32));
        let got = out.read_async::<f32>(ctx).await?;
        for (i, (&g, &c)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - c).abs() <= 2e-6 * c.abs() + 1e-7,
                "n {n} elem {i}: gpu {g} cpu {c}"
            );
        }
    }
    ctx.check()
}

/// RMSNorm fused with the per-token int8 quantization, against the CPU quantizer.
pub async fn rmsnorm_quant_matches_cpu_quantizer(ctx: &GpuContext) -> Result<()> {
    let mut r = rng(3);
    let (mut diffs, mut total) = (0usize, 0usize);
    for (&n, v) in [644usize, 2560, 6912]
        .iter()
        .flat_map(|n| variants(ctx, 1).into_iter().map(move |v| (n, v)))
    {
        let rows = 7;
        let x = random_rows(&mut r, rows, n);
        let w: Vec<f32> = (0..n).map(|_| r.random_range(0.1..2.0)).collect();
        let xb = GpuBuffer::from_slice(ctx, "x", &x)?;
        let wb = GpuBuffer::from_slice(ctx, "w", &w)?;
        let yb = GpuBuffer::zeroed(ctx, "y", (rows * n * 4) as u64)?;
        let qa = QuantAct::new(ctx, n, rows)?;
        let plain = RmsNorm::new(ctx, v, &xb, &wb, n, 1e-5, NormOut::F32(&yb))?;
        let quant = RmsNorm::new(ctx, v, &xb, &wb, n, 1e-5, NormOut::Quant(&qa))?;
        submit_pass(ctx, |p| {
            plain.record(p, rows as u32);
            quant.record(p, rows as u32);
        });
        let y_gpu = yb.read_async::<f32>(ctx).await?;
        let q_gpu = unpack_q(&qa.q.read_async::<u32>(ctx).await?);
        let meta = qa.meta.read_async::<u32>(ctx).await?;
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
    // Printed where the runner has a stderr (native; the browser's has none).
    eprintln!("rmsnorm_quant: {diffs} of {total} q values differ from the f64-sum reference");
    assert!(diffs * 1000 <= total, "{diffs} of {total} differ");
    ctx.check()
}

/// The I2_S matvec (both lane counts, both epilogues, single and batched launches)
/// against the CPU's I2_S dot.
pub async fn ternary_matvec_matches_cpu(ctx: &GpuContext) -> Result<()> {
    let mut r = rng(4);
    for &(rows, k, tokens) in &[(37usize, 384usize, 1usize), (641, 2560, 5), (70, 6912, 3)] {
        let data = ternary_tensor(&mut r, rows, k);
        let w = TernaryWeights::upload(ctx, "w", &data, k, rows)?;
        let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, q, per) = cpu_act(ctx, &x, k);
        let resid: Vec<f32> = (0..tokens * rows)
            .map(|_| r.random_range(-5.0..5.0))
            .collect();
        let want = cpu_ternary(&data, &q, &per, rows, k);
        let step = StepUniform::new(ctx)?;
        step.write(ctx, tokens as u32, 0);
        let out = GpuBuffer::zeroed(ctx, "y", (tokens * rows * 4) as u64)?;
        for tpr in [8u32, 32] {
            for v in variants(ctx, tpr) {
                for epi in [Epilogue::Store, Epilogue::Add] {
                    for batched in [false, true] {
                        let op = TernaryMatvec::new(ctx, v, tpr, &w, &qa, &out, epi, Some(&step))?;
                        out.write(ctx, 0, bytemuck::cast_slice(&resid));
                        submit_pass(ctx, |p| op.record(p, tokens as u32, batched));
                        let got = out.read_async::<f32>(ctx).await?;
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
    ctx.check()
}

/// Top-k and argmax over logits with ties, a NaN and a partial last chunk, and over fewer
/// candidates than k.
pub async fn topk_and_argmax_match_cpu(ctx: &GpuContext) -> Result<()> {
    let mut r = rng(6);
    for &n in &[1007usize, 128_256 + 7] {
        // Values on a coarse grid so that ties are common; a NaN is never selected.
        let mut v: Vec<f32> = (0..n)
            .map(|_| r.random_range(-200..200) as f32 / 8.0)
            .collect();
        v[5] = f32::NAN;
        v[n - 1] = 30.0; // the maximum, in the last (partial) chunk
        v[n / 2] = 30.0; // tied: the lower id wins
        let vb = GpuBuffer::from_slice(ctx, "logits", &v)?;
        for k in [1u32, 5, 64] {
            let op = TopK::new(ctx, &vb, n as u32, k)?;
            let got = run_topk(ctx, &op).await?;
            assert_eq!(got, cpu_topk(&v, k as usize), "n {n} k {k}");
        }
    }
    // Fewer candidates than k: the rest are (u32::MAX, -inf).
    let vb = GpuBuffer::from_slice(ctx, "few", &[1.0f32, 3.0, 2.0])?;
    let op = TopK::new(ctx, &vb, 3, 5)?;
    let got = run_topk(ctx, &op).await?;
    assert_eq!(&got[..3], &[(1, 3.0), (2, 2.0), (0, 1.0)]);
    assert_eq!(got[3], (u32::MAX, f32::NEG_INFINITY));
    ctx.check()
}

/// Runs a top-k over its first `rows` rows and reads back each row's candidates.
async fn run_topk_rows(ctx: &GpuContext, op: &TopK, rows: u32) -> Result<Vec<Vec<(u32, f32)>>> {
    let mut enc = ctx.encoder();
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        op.record_rows(&mut pass, rows);
    }
    op.record_download_rows(&mut enc, rows);
    ctx.submit(enc);
    op.read_rows_async(ctx, rows).await
}

/// A token mask of `n` ids allowing those `allow` picks.
pub fn mask_of(n: usize, allow: impl Fn(usize) -> bool) -> Vec<u32> {
    let mut m = vec![0u32; n.div_ceil(32)];
    for id in (0..n).filter(|&i| allow(i)) {
        m[id / 32] |= 1 << (id % 32);
    }
    m
}

/// Masked top-k over several rows equals the CPU top-k of each row with the ids its mask
/// does not allow set to −inf: random masks, a mask allowing fewer than k ids, one allowing
/// exactly one, a mask shorter than the row, a row without a mask, NaNs allowed and not;
/// clearing the masks gives the plain top-k back.
pub async fn masked_topk_matches_cpu(ctx: &GpuContext) -> Result<()> {
    let mut r = rng(7);
    for &n in &[1007usize, 128_256 + 7] {
        let rows = 6usize;
        let mut v: Vec<f32> = (0..n * rows)
            .map(|_| r.random_range(-200..200) as f32 / 8.0)
            .collect();
        v[5] = f32::NAN; // row 0, allowed by its mask below: never selected
        v[n + 2] = f32::NAN; // row 1: not allowed, so it counts as −inf
        let masks: Vec<Option<Vec<u32>>> = vec![
            Some(mask_of(n, |i| i % 3 != 1)),
            Some(mask_of(n, |i| i.is_multiple_of(7))),
            Some(mask_of(n, |i| [9, n - 1, n / 2].contains(&i))),
            Some(mask_of(n, |i| i == n / 3)),
            None,
            Some(mask_of(n / 2, |i| i.is_multiple_of(2))),
        ];
        let vb = GpuBuffer::from_slice(ctx, "logits", &v)?;
        for k in [1u32, 5, 64] {
            let mut op = TopK::rows(ctx, &vb, n as u32, k, rows as u32 + 1)?;
            let given: Vec<Option<&[u32]>> = masks.iter().map(|m| m.as_deref()).collect();
            op.set_masks(ctx, &given)?;
            let got = run_topk_rows(ctx, &op, rows as u32).await?;
            for (row, mask) in masks.iter().enumerate() {
                let mut want = v[row * n..(row + 1) * n].to_vec();
                if let Some(m) = mask {
                    for (id, x) in want.iter_mut().enumerate() {
                        if !crate::generate::allows(m, id as u32) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
                let want = cpu_topk(&want, k as usize);
                assert_eq!(got[row], want, "n {n} k {k} row {row}");
            }
            op.set_masks(ctx, &[])?;
            let plain = run_topk_rows(ctx, &op, rows as u32).await?;
            for (row, got) in plain.iter().enumerate() {
                let want = cpu_topk(&v[row * n..(row + 1) * n], k as usize);
                assert_eq!(got, &want, "n {n} k {k} row {row}, masks cleared");
            }
        }
    }
    ctx.check()
}
