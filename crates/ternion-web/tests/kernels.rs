//! The GPU kernels in a browser (wasm-bindgen-test in headless Chromium, WebGPU on
//! SwiftShader: no shader-f16, no subgroups through wgpu), each against the CPU reference
//! on random inputs of odd sizes. Tolerances as in the core crate's native kernel tests
//! (`ternion-gpu/src/tests.rs`). Run by scripts/web-test.sh.
#![cfg(target_arch = "wasm32")]

use half::f16;
use rand::{Rng, SeedableRng};
use ternion::backend::cpu::rms_norm;
use ternion::backend::gpu::{
    Embed, Epilogue, GpuBuffer, GpuContext, GpuOptions, NormOut, QuantAct, RmsNorm, Sharded,
    StepUniform, TernaryMatvec, TernaryWeights, TopK,
};
use ternion::quant::{act, i2s};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

async fn ctx() -> GpuContext {
    GpuContext::new_async(&GpuOptions::default())
        .await
        .expect("a WebGPU adapter (run Chromium with --enable-unsafe-webgpu)")
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn run(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::ComputePass<'_>)) {
    let mut enc = ctx.encoder();
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        f(&mut pass);
    }
    ctx.submit(enc);
}

#[wasm_bindgen_test]
async fn webgpu_variant_has_no_subgroups() {
    let ctx = ctx().await;
    let c = ctx.caps();
    assert_eq!(c.backend, "webgpu", "{c:?}");
    assert!(
        !c.subgroups,
        "wgpu's WebGPU backend exposes no subgroups: {c:?}"
    );
    let v = ctx.variant(32);
    assert!(!v.subgroups && v.f16 == c.f16, "{v:?} for {c:?}");
}

#[wasm_bindgen_test]
async fn embed_matches_f16_rows() {
    let ctx = ctx().await;
    let (vocab, dim) = (331usize, 70usize);
    let mut r = rng(1);
    let table: Vec<f16> = (0..vocab * dim)
        .map(|_| f16::from_f32(r.random_range(-2.0..2.0)))
        .collect();
    let ids: Vec<u32> = (0..13).map(|_| r.random_range(0..vocab as u32)).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&table);
    let sharded = Sharded::from_rows(&ctx, "embd", bytes, dim * 2, Some(100 * 140)).unwrap();
    assert_eq!(sharded.shards.len(), 4);
    let idb = GpuBuffer::from_slice(&ctx, "ids", &ids).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "x", (ids.len() * dim * 4) as u64).unwrap();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&id| table[id as usize * dim..][..dim].iter().map(|h| h.to_f32()))
        .collect();
    let op = Embed::new(&ctx, ctx.variant(1), &sharded, &idb, &out).unwrap();
    run(&ctx, |p| op.record(p, ids.len() as u32));
    assert_eq!(out.read_async::<f32>(&ctx).await.unwrap(), want);
    ctx.check().unwrap();
}

#[wasm_bindgen_test]
async fn rmsnorm_and_int8_quant_match_cpu() {
    let ctx = ctx().await;
    let mut r = rng(3);
    let (n, rows) = (644usize, 5usize);
    let x: Vec<f32> = (0..rows * n).map(|_| r.random_range(-3.0..3.0)).collect();
    let w: Vec<f32> = (0..n).map(|_| r.random_range(0.1..2.0)).collect();
    let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
    let wb = GpuBuffer::from_slice(&ctx, "w", &w).unwrap();
    let yb = GpuBuffer::zeroed(&ctx, "y", (rows * n * 4) as u64).unwrap();
    let qa = QuantAct::new(&ctx, n, rows).unwrap();
    let v = ctx.variant(32);
    let plain = RmsNorm::new(&ctx, v, &xb, &wb, n, 1e-5, NormOut::F32(&yb)).unwrap();
    let quant = RmsNorm::new(&ctx, v, &xb, &wb, n, 1e-5, NormOut::Quant(&qa)).unwrap();
    run(&ctx, |p| {
        plain.record(p, rows as u32);
        quant.record(p, rows as u32);
    });
    let y_gpu = yb.read_async::<f32>(&ctx).await.unwrap();
    let q_gpu: Vec<i8> =
        qa.q.read_async::<u32>(&ctx)
            .await
            .unwrap()
            .iter()
            .flat_map(|w| w.to_le_bytes().map(|b| b as i8))
            .collect();
    let meta = qa.meta.read_async::<u32>(&ctx).await.unwrap();
    let mut y_cpu = vec![0f32; rows * n];
    rms_norm(&x, &w, 1e-5, &mut y_cpu);
    for (i, (&g, &c)) in y_gpu.iter().zip(&y_cpu).enumerate() {
        assert!(
            (g - c).abs() <= 2e-6 * c.abs() + 1e-7,
            "elem {i}: gpu {g} cpu {c}"
        );
    }
    for t in 0..rows {
        // Exact against the CPU quantizer fed the GPU's own normalised row.
        let mut q_ref = vec![0i8; n];
        let p = act::quantize_per_token(&y_gpu[t * n..][..n], &mut q_ref);
        assert_eq!(
            f32::from_bits(meta[2 * t]).to_bits(),
            p.scale.to_bits(),
            "row {t}"
        );
        assert_eq!(&q_gpu[t * n..][..n], &q_ref[..], "row {t}");
        assert_eq!(meta[2 * t + 1] as i32, p.sum, "row {t}");
    }
    ctx.check().unwrap();
}

#[wasm_bindgen_test]
async fn ternary_matvec_matches_cpu() {
    let ctx = ctx().await;
    let mut r = rng(4);
    let (rows, k, tokens) = (37usize, 384usize, 3usize);
    let wf: Vec<f32> = (0..rows * k)
        .map(|_| (r.random_range(0..3) - 1) as f32 * 0.37)
        .collect();
    let mut data = vec![0u8; rows * k / 4 + i2s::TAIL_BYTES];
    i2s::quantize_tensor(&wf, &mut data);
    let scale = i2s::tensor_scale(&data, rows * k);
    let w = TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap();
    let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
    let mut q = vec![0i8; x.len()];
    let mut meta = Vec::new();
    let mut per = Vec::new();
    for (xr, qr) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
        let p = act::quantize_per_token(xr, qr);
        meta.extend([p.scale.to_bits(), p.sum as u32]);
        per.push(p);
    }
    let qa = QuantAct::new(&ctx, k, tokens).unwrap();
    qa.q.write(&ctx, 0, bytemuck::cast_slice(&q));
    qa.meta.write(&ctx, 0, bytemuck::cast_slice(&meta));
    let want: Vec<f32> = (0..tokens * rows)
        .map(|i| {
            let (t, j) = (i / rows, i % rows);
            let d = i2s::dot(&data[j * k / 4..][..k / 4], &q[t * k..][..k]);
            (d as f32 / per[t].scale) * scale
        })
        .collect();
    let step = StepUniform::new(&ctx).unwrap();
    step.write(&ctx, tokens as u32, 0);
    let out = GpuBuffer::zeroed(&ctx, "y", (tokens * rows * 4) as u64).unwrap();
    for batched in [false, true] {
        let op = TernaryMatvec::new(
            &ctx,
            ctx.variant(32),
            32,
            &w,
            &qa,
            &out,
            Epilogue::Store,
            Some(&step),
        )
        .unwrap();
        run(&ctx, |p| op.record(p, tokens as u32, batched));
        let got = out.read_async::<f32>(&ctx).await.unwrap();
        for (i, (&g, &c)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - c).abs() <= 1e-6 * c.abs(),
                "batched {batched} elem {i}: {g} vs {c}"
            );
        }
    }
    ctx.check().unwrap();
}

#[wasm_bindgen_test]
async fn topk_matches_cpu() {
    let ctx = ctx().await;
    let mut r = rng(6);
    let n = 5003usize;
    let mut v: Vec<f32> = (0..n)
        .map(|_| r.random_range(-200..200) as f32 / 8.0)
        .collect();
    v[n - 1] = 30.0;
    v[n / 2] = 30.0; // tied: the lower id wins
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    let vb = GpuBuffer::from_slice(&ctx, "logits", &v).unwrap();
    for k in [1u32, 7] {
        let op = TopK::new(&ctx, &vb, n as u32, k).unwrap();
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            op.record(&mut pass);
        }
        op.record_download(&mut enc);
        ctx.submit(enc);
        let got = op.read_async(&ctx).await.unwrap();
        let want: Vec<(u32, f32)> = order[..k as usize]
            .iter()
            .map(|&i| (i, v[i as usize]))
            .collect();
        assert_eq!(got, want, "k {k}");
    }
    ctx.check().unwrap();
}
