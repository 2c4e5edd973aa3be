//! The tiled prompt-batch ternary kernels (`ternary_mm.wgsl`, and `ternary_coop.wgsl` where
//! the adapter has cooperative matrices) against the 4-token batch kernel and the CPU
//! reference, on random inputs whose rows and tokens are not multiples of the tiles.
//!
//! Tolerances: bit-exact against the batch kernel (the same exact integer dot, the same f32
//! scaling expression), Store and Add epilogues; against the CPU, as tests.rs `ternary`
//! (1e-6 relative: the adapter's f32 division).

use rand::Rng;

use super::tests::{cpu_act, cpu_ternary, ctx_with, rng, run, ternary_tensor};
use super::*;
use crate::ops::{prompt_kind, tail_plan, uniform, GluTail, SplitK, COOP_MAX_K};

/// The tiled kinds the adapter of `ctx` runs (printed: the cooperative-matrix kernel only
/// runs where the adapter lists 16×16×16 f16 matrices, not on lavapipe).
fn kinds(ctx: &GpuContext) -> Vec<MatmulKind> {
    let mut k = vec![MatmulKind::Portable, MatmulKind::Narrow];
    if ctx.caps().prefill == PrefillKernel::Coop {
        k.push(MatmulKind::Coop);
    }
    eprintln!(
        "{} (prefill {:?}): testing {k:?}",
        ctx.caps().name,
        ctx.caps().prefill
    );
    k
}

/// The adapter's default context and one without f16 and subgroups (the portable kernels
/// need neither); None without an adapter.
fn contexts() -> Option<(GpuContext, GpuContext)> {
    let plain = GpuOptions {
        disable_f16: true,
        disable_subgroups: true,
        prefill: Some(PrefillKernel::Tiled),
        ..GpuOptions::default()
    };
    Some((ctx_with(&GpuOptions::default())?, ctx_with(&plain)?))
}

#[test]
fn tiled_matmul_equals_batch_kernel_and_cpu() {
    let Some((ctx, plain)) = contexts() else {
        return;
    };
    let tested = [kinds(&ctx), kinds(&plain)];
    let mut r = rng(303);
    let cases = [
        (37usize, 128usize, 2usize),
        (200, 384, 67),
        (130, 2560, 5),
        // The narrow tiles' sizes: a full 32-token tile, partial row and token tiles.
        (70, 384, 32),
        (33, 128, 17),
        (64, 256, 64),
        (257, 640, 130),
        // Enough rows for the coop kernel's 128-token tiles (ops/matmul.rs WIDE_MIN_ROWS).
        (1100, 256, 130),
    ];
    for &(rows, k, tokens) in &cases {
        for (c, kinds) in [&ctx, &plain].into_iter().zip(&tested) {
            let data = ternary_tensor(&mut r, rows, k);
            let w = TernaryWeights::upload(c, "w", &data, k, rows).unwrap();
            let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let (qa, q, per) = cpu_act(c, &x, k);
            let resid: Vec<f32> = (0..tokens * rows)
                .map(|_| r.random_range(-5.0..5.0))
                .collect();
            let cpu = cpu_ternary(&data, &q, &per, rows, k);
            let step = StepUniform::new(c).unwrap();
            step.write(c, tokens as u32, 0);
            let out = GpuBuffer::zeroed(c, "y", (tokens * rows * 4) as u64).unwrap();
            for epi in [Epilogue::Store, Epilogue::Add] {
                let batch =
                    TernaryMatvec::new(c, c.variant(32), 32, &w, &qa, &out, epi, Some(&step))
                        .unwrap();
                out.write(c, 0, bytemuck::cast_slice(&resid));
                run(c, |p| batch.record(p, tokens as u32, true));
                let want = out.read::<f32>(c).unwrap();
                for (i, (&g, &y)) in want.iter().zip(&cpu).enumerate() {
                    let g = if epi == Epilogue::Add {
                        g - resid[i]
                    } else {
                        g
                    };
                    let tol = 1e-6 * (y.abs() + resid[i].abs());
                    assert!(
                        (g - y).abs() <= tol,
                        "batch kernel elem {i}: {g} vs cpu {y}"
                    );
                }
                for &kind in kinds {
                    let mm = TernaryMatmul::new(c, kind, &w, &qa, &out, epi, &step).unwrap();
                    out.write(c, 0, bytemuck::cast_slice(&resid));
                    run(c, |p| mm.record(p, tokens as u32));
                    let got = out.read::<f32>(c).unwrap();
                    let diff = first_bit_difference(&got, &want);
                    if let Some(i) = diff {
                        panic!(
                            "{kind:?} {epi:?} {rows}x{k} t{tokens} elem {i} (token {}, row \
                             {}): {} vs batch kernel {}",
                            i / rows,
                            i % rows,
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn tiled_matmul_rejects_mismatched_widths() {
    let Some(ctx) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let mut r = rng(5);
    let w = TernaryWeights::upload(&ctx, "w", &ternary_tensor(&mut r, 8, 256), 256, 8).unwrap();
    let qa = QuantAct::new(&ctx, 384, 4).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "y", 4 * 8 * 4).unwrap();
    let step = StepUniform::new(&ctx).unwrap();
    let e = TernaryMatmul::new(
        &ctx,
        MatmulKind::Portable,
        &w,
        &qa,
        &out,
        Epilogue::Store,
        &step,
    );
    assert!(e.is_err(), "width mismatch accepted");
}

/// Wall-clock per launch of each ternary product kernel the adapter runs (the tiled kinds,
/// and the 4-token batch kernel) at BitNet 2B-4T's shapes for a step of
/// `TERNION_BENCH_TOKENS` tokens (default 512), each recorded 20 times into one pass, with
/// its rate in dense tera-operations (2·rows·k·tokens a launch). Run with `--ignored
/// --nocapture` on a real GPU. (The wall clock includes recording the pass on the CPU:
/// the GPU timestamps of `ternion bench --profile` say what a launch costs in a step.)
#[test]
#[ignore]
fn bench_prompt_matmuls() {
    let Some(ctx) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let tokens: usize = std::env::var("TERNION_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let kinds = kinds(&ctx);
    let mut r = rng(17);
    let step = StepUniform::new(&ctx).unwrap();
    step.write(&ctx, tokens as u32, 0);
    let warm = std::time::Instant::now();
    for (i, &(rows, k)) in [
        (2560usize, 2560usize),
        (640, 2560),
        (6912, 2560),
        (2560, 6912),
    ]
    .iter()
    .enumerate()
    {
        let data = ternary_tensor(&mut r, rows, k);
        let w = TernaryWeights::upload(&ctx, "w", &data, k, rows).unwrap();
        let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, _, _) = cpu_act(&ctx, &x, k);
        let out = GpuBuffer::zeroed(&ctx, "y", (tokens * rows * 4) as u64).unwrap();
        let time = |label: &str, rec: &dyn Fn(&mut wgpu::ComputePass<'_>)| {
            // The GPU idles at a low clock: 1.5 s of load first.
            while i == 0 && warm.elapsed().as_secs_f32() < 1.5 {
                run(&ctx, |p| (0..20).for_each(|_| rec(p)));
            }
            run(&ctx, |p| rec(p));
            let reps = 20u32;
            let t = std::time::Instant::now();
            run(&ctx, |p| (0..reps).for_each(|_| rec(p)));
            let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
            let ops = 2.0 * (rows * k * tokens) as f64;
            eprintln!(
                "{label} {rows}x{k}, {tokens} tokens: {us:.1} µs/launch, {:.1} Tops/s",
                ops / us / 1e6
            );
        };
        for &kind in &kinds {
            let mm = TernaryMatmul::new(&ctx, kind, &w, &qa, &out, Epilogue::Store, &step).unwrap();
            time(&format!("{kind:?}"), &|p| mm.record(p, tokens as u32));
        }
        let v = ctx.variant(8);
        let mv =
            TernaryMatvec::new(&ctx, v, 8, &w, &qa, &out, Epilogue::Store, Some(&step)).unwrap();
        time("Batch4", &|p| mv.record(p, tokens as u32, true));
    }
}

/// The fused narrow launches (q/k/v in one; gate/up with the GLU in one) give the bits of
/// the separate narrow launches and `glu.wgsl`, for row counts that are not multiples of
/// the tile and steps of 9 to 32 tokens.
#[test]
fn narrow_fused_equals_separate_launches() {
    let Some((ctx, plain)) = contexts() else {
        return;
    };
    let mut r = rng(404);
    let k = 384;
    for c in [&ctx, &plain] {
        for tokens in [9usize, 20, 32] {
            let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let (qa, _, _) = cpu_act(c, &x, k);
            let step = StepUniform::new(c).unwrap();
            step.write(c, tokens as u32, 0);
            let upload = |r: &mut _, rows| {
                let data = ternary_tensor(r, rows, k);
                TernaryWeights::upload(c, "w", &data, k, rows).unwrap()
            };
            let zeroed =
                |rows: usize| GpuBuffer::zeroed(c, "y", (tokens * rows * 4) as u64).unwrap();
            let alone = |w: &TernaryWeights, out: &GpuBuffer| {
                let mm =
                    TernaryMatmul::new(c, MatmulKind::Narrow, w, &qa, out, Epilogue::Store, &step)
                        .unwrap();
                run(c, |p| mm.record(p, tokens as u32));
            };
            let same = |got: &GpuBuffer, want: &GpuBuffer, what: &str| {
                let (got, want) = (got.read::<f32>(c).unwrap(), want.read::<f32>(c).unwrap());
                let diff = first_bit_difference(&got, &want);
                assert!(diff.is_none(), "{what} t{tokens} elem {diff:?}");
            };

            let rows = [70, 40, 33];
            let ws = rows.map(|n| upload(&mut r, n));
            let (outs, refs) = (rows.map(zeroed), rows.map(zeroed));
            let fused = NarrowFused::qkv(
                c,
                [&ws[0], &ws[1], &ws[2]],
                &qa,
                [&outs[0], &outs[1], &outs[2]],
                &step,
            )
            .unwrap()
            .expect("an adapter with tiled kernels runs the narrow tiles");
            run(c, |p| fused.record(p, tokens as u32));
            for i in 0..3 {
                alone(&ws[i], &refs[i]);
                same(&outs[i], &refs[i], &format!("q/k/v matrix {i}"));
            }

            let (gate, up) = (upload(&mut r, 100), upload(&mut r, 100));
            for act in [GluAct::ReluSqr, GluAct::Silu] {
                let (out, gb, ub) = (zeroed(100), zeroed(100), zeroed(100));
                let fused = NarrowFused::glu(c, (&gate, &up), &qa, &out, act, &step)
                    .unwrap()
                    .unwrap();
                run(c, |p| fused.record(p, tokens as u32));
                alone(&gate, &gb);
                alone(&up, &ub);
                let glu = Glu::new(c, act, &gb, &ub, 100).unwrap();
                run(c, |p| glu.record(p, tokens as u32));
                same(&out, &gb, &format!("gate/up {act:?}"));
            }
        }
    }
}

/// The fused coop launch of q/k/v (`matmul_wide3`) gives the bits of the three separate
/// coop launches, for row counts that are not multiples of the tile and steps of more
/// than 64 tokens (where it runs). Adapters without cooperative matrices (lavapipe) have
/// no fused launch: the test says so and checks that none is built.
#[test]
fn coop_qkv_equals_separate_launches() {
    let Some(c) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let mut r = rng(505);
    let k = 384;
    let step = StepUniform::new(&c).unwrap();
    for tokens in [65usize, 130, 200] {
        let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, _, _) = cpu_act(&c, &x, k);
        step.write(&c, tokens as u32, 0);
        let rows = [300, 70, 130];
        let ws = rows.map(|n| {
            let data = ternary_tensor(&mut r, n, k);
            TernaryWeights::upload(&c, "w", &data, k, n).unwrap()
        });
        let zeroed = |n: usize| GpuBuffer::zeroed(&c, "y", (tokens * n * 4) as u64).unwrap();
        let (outs, refs) = (rows.map(zeroed), rows.map(zeroed));
        let fused = CoopFused::qkv(
            &c,
            [&ws[0], &ws[1], &ws[2]],
            &qa,
            [&outs[0], &outs[1], &outs[2]],
            &step,
        )
        .unwrap();
        let Some(fused) = fused else {
            assert_ne!(c.caps().prefill, PrefillKernel::Coop);
            eprintln!(
                "{}: no cooperative matrices, no fused coop q/k/v to test",
                c.caps().name
            );
            return;
        };
        run(&c, |p| fused.record(p, tokens as u32));
        for i in 0..3 {
            let mm = TernaryMatmul::new(
                &c,
                MatmulKind::Coop,
                &ws[i],
                &qa,
                &refs[i],
                Epilogue::Store,
                &step,
            )
            .unwrap();
            run(&c, |p| mm.record(p, tokens as u32));
            let (got, want) = (
                outs[i].read::<f32>(&c).unwrap(),
                refs[i].read::<f32>(&c).unwrap(),
            );
            let diff = first_bit_difference(&got, &want);
            assert!(diff.is_none(), "matrix {i}, {tokens} tokens: elem {diff:?}");
        }
    }
}

/// The fused coop gate/up launch (`matmul_wide_glu`) gives the bits of the two separate
/// coop launches and `glu.wgsl`, for ReLU² and SiLU, rows that are not multiples of its
/// 64-row tiles and steps of more than 64 tokens (where it runs). Adapters without
/// cooperative matrices (lavapipe) have no fused launch: the test says so.
#[test]
fn coop_glu_equals_separate_launches() {
    let Some(c) = ctx_with(&GpuOptions::default()) else {
        return;
    };
    let mut r = rng(507);
    let (k, n) = (384, 200);
    let step = StepUniform::new(&c).unwrap();
    let tail = GluTail::new(&c, c.caps().sms).unwrap();
    let upload = |r: &mut rand::rngs::StdRng| {
        TernaryWeights::upload(&c, "w", &ternary_tensor(r, n, k), k, n).unwrap()
    };
    let (gate, up) = (upload(&mut r), upload(&mut r));
    for tokens in [65usize, 130, 200] {
        let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
        let (qa, _, _) = cpu_act(&c, &x, k);
        step.write(&c, tokens as u32, 0);
        let zeroed = || GpuBuffer::zeroed(&c, "y", (tokens * n * 4) as u64).unwrap();
        for act in [GluAct::ReluSqr, GluAct::Silu] {
            let (out, gb, ub) = (zeroed(), zeroed(), zeroed());
            let fused = CoopFused::glu(&c, (&gate, &up), &qa, &out, act, &step, &tail).unwrap();
            let Some(fused) = fused else {
                assert_ne!(c.caps().prefill, PrefillKernel::Coop);
                eprintln!(
                    "{}: no cooperative matrices, no fused coop gate/up to test",
                    c.caps().name
                );
                return;
            };
            run(&c, |p| fused.record(p, tokens as u32));
            for (w, o) in [(&gate, &gb), (&up, &ub)] {
                let mm =
                    TernaryMatmul::new(&c, MatmulKind::Coop, w, &qa, o, Epilogue::Store, &step)
                        .unwrap();
                run(&c, |p| mm.record(p, tokens as u32));
            }
            let glu = Glu::new(&c, act, &gb, &ub, n).unwrap();
            run(&c, |p| glu.record(p, tokens as u32));
            let (got, want) = (out.read::<f32>(&c).unwrap(), gb.read::<f32>(&c).unwrap());
            let diff = first_bit_difference(&got, &want);
            assert!(diff.is_none(), "{act:?}, {tokens} tokens: elem {diff:?}");
        }
    }
}

/// The last-wave plan of the gate/up tiles: a 512-token 2B-4T step (432 tiles of 20 blocks)
/// on an H100's 132 SMs splits its 36 last-wave tiles in 3; whole waves, unknown SM counts,
/// a tail of more than half the SMs and K under 1,024 split nothing; every split tile's
/// parts fit the SMs.
#[test]
fn glu_tail_plan() {
    assert_eq!(tail_plan(432, 20, 132), (396, 36, 3));
    assert_eq!(tail_plan(150, 20, 132), (132, 18, 3));
    assert_eq!(tail_plan(180, 20, 132), (132, 48, 2));
    for (tiles, blocks, sms) in [
        (432, 20, 0),
        (264, 20, 132),
        (120, 20, 132),
        (200, 20, 132),
        (150, 7, 132),
    ] {
        assert_eq!(
            tail_plan(tiles, blocks, sms),
            (tiles, 0, 1),
            "{tiles} {blocks} {sms}"
        );
    }
    for tiles in 1..600 {
        for sms in [1, 7, 114, 132] {
            let (full, r, p) = tail_plan(tiles, 8, sms);
            assert_eq!(full + r, tiles);
            assert!(r * p <= sms && (p == 1) == (r == 0) && p <= 3);
        }
    }
}

/// The gate/up launch with its last wave split along K (`tail_plan`, planned here for SM
/// counts that make it split 1, 2 or every tile, in 2 or 3 parts of unequal length) gives
/// the bits of the unsplit launch, on K of 8 and 11 I2_S blocks and steps whose last token
/// tile is partial; a second run of the same launch checks that the per-tile counts went
/// back to zero. Adapters without cooperative matrices (lavapipe) have no such launch: the
/// test says so.
#[test]
fn coop_glu_split_tail_equals_whole_tiles() {
    let Some(c) = coop_context("no split gate/up tiles to test") else {
        return;
    };
    let mut r = rng(508);
    let n = 200;
    let step = StepUniform::new(&c).unwrap();
    for k in [1024usize, 1408] {
        let upload = |r: &mut rand::rngs::StdRng| {
            TernaryWeights::upload(&c, "w", &ternary_tensor(r, n, k), k, n).unwrap()
        };
        let (gate, up) = (upload(&mut r), upload(&mut r));
        let blocks = (k / 128) as u32;
        for tokens in [130usize, 300] {
            let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let (qa, _, _) = cpu_act(&c, &x, k);
            step.write(&c, tokens as u32, 0);
            let tiles = n.div_ceil(64) as u32 * tokens.div_ceil(128) as u32;
            let zeroed = || GpuBuffer::zeroed(&c, "y", (tokens * n * 4) as u64).unwrap();
            let want = zeroed();
            let none = GluTail::new(&c, None).unwrap();
            let whole = CoopFused::glu(&c, (&gate, &up), &qa, &want, GluAct::Silu, &step, &none);
            let whole = whole.unwrap().unwrap();
            run(&c, |p| whole.record(p, tokens as u32));
            let want = want.read::<f32>(&c).unwrap();
            let mut seen = std::collections::BTreeSet::new();
            for sms in [tiles - 1, tiles - 2, tiles + 1, 2 * tiles, tiles] {
                let plan = tail_plan(tiles, blocks, sms);
                seen.insert((plan.1.min(2), plan.2));
                let out = zeroed();
                let tail = GluTail::new(&c, Some(sms)).unwrap();
                let fused = CoopFused::glu(&c, (&gate, &up), &qa, &out, GluAct::Silu, &step, &tail);
                let fused = fused.unwrap().unwrap();
                for round in 0..2 {
                    run(&c, |p| fused.record(p, tokens as u32));
                    let diff = first_bit_difference(&out.read::<f32>(&c).unwrap(), &want);
                    assert!(
                        diff.is_none(),
                        "K {k}, {tokens} tokens, {sms} SMs {plan:?}, run {round}: elem {diff:?}"
                    );
                }
            }
            assert!(seen.contains(&(1, 3)) && seen.contains(&(2, 3)), "{seen:?}");
            assert!(seen.iter().any(|&(r, p)| r == 2 && p == 2) && seen.contains(&(0, 1)));
        }
    }
}

/// The coop tiles with K in parts (`matmul_split`, then `split_sum`) give the bits of the
/// whole-K launch, storing and adding, for rows and tokens that are not multiples of the
/// tiles and K of 7 and 20 I2_S blocks (parts of unequal length). Adapters without
/// cooperative matrices (lavapipe) have no split: the test says so.
#[test]
fn coop_split_k_equals_whole_k() {
    let Some(c) = coop_context("no split coop tiles to test") else {
        return;
    };
    let mut r = rng(506);
    let step = StepUniform::new(&c).unwrap();
    let n = 300;
    // The adapter's SMs, none known (three workgroups a tile), a few workgroups (pieces
    // of several tiles each) and more than there are blocks.
    let counts = [c.caps().sms, None, Some(5), Some(1000)];
    for k in [896usize, 2560] {
        let w = TernaryWeights::upload(&c, "w", &ternary_tensor(&mut r, n, k), k, n).unwrap();
        let words = [n as u32, (k / 16) as u32, w.scale.to_bits(), 0];
        let params = uniform(&c, "params", &words).unwrap();
        for tokens in [65usize, 130, 200] {
            let x: Vec<f32> = (0..tokens * k).map(|_| r.random_range(-2.0..2.0)).collect();
            let (qa, _, _) = cpu_act(&c, &x, k);
            step.write(&c, tokens as u32, 0);
            for (sms, epi) in counts
                .iter()
                .flat_map(|&s| [(s, Epilogue::Store), (s, Epilogue::Add)])
            {
                let bytes =
                    SplitK::scratch_bytes(n, k, tokens, sms).expect("a split for these sizes");
                let scratch = GpuBuffer::zeroed(&c, "scratch", bytes).unwrap();
                let init: Vec<f32> = (0..tokens * n).map(|_| r.random_range(-1.0..1.0)).collect();
                let got = GpuBuffer::from_slice(&c, "got", &init).unwrap();
                let want = GpuBuffer::from_slice(&c, "want", &init).unwrap();
                let split =
                    SplitK::new(&c, (&w, &qa, &got), (&scratch, &params), (epi, sms), &step)
                        .unwrap();
                assert!(split.takes(tokens as u32), "{tokens} tokens of {n} rows");
                run(&c, |p| split.record(p, tokens as u32));
                let whole =
                    TernaryMatmul::new(&c, MatmulKind::Coop, &w, &qa, &want, epi, &step).unwrap();
                run(&c, |p| whole.record(p, tokens as u32));
                let (got, want) = (got.read::<f32>(&c).unwrap(), want.read::<f32>(&c).unwrap());
                let diff = first_bit_difference(&got, &want);
                assert!(
                    diff.is_none(),
                    "K {k}, {tokens} tokens, {sms:?} SMs, {epi:?}: elem {diff:?}"
                );
            }
        }
    }
}

/// Rows wider than the coop tiles' exact range (their sums, integers times 2^-24 of up to
/// 2·127·K, must stay below 2^24: a compile-time assertion beside `COOP_MAX_K`) take the
/// portable tiles on a coop adapter; the others keep the adapter's kernel.
#[test]
fn coop_tiles_only_for_rows_they_sum_exactly() {
    let coop = PrefillKernel::Coop;
    assert_eq!(prompt_kind(coop, 6912), Some(MatmulKind::Coop));
    assert_eq!(prompt_kind(coop, COOP_MAX_K), Some(MatmulKind::Coop));
    assert_eq!(
        prompt_kind(coop, COOP_MAX_K + 128),
        Some(MatmulKind::Portable)
    );
    assert_eq!(
        prompt_kind(PrefillKernel::Tiled, 6912),
        Some(MatmulKind::Portable)
    );
    assert_eq!(prompt_kind(PrefillKernel::Batch4, 6912), None);
    // The subgroup-matrix tiles sum in i32: exact at any width the engine takes.
    assert_eq!(
        prompt_kind(PrefillKernel::SubgroupMatrix, COOP_MAX_K + 128),
        Some(MatmulKind::SubgroupMatrix)
    );
}

/// A native device has no browser subgroup matrices: asking for their prompt tiles is a
/// clear error naming what is missing, not a silent fallback.
#[test]
fn subgroup_matrix_tiles_are_refused_natively() {
    // The adapter must exist for the request to reach the prefill check.
    if ctx_with(&GpuOptions::default()).is_none() {
        return;
    }
    let opts = GpuOptions {
        prefill: Some(PrefillKernel::SubgroupMatrix),
        ..GpuOptions::default()
    };
    let e = GpuContext::new(&opts).err().expect("refused").to_string();
    assert!(e.contains("subgroup-matrix prefill kernel"), "{e}");
    assert!(e.contains("32-lane subgroups (this one: false)"), "{e}");
}

/// The adapter's default context where its prompt kernel is the cooperative-matrix one;
/// None without an adapter, or (said, with `what` the test has nothing of) without
/// cooperative matrices, as on lavapipe.
fn coop_context(what: &str) -> Option<GpuContext> {
    let c = ctx_with(&GpuOptions::default())?;
    if c.caps().prefill != PrefillKernel::Coop {
        eprintln!("{}: no cooperative matrices, {what}", c.caps().name);
        return None;
    }
    Some(c)
}

/// The first index where `got` and `want` differ in their bits (None: the same bits).
fn first_bit_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
}
