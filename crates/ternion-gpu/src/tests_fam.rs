//! The kernels of the Llama / Phi-3 / GPT-2 families and the non-ternary weight formats
//! against the CPU reference, on random inputs of odd sizes, each on the adapter's best
//! variant and on a context without SHADER_F16 and SUBGROUP (run on lavapipe in CI).
//!
//! Tolerances:
//! - quant_act (Q8_0, Q8_K): q and scales bit-exact against quant/act.rs.
//! - qmatvec: |Δ| ≤ 1e-5 · Σ|w_i·x_i| (the integer dots are exact; f32 scaling and
//!   summation order differ from the CPU's per-block sums).
//! - qembed (row gather): equal to quant::dequantize_row (Q4_K within 1e-6 relative, in
//!   case the driver fuses d·s·q − dmin·m into one fma).
//! - layernorm: |Δ| ≤ 1e-5 · (|y| + |b| + 1) (f32 sums vs the CPU's f64 ones).
//! - add_bias, add_pos, slice, select_last: exact.
//! - gelu: within one F16 ulp of ggml's table value, or 1e-6 absolute where 1 + tanh
//!   cancels (x < −4); at least 95% equal (the measured share is printed).
//! - rope (NORM, frequency factors, partial rotation, plain store): as tests.rs rope_kv.
//! - attention head_dim 64 and 96, GQA 1 and 4: |Δ| ≤ 1e-4 · max|v|.

use half::f16;
use rand::Rng;

use super::tests::{attention_case, cached_key_ok, ctx_with, dims, rng, run, stored, variants};
use super::tests::{PagedSeq, KV_TYPES};
use super::*;
use crate::backend::cpu::{add_rows, gelu_ggml, layer_norm, rope};
use crate::kernel_checks::unpack_q;
use crate::model::graph::RopeMode;
use crate::quant::{self, act, GgmlType, RefDot};

/// The default context and one without F16 and subgroups (the browser's portable path).
fn contexts() -> Vec<GpuContext> {
    let plain = GpuOptions {
        disable_f16: true,
        disable_subgroups: true,
        ..GpuOptions::default()
    };
    [GpuOptions::default(), plain]
        .iter()
        .filter_map(ctx_with)
        .collect()
}

/// Activation rows: row 0 all zero, row 1 tiny, row 2 large, the rest moderate with spikes.
fn act_rows(r: &mut impl Rng, rows: usize, k: usize) -> Vec<f32> {
    (0..rows * k)
        .map(|i| match i / k {
            0 => 0.0,
            1 => r.random_range(-1e-6..1e-6),
            2 => r.random_range(-200.0..200.0),
            _ => r.random_range(-3.0f32..3.0) * if i % 13 == 0 { 6.0 } else { 1.0 },
        })
        .collect()
}

/// The CPU quantizer of `kind` over rows of `k`: (int8, scales in the GPU's layout: Q8_1
/// as (d, s) pairs).
fn cpu_quant(kind: ActQuant, x: &[f32], k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; x.len() / kind.block()];
    match kind {
        ActQuant::Q8_0 => act::quantize_q8_0(x, &mut q, &mut d),
        ActQuant::Q8_1 => {
            let mut s = vec![0f32; d.len()];
            act::quantize_q8_1(x, &mut q, &mut d, &mut s);
            d = d.iter().zip(&s).flat_map(|(&d, &s)| [d, s]).collect();
        }
        ActQuant::Q8K => {
            let nb = k / 256;
            for ((xr, qr), dr) in x
                .chunks_exact(k)
                .zip(q.chunks_exact_mut(k))
                .zip(d.chunks_exact_mut(nb))
            {
                act::quantize_q8k(xr, qr, dr);
            }
        }
    }
    (q, d)
}

#[test]
fn quant_act_is_bit_exact() {
    let mut r = rng(21);
    for ctx in contexts() {
        for &(kind, k) in &[
            (ActQuant::Q8_0, 96usize),
            (ActQuant::Q8_0, 2592),
            (ActQuant::Q8_1, 96),
            (ActQuant::Q8_1, 2592),
            (ActQuant::Q8K, 768),
        ] {
            let rows = 6;
            let mut x = act_rows(&mut r, rows, k);
            // Rounding edges: Q8_0 ties at ±0.5·d away from zero; Q8_K max ties (the first
            // of equal |x| sets the sign) and a block whose largest |x| is negative.
            let row = &mut x[3 * k..4 * k];
            row[0] = 127.0;
            row[1] = 2.5;
            row[2] = -2.5;
            row[3] = -127.0;
            row[5] = 0.5;
            let row = &mut x[4 * k..5 * k];
            row[10] = -9.0;
            row[20] = 9.0;
            let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
            let qa = QAct::new(&ctx, kind, k, rows).unwrap();
            let op = QuantizeAct::new(&ctx, &xb, &qa).unwrap();
            run(&ctx, |p| op.record(p, rows as u32));
            let (q_cpu, d_cpu) = cpu_quant(kind, &x, k);
            let q_gpu = unpack_q(&qa.q.read::<u32>(&ctx).unwrap());
            let d_gpu = qa.d.read::<f32>(&ctx).unwrap();
            for (i, (g, c)) in d_gpu.iter().zip(&d_cpu).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    c.to_bits(),
                    "{kind:?} k {k} scale {i}: {g} vs {c}"
                );
            }
            assert_eq!(q_gpu, q_cpu, "{kind:?} k {k}");
        }
    }
}

/// Every registry format with a GPU kernel, with a row width of a few blocks (100 for
/// float formats, 96 for 32-blocks, 768 for 256-blocks): rows of Q6_K and TQ2_0 (630 and
/// 198 bytes), Q8_0 and Q4_0 (102 and 54 bytes) put blocks at odd word offsets.
fn formats() -> Vec<(QFormat, usize)> {
    let all: Vec<_> = quant::supported()
        .filter_map(|f| QFormat::from_ggml(f.ty))
        .map(|f| {
            let k = match f.ggml().block_elems() {
                1 => 100,
                be => 3 * be,
            };
            (f, k)
        })
        .collect();
    assert!(all.len() >= 8, "the registry lost GPU formats: {all:?}");
    all
}

/// Random weights of `fmt` (`rows × k`), as a GGUF stores them: through the format's
/// quantizer, or random bits with sane F16 super-block scales for the k-quants without one.
fn weight_bytes(r: &mut impl Rng, fmt: QFormat, rows: usize, k: usize) -> (GgmlType, Vec<u8>) {
    let ty = fmt.ggml();
    let f = quant::format(ty).unwrap();
    let rb = ty.row_bytes(k as u64).unwrap() as usize;
    let mut out = vec![0u8; rows * rb];
    if let Some(quantize) = f.quantize {
        let vals: Vec<f32> = (0..rows * k).map(|_| r.random_range(-1.0..1.0)).collect();
        for (src, dst) in vals.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
            quantize(src, dst);
        }
        return (ty, out);
    }
    let scales: &[usize] = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q3_K => &[108],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::IQ4_NL | GgmlType::Q2_0 | GgmlType::IQ4_XS => &[0],
        other => panic!("{other}: no quantizer and no random-block recipe in this test"),
    };
    r.fill(&mut out[..]);
    for b in out.chunks_exact_mut(f.block_bytes) {
        for &o in scales {
            let v = f16::from_f32(r.random_range(0.001..0.05));
            b[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    (ty, out)
}

/// The registry's scalar reference dot of one product row: (value, Σ|w_i·x_i| as the
/// error scale).
fn cpu_dot(fmt: QFormat, w: &[u8], wdeq: &[f32], x: &[f32], round_x: bool) -> (f32, f32) {
    let k = x.len();
    let scale_of = |xa: &[f32]| wdeq.iter().zip(xa).map(|(a, b)| (a * b).abs()).sum();
    let float = |round: fn(f32) -> f32| -> Vec<f32> { x.iter().map(|&v| round(v)).collect() };
    let quantized = |kind: ActQuant| {
        let (q, d) = cpu_quant(kind, x, k);
        let per = kind.scales();
        let xa: Vec<f32> = q
            .iter()
            .enumerate()
            .map(|(i, &v)| f32::from(v) * d[i / kind.block() * per])
            .collect();
        (q, d, xa)
    };
    match quant::format(fmt.ggml()).unwrap().dot {
        RefDot::F32(f) => (f(w, x), scale_of(x)),
        RefDot::F16(f) => {
            let xa = if round_x {
                float(|v| f16::from_f32(v).to_f32())
            } else {
                x.to_vec()
            };
            (f(w, &xa), scale_of(&xa))
        }
        RefDot::BF16(f) => {
            let xa = float(|v| half::bf16::from_f32(v).to_f32());
            (f(w, &xa), scale_of(&xa))
        }
        RefDot::Q8_0(f) => {
            let (q, d, xa) = quantized(ActQuant::Q8_0);
            (f(w, &q, &d), scale_of(&xa))
        }
        RefDot::Q8_1(f) => {
            let (q, ds, xa) = quantized(ActQuant::Q8_1);
            let (d, s): (Vec<f32>, Vec<f32>) = ds.chunks_exact(2).map(|p| (p[0], p[1])).unzip();
            (f(w, &q, &d, &s), scale_of(&xa))
        }
        RefDot::Q8K(f) => {
            let (q, d, xa) = quantized(ActQuant::Q8K);
            (f(w, &q, &d), scale_of(&xa))
        }
        RefDot::PerToken(_) => panic!("{fmt:?}: I2_S has its own ternary kernels"),
    }
}

/// The CPU backend's product (`Linear::forward`, SIMD where it has a kernel) of weights
/// `wb` (`rows × k` of `ty`) with the activation rows `x`; `round_x` marks every row as a
/// single-token step.
fn cpu_linear(
    ty: GgmlType,
    wb: &[u8],
    k: usize,
    rows: usize,
    x: &[f32],
    round_x: bool,
) -> Vec<f32> {
    let mut g = crate::gguf::GgufWriter::new();
    g.declare("w", ty, &[k as u64, rows as u64]).unwrap();
    let bytes = g
        .to_bytes(std::path::Path::new("w.gguf"), |_, _| Ok(wb.to_vec()))
        .unwrap();
    let file = std::sync::Arc::new(crate::gguf::GgufFile::from_bytes("w.gguf", bytes).unwrap());
    let lin = crate::backend::cpu::Linear::load(&file, "w").unwrap();
    let mut qi = crate::backend::cpu::QuantInput::default();
    qi.set_round_f16(std::iter::repeat_n(round_x, x.len() / k));
    let mut out = vec![0f32; x.len() / k * rows];
    lin.forward(x, &mut qi, &mut out);
    out
}

#[test]
fn qmatvec_matches_cpu_every_format() {
    qmatvec_case(
        37,
        6,
        16,
        &[
            (32, false, false, false),
            (4, true, true, false),
            (8, false, false, true),
            (1, true, true, true),
        ],
    );
}

/// Steps of 72 tokens take the tiled kernel (block formats): two token tiles, the second
/// partial, and 64-row tiles over shards of 32 rows.
#[test]
fn qmatmul_tiled_matches_cpu_every_format() {
    qmatvec_case(
        70,
        40,
        32,
        &[(8, false, false, true), (1, true, true, true)],
    );
}

/// Every format's products against the CPU reference dot: `rows` rows in shards of
/// `shard_rows` (three shards), `tokens` tokens, for each (lanes per row, F16-rounded
/// input, add epilogue, batched) of `configs`.
fn qmatvec_case(
    rows: usize,
    tokens: usize,
    shard_rows: usize,
    configs: &[(u32, bool, bool, bool)],
) {
    let mut r = rng(22);
    let mut worst = 0f32;
    for ctx in contexts() {
        for (fmt, k) in formats() {
            let (ty, wb) = weight_bytes(&mut r, fmt, rows, k);
            let row_bytes = wb.len() / rows;
            let x = act_rows(&mut r, tokens, k);
            let mut wdeq = vec![0f32; k];
            // The CPU backend against the reference dot, single-token rounding on and off.
            for round_x in [false, true] {
                let got = cpu_linear(ty, &wb, k, rows, &x, round_x);
                for j in 0..rows {
                    quant::dequantize_row(ty, "w", &wb, k, j, &mut wdeq).unwrap();
                    for t in 0..tokens {
                        let wr = &wb[j * row_bytes..][..row_bytes];
                        let (y, scale) = cpu_dot(fmt, wr, &wdeq, &x[t * k..][..k], round_x);
                        let g = got[t * rows + j];
                        assert!(
                            (g - y).abs() <= 1e-5 * scale + 1e-6 * y.abs() + 1e-30,
                            "{fmt:?} CPU linear row {j} token {t}: {g} vs reference {y}"
                        );
                    }
                }
            }
            // 3 shards, the last one partial, rows at odd offsets.
            let shard = Some((shard_rows * row_bytes) as u64);
            let w = QWeights::upload(&ctx, "w", ty, &wb, k, rows, shard).unwrap();
            assert_eq!(w.data.shards.len(), 3);
            let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
            let qa = fmt
                .act()
                .map(|kind| QAct::new(&ctx, kind, k, tokens).unwrap());
            let quant = qa.as_ref().map(|a| QuantizeAct::new(&ctx, &xb, a).unwrap());
            let input = qa.as_ref().map_or(MatIn::F32(&xb), MatIn::Quant);
            let step = StepUniform::new(&ctx).unwrap();
            step.write(&ctx, tokens as u32, 0);
            let base: Vec<f32> = (0..tokens * rows).map(|i| i as f32 * 0.25).collect();
            for &(tpr, round_x, add, batched) in configs {
                for v in variants(&ctx, tpr) {
                    let out = GpuBuffer::from_slice(&ctx, "out", &base).unwrap();
                    let opts = QMatvecOpts {
                        epilogue: if add { Epilogue::Add } else { Epilogue::Store },
                        round_x,
                        post_scale: 1.0,
                    };
                    let op =
                        QMatvec::new(&ctx, v, tpr, &w, input, &out, opts, Some(&step)).unwrap();
                    assert_eq!(op.dispatch_count(), 3);
                    run(&ctx, |p| {
                        if let Some(q) = &quant {
                            q.record(p, tokens as u32);
                        }
                        op.record(p, tokens as u32, batched);
                    });
                    let got = out.read::<f32>(&ctx).unwrap();
                    for j in 0..rows {
                        let wr = &wb[j * row_bytes..][..row_bytes];
                        quant::dequantize_row(ty, "w", &wb, k, j, &mut wdeq).unwrap();
                        for t in 0..tokens {
                            let xr = &x[t * k..][..k];
                            let (y, scale) = cpu_dot(fmt, wr, &wdeq, xr, round_x && !batched);
                            let o = t * rows + j;
                            let want = if add { base[o] + y } else { y };
                            let err = (got[o] - want).abs();
                            worst = worst.max(err / scale.max(1e-30));
                            assert!(
                                err <= 1e-5 * scale + 1e-6 * want.abs() + 1e-30,
                                "{fmt:?} {v:?} tpr {tpr} batched {batched} row {j} token {t}: \
                                 gpu {} cpu {want} (scale {scale})",
                                got[o]
                            );
                        }
                    }
                }
            }
        }
    }
    eprintln!("qmatvec: worst |gpu − cpu| / Σ|w·x| = {worst:e}");
}

#[test]
fn qmatvec_rejects_bad_shapes() {
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    let bytes = vec![0u8; 34 * 3];
    // K not a multiple of the block, wrong byte count, unsupported type.
    assert!(QWeights::upload(&ctx, "w", GgmlType::Q8_0, &bytes, 48, 2, None).is_err());
    assert!(QWeights::upload(&ctx, "w", GgmlType::Q8_0, &bytes, 32, 2, None).is_err());
    assert!(QWeights::upload(&ctx, "w", GgmlType::I2_S, &bytes, 128, 1, None).is_err());
    let w = QWeights::upload(&ctx, "w", GgmlType::Q8_0, &bytes, 32, 3, None).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "out", 12).unwrap();
    let x = GpuBuffer::zeroed(&ctx, "x", 128).unwrap();
    let wrong = QAct::new(&ctx, ActQuant::Q8K, 256, 1).unwrap();
    let v = Variant::default();
    let o = QMatvecOpts::default();
    assert!(QMatvec::new(&ctx, v, 32, &w, MatIn::F32(&x), &out, o, None).is_err());
    assert!(QMatvec::new(&ctx, v, 32, &w, MatIn::Quant(&wrong), &out, o, None).is_err());
    assert!(QAct::new(&ctx, ActQuant::Q8_0, 48, 1).is_err());
}

#[test]
fn row_ops_match_cpu() {
    let mut r = rng(23);
    for ctx in contexts() {
        let (n, t) = (771usize, 5usize);
        let x: Vec<f32> = (0..n * t)
            .map(|i| r.random_range(-4.0..4.0) + (i / n) as f32)
            .collect();
        let w: Vec<f32> = (0..n).map(|_| r.random_range(0.2..2.0)).collect();
        let b: Vec<f32> = (0..n).map(|_| r.random_range(-1.0..1.0)).collect();
        let (xb, wb, bb) = (
            GpuBuffer::from_slice(&ctx, "x", &x).unwrap(),
            GpuBuffer::from_slice(&ctx, "w", &w).unwrap(),
            GpuBuffer::from_slice(&ctx, "b", &b).unwrap(),
        );

        // LayerNorm.
        let out = GpuBuffer::zeroed(&ctx, "y", (n * t * 4) as u64).unwrap();
        let ln = RowOp::layer_norm(&ctx, &xb, &wb, &bb, n, 1e-5, &out).unwrap();
        run(&ctx, |p| ln.record(p, t as u32));
        let mut want = vec![0f32; n * t];
        layer_norm(&x, &w, &b, 1e-5, &mut want);
        let got = out.read::<f32>(&ctx).unwrap();
        for i in 0..want.len() {
            let tol = 1e-5 * (want[i].abs() + b[i % n].abs() + 1.0);
            assert!(
                (got[i] - want[i]).abs() <= tol,
                "layernorm {i}: {} vs {}",
                got[i],
                want[i]
            );
        }

        // Bias add (exact).
        let xs = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
        let op = RowOp::add_bias(&ctx, &xs, &bb, n).unwrap();
        run(&ctx, |p| op.record(p, t as u32));
        let mut want = x.clone();
        add_rows(&mut want, &b);
        assert_eq!(xs.read::<f32>(&ctx).unwrap(), want, "add_bias");

        // Slice (Q | K | V split) and the last row.
        let (start, m) = (257usize, 300usize);
        let sl = GpuBuffer::zeroed(&ctx, "slice", (m * t * 4) as u64).unwrap();
        let op = RowOp::slice(&ctx, &xb, n, start, m, &sl).unwrap();
        let step = StepUniform::new(&ctx).unwrap();
        step.write(&ctx, t as u32, 0);
        let last = GpuBuffer::zeroed(&ctx, "last", (n * 4) as u64).unwrap();
        let sel = RowOp::select_last(&ctx, &step, &xb, n, &last).unwrap();
        run(&ctx, |p| {
            op.record(p, t as u32);
            sel.record(p, t as u32);
        });
        let want: Vec<f32> = x
            .chunks_exact(n)
            .flat_map(|row| row[start..start + m].to_vec())
            .collect();
        assert_eq!(sl.read::<f32>(&ctx).unwrap(), want, "slice");
        assert_eq!(
            last.read::<f32>(&ctx).unwrap(),
            &x[(t - 1) * n..],
            "select_last"
        );
        assert!(RowOp::slice(&ctx, &xb, n, 500, 300, &sl).is_err());
    }
}

#[test]
fn gelu_within_one_f16_ulp_of_ggml() {
    let mut r = rng(24);
    for ctx in contexts() {
        let (n, t) = (1003usize, 3usize);
        let mut x: Vec<f32> = (0..n * t).map(|_| r.random_range(-12.0..12.0)).collect();
        x[..8].copy_from_slice(&[-10.0, 10.0, -9.99, 9.99, 0.0, -0.0, 1e-6, -3.0]);
        let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
        let op = RowOp::gelu(&ctx, &xb, n).unwrap();
        run(&ctx, |p| op.record(p, t as u32));
        let got = xb.read::<f32>(&ctx).unwrap();
        let mut exact = 0;
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            let want = gelu_ggml(v);
            if g == want {
                exact += 1;
                continue;
            }
            let (gb, wb) = (f16::from_f32(g).to_bits(), f16::from_f32(want).to_bits());
            assert!(
                f16::from_f32(g).to_f32() == g
                    && ((i32::from(gb) - i32::from(wb)).abs() <= 1 || (g - want).abs() <= 1e-6),
                "gelu x[{i}] = {v}: gpu {g} cpu {want}"
            );
        }
        eprintln!("gelu: {exact}/{} equal to ggml's table", got.len());
        assert!(exact * 100 >= got.len() * 95, "only {exact} exact");
    }
}

#[test]
fn add_pos_embed_f32_and_f16_tables() {
    let mut r = rng(25);
    for ctx in contexts() {
        let (n, n_pos, t, pos0) = (130usize, 40usize, 4usize, 33usize);
        let table: Vec<f32> = (0..n * n_pos).map(|_| r.random_range(-1.0..1.0)).collect();
        let t16: Vec<f16> = table.iter().map(|&v| f16::from_f32(v)).collect();
        let x: Vec<f32> = (0..n * t).map(|_| r.random_range(-2.0..2.0)).collect();
        let step = StepUniform::new(&ctx).unwrap();
        step.write(&ctx, t as u32, pos0 as u32);
        let tk: Vec<[u32; 2]> = (pos0..pos0 + t).map(|p| [p as u32, 0]).collect();
        let toks = GpuBuffer::from_slice(&ctx, "toks", &tk).unwrap();
        let tb32 = GpuBuffer::from_slice(&ctx, "pos32", &table).unwrap();
        let tb16 = GpuBuffer::from_slice(&ctx, "pos16", &t16).unwrap();
        for f16_table in [false, true] {
            let xb = GpuBuffer::from_slice(&ctx, "x", &x).unwrap();
            let tab = if f16_table {
                PosTable::F16(&tb16)
            } else {
                PosTable::F32(&tb32)
            };
            let op = RowOp::add_pos(&ctx, &step, &toks, &xb, tab, n, n_pos).unwrap();
            run(&ctx, |p| op.record(p, t as u32));
            let want: Vec<f32> = (0..n * t)
                .map(|i| {
                    let e = (pos0 + i / n) * n + i % n;
                    let tv = if f16_table { t16[e].to_f32() } else { table[e] };
                    x[i] + tv
                })
                .collect();
            assert_eq!(xb.read::<f32>(&ctx).unwrap(), want, "f16 table {f16_table}");
        }
    }
}

/// The angle table past one grid of rows (the fill walks 65,535 positions a row): every
/// position's (cos θ, sin θ), θ the reference's f32 products, against f64 cos/sin (the
/// cephes polynomials are a few ulp off; θ < 8192, where the reduction is accurate); and a
/// table serves only the dims, factor buffer and positions it was filled for.
#[test]
fn rope_table_positions_past_one_grid() {
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    let n_pos = 70_000;
    // base 1e4 over 8 rotated dims: θ_i = pos · 0.1^i (pairs 1..3 stay below 7,000).
    let d = dims(2, 2, 8, 8, 1e4);
    let none = RopeOpts {
        mode: RopeMode::Neox,
        freqs: None,
    };
    let table = RopeTable::new(&ctx, d, none, n_pos).unwrap();
    let got = table.buf.read::<[f32; 2]>(&ctx).unwrap();
    assert_eq!(got.len(), n_pos * 4);
    let scale = d.rope_base.powf(-2.0 / d.n_rot as f32);
    for pos in 0..n_pos {
        let mut theta = pos as f32;
        for i in 0..4 {
            if theta < 8192.0 {
                let [c, s] = got[pos * 4 + i];
                let (ws, wc) = f64::from(theta).sin_cos();
                assert!(
                    (f64::from(c) - wc).abs() <= 4e-7 && (f64::from(s) - ws).abs() <= 4e-7,
                    "pos {pos} pair {i}: gpu ({c}, {s}) want ({wc}, {ws})"
                );
            }
            theta *= scale;
        }
    }
    let factors = GpuBuffer::from_slice(&ctx, "freqs", &[1.0f32, 2.0, 4.0, 8.0]).unwrap();
    let with = RopeOpts {
        mode: RopeMode::Neox,
        freqs: Some(&factors),
    };
    let other = GpuBuffer::from_slice(&ctx, "freqs2", &[1.0f32, 2.0, 4.0, 8.0]).unwrap();
    let with_other = RopeOpts {
        mode: RopeMode::Neox,
        freqs: Some(&other),
    };
    let divided = RopeTable::new(&ctx, d, with, 16).unwrap();
    assert!(table.serves(d, none, n_pos) && !table.serves(d, none, n_pos + 1));
    assert!(!table.serves(d, with, 16) && !table.serves(dims(2, 2, 8, 8, 5e5), none, 16));
    assert!(divided.serves(d, with, 16) && !divided.serves(d, with_other, 16));
    // Pair i divided by factor 2^i: θ = pos · 0.1^i / 2^i, correctly rounded.
    let rows = divided.buf.read::<[f32; 2]>(&ctx).unwrap();
    for pos in [1usize, 7, 15] {
        let mut theta = pos as f32;
        for i in 0..4 {
            let t = theta / (1u32 << i) as f32;
            let (ws, wc) = f64::from(t).sin_cos();
            let [c, s] = rows[pos * 4 + i];
            assert!((f64::from(c) - wc).abs() <= 4e-7 && (f64::from(s) - ws).abs() <= 4e-7);
            theta *= scale;
        }
    }
}

/// NORM pairing with and without frequency factors, partial rotation, NEOX with factors
/// (Phi-3 style head_dim 96) and the plain KV store (n_rot = 0, GPT-2).
#[test]
fn rope_norm_freqs_partial_and_plain_store() {
    let mut r = rng(26);
    for ctx in contexts() {
        let cases = [
            (
                dims(8, 2, 64, 64, 500_000.0),
                RopeMode::Norm,
                true,
                5usize,
                3usize,
            ),
            (dims(4, 4, 64, 64, 10_000.0), RopeMode::Norm, false, 1000, 1),
            (dims(6, 2, 40, 24, 10_000.0), RopeMode::Norm, true, 2, 4),
            (dims(4, 4, 96, 96, 10_000.0), RopeMode::Neox, true, 17, 2),
            (dims(3, 3, 64, 0, 10_000.0), RopeMode::Neox, false, 7, 3),
        ];
        let typed = cases.iter().flat_map(|c| KV_TYPES.map(|t| (c, t)));
        for (&(d, mode, with_freqs, pos0, n), ty) in typed {
            let (hq, kvd) = (d.n_head * d.head_dim, d.kv_dim());
            let n_ctx = pos0 + n + 2;
            let q: Vec<f32> = (0..n * hq).map(|_| r.random_range(-3.0..3.0)).collect();
            let k: Vec<f32> = (0..n * kvd).map(|_| r.random_range(-3.0..3.0)).collect();
            let v: Vec<f32> = (0..n * kvd).map(|_| r.random_range(-3.0..3.0)).collect();
            let freqs: Vec<f32> = (0..d.n_rot / 2)
                .map(|i| {
                    if i % 3 == 0 {
                        1.0
                    } else {
                        r.random_range(1.0..40.0)
                    }
                })
                .collect();
            let (qb, kb, vb) = (
                GpuBuffer::from_slice(&ctx, "q", &q).unwrap(),
                GpuBuffer::from_slice(&ctx, "k", &k).unwrap(),
                GpuBuffer::from_slice(&ctx, "v", &v).unwrap(),
            );
            let fb = GpuBuffer::from_slice(&ctx, "freqs", &freqs).unwrap();
            let seq = PagedSeq::typed(&ctx, ty, n_ctx, kvd, pos0, n);
            let step = StepUniform::new(&ctx).unwrap();
            step.write(&ctx, n as u32, pos0 as u32);
            let opts = RopeOpts {
                mode,
                freqs: with_freqs.then_some(&fb),
            };
            let table = RopeTable::new(&ctx, d, opts, seq.both().1.n_ctx).unwrap();
            let angles = (opts, &table);
            let op = RopeKv::with_rope(&ctx, d, angles, &step, &qb, &kb, &vb, seq.both()).unwrap();
            run(&ctx, |p| op.record(p, n as u32));

            let (mut qc, mut kc) = (q.clone(), k.clone());
            let f = with_freqs.then_some(&freqs[..]);
            if d.n_rot > 0 {
                rope(&mut qc, n, pos0, d.head_dim, d.n_rot, d.rope_base, mode, f);
                rope(&mut kc, n, pos0, d.head_dim, d.n_rot, d.rope_base, mode, f);
            }
            let qg = qb.read::<f32>(&ctx).unwrap();
            for i in 0..qc.len() {
                assert!(
                    (qg[i] - qc[i]).abs() <= 1e-5 * (q[i].abs() + 3.0),
                    "{d:?} {mode:?} freqs {with_freqs} q[{i}]: gpu {} cpu {}",
                    qg[i],
                    qc[i]
                );
            }
            let (kcache, vcache) = seq.read_rows(&ctx);
            for i in 0..n * kvd {
                let got = kcache[pos0 * kvd + i];
                assert!(
                    cached_key_ok(ty, got, kc[i], k[i].abs() + 3.0),
                    "{d:?} {mode:?} {ty:?} k[{i}]: gpu {got} cpu {}",
                    kc[i]
                );
                let want = stored(ty, v[i]);
                assert_eq!(vcache[pos0 * kvd + i].to_bits(), want.to_bits());
            }
        }
        // Too few frequency factors.
        let d = dims(2, 2, 8, 8, 1e4);
        let b = GpuBuffer::zeroed(&ctx, "b", 64).unwrap();
        let small = GpuBuffer::zeroed(&ctx, "f", 8).unwrap();
        let seq = PagedSeq::new(&ctx, 4, 16, 0, 1);
        let step = StepUniform::new(&ctx).unwrap();
        let opts = RopeOpts {
            mode: RopeMode::Norm,
            freqs: Some(&small),
        };
        assert!(RopeTable::new(&ctx, d, opts, 4).is_err());
        // A table of other angles, or of fewer positions than the cache holds.
        let none = RopeOpts {
            mode: RopeMode::Norm,
            freqs: None,
        };
        let other = dims(2, 2, 8, 8, 5e5);
        let wrong = RopeTable::new(&ctx, other, none, 4).unwrap();
        let short = RopeTable::new(&ctx, d, none, 3).unwrap();
        for t in [&wrong, &short] {
            let r = RopeKv::with_rope(&ctx, d, (none, t), &step, &b, &b, &b, seq.both());
            assert!(r.is_err());
        }
        let fits = RopeTable::new(&ctx, d, none, 4).unwrap();
        assert!(RopeKv::with_rope(&ctx, d, (none, &fits), &step, &b, &b, &b, seq.both()).is_ok());
    }
}

/// Attention at the head widths of GPT-2 (64) and Phi-3 (96), GQA ratios 1 and 4, decode
/// across chunks and prompt batches.
#[test]
fn attention_head_dims_64_96_and_gqa() {
    let mut r = rng(27);
    let mut worst = 0f32;
    for ctx in contexts() {
        for &(d, pos0, n) in &[
            (dims(4, 4, 64, 64, 1e4), 0usize, 1usize),
            (dims(4, 4, 64, 64, 1e4), 300, 1),
            (dims(8, 2, 64, 64, 1e4), 40, 5),
            (dims(3, 3, 96, 96, 1e4), 260, 1),
            (dims(3, 3, 96, 96, 1e4), 0, 6),
            (dims(8, 2, 96, 96, 1e4), 520, 1),
            (dims(8, 2, 96, 96, 1e4), 250, 9),
        ] {
            for ty in KV_TYPES {
                worst = worst.max(attention_case(&ctx, &mut r, (d, ty), (pos0, n, 0.0), false));
            }
        }
    }
    eprintln!("attention (head_dim 64/96, GQA 1/4): worst |gpu − cpu| / max|v| = {worst:e}");
}

/// Every new op records into one pass any number of times without creating a buffer,
/// bind group or pipeline (docs/ARCHITECTURE.md#gpu-principles).
#[test]
fn family_ops_create_nothing_per_record() {
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    let mut r = rng(28);
    let (k, rows, t) = (256usize, 24usize, 3usize);
    let q6k = QFormat::from_ggml(GgmlType::Q6_K).unwrap();
    let (ty, wb) = weight_bytes(&mut r, q6k, rows, k);
    let w = QWeights::upload(&ctx, "w", ty, &wb, k, rows, None).unwrap();
    let x = GpuBuffer::from_slice(&ctx, "x", &act_rows(&mut r, t, k)).unwrap();
    let vec_k = GpuBuffer::from_slice(&ctx, "vk", &vec![0.5f32; k]).unwrap();
    let out = GpuBuffer::zeroed(&ctx, "out", (rows * t * 4) as u64).unwrap();
    let y = GpuBuffer::zeroed(&ctx, "y", (k * t * 4) as u64).unwrap();
    let qa = QAct::new(&ctx, ActQuant::Q8K, k, t).unwrap();
    let step = StepUniform::new(&ctx).unwrap();
    step.write(&ctx, t as u32, 2);
    let table = GpuBuffer::from_slice(&ctx, "pos", &vec![0.25f32; k * 8]).unwrap();
    let toks = GpuBuffer::from_slice(&ctx, "toks", &vec![[0u32, 0]; t]).unwrap();
    let quant = QuantizeAct::new(&ctx, &x, &qa).unwrap();
    let mv = QMatvec::new(
        &ctx,
        ctx.variant(8),
        8,
        &w,
        MatIn::Quant(&qa),
        &out,
        QMatvecOpts::default(),
        Some(&step),
    )
    .unwrap();
    let ops = [
        RowOp::layer_norm(&ctx, &x, &vec_k, &vec_k, k, 1e-5, &y).unwrap(),
        RowOp::add_bias(&ctx, &y, &vec_k, k).unwrap(),
        RowOp::gelu(&ctx, &y, k).unwrap(),
        RowOp::add_pos(&ctx, &step, &toks, &y, PosTable::F32(&table), k, 8).unwrap(),
    ];
    let before = ctx.counters();
    for _ in 0..10 {
        run(&ctx, |p| {
            quant.record(p, t as u32);
            mv.record(p, t as u32, false);
            mv.record(p, t as u32, true);
            for op in &ops {
                op.record(p, t as u32);
            }
        });
    }
    assert_eq!(ctx.counters(), before);
}

/// Embedding rows gathered from tables in every format equal the CPU's dequantized rows.
#[test]
fn qembed_matches_cpu_dequantization() {
    let mut r = rng(29);
    for ctx in contexts() {
        for (fmt, k) in formats() {
            let rows = 29;
            let (ty, wb) = weight_bytes(&mut r, fmt, rows, k);
            let row_bytes = wb.len() / rows;
            let table = QWeights::upload(
                &ctx,
                "embd",
                ty,
                &wb,
                k,
                rows,
                Some((10 * row_bytes) as u64),
            )
            .unwrap();
            let ids: Vec<u32> = vec![0, 28, 9, 10, 19, 20, 3];
            let idb = GpuBuffer::from_slice(&ctx, "ids", &ids).unwrap();
            let out = GpuBuffer::zeroed(&ctx, "x", (ids.len() * k * 4) as u64).unwrap();
            let op = QEmbed::new(&ctx, &table, &idb, &out).unwrap();
            run(&ctx, |p| op.record(p, ids.len() as u32));
            let got = out.read::<f32>(&ctx).unwrap();
            let mut want = vec![0f32; k];
            for (t, &id) in ids.iter().enumerate() {
                quant::dequantize_row(ty, "embd", &wb, k, id as usize, &mut want).unwrap();
                for (i, (&g, &w)) in got[t * k..][..k].iter().zip(&want).enumerate() {
                    // Exact but for a possibly fused multiply-add in Q4_K's d·s·q − dmin·m.
                    let tol =
                        if matches!(fmt.ggml(), GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K) {
                            1e-6 * (w.abs() + 1e-3)
                        } else {
                            0.0
                        };
                    assert!(
                        (g - w).abs() <= tol,
                        "{fmt:?} id {id} [{i}]: gpu {g} cpu {w}"
                    );
                }
            }
        }
    }
}
