//! Golden tests against ggml's own dequantization of real tensors (shared/golden), and
//! tests of the row dispatcher.

use super::*;
use crate::gguf::GgufFile;
use crate::test_shared::shared_path;

#[test]
fn golden_dequant_samples() {
    let golden = shared_path("golden");
    let text = std::fs::read_to_string(shared_path("golden/dequant_samples.json"))
        .expect("read dequant_samples.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("parse dequant_samples.json");
    let samples = json["samples"].as_array().expect("samples array");
    let mut checked = Vec::new();
    for s in samples {
        let model = s["model"].as_str().expect("model");
        let name = s["tensor"].as_str().expect("tensor");
        let ty_name = s["type"].as_str().expect("type");
        let file = GgufFile::open(golden.join(model)).expect("open golden model");
        let info = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{model}: no tensor {name}"));
        assert_eq!(info.ty.name(), ty_name, "{model} {name}: type");
        let ne: Vec<u64> = s["ne"]
            .as_array()
            .expect("ne")
            .iter()
            .map(|v| v.as_u64().expect("ne entry"))
            .collect();
        assert_eq!(info.shape, ne, "{model} {name}: shape");
        let n = info.shape[0] as usize;
        let data = file.tensor_data(info);
        let rows = s["rows"].as_object().expect("rows");
        assert!(!rows.is_empty(), "{model} {name}: no rows");
        let mut got = vec![0f32; n];
        for (r, values) in rows {
            let r: usize = r.parse().expect("row index");
            let want: Vec<f32> = values
                .as_array()
                .expect("row values")
                .iter()
                .map(|v| v.as_f64().expect("value") as f32)
                .collect();
            assert_eq!(want.len(), n, "{model} {name} row {r}: length");
            dequantize_row(info.ty, name, data, n, r, &mut got)
                .unwrap_or_else(|e| panic!("{model} {name} row {r}: {e}"));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs(),
                    "{model} {name} ({ty_name}) row {r} element {i}: got {g}, ggml {w}"
                );
            }
        }
        checked.push(format!("{ty_name} {model}:{name} ({} rows)", rows.len()));
    }
    // Every type in the file is supported; make sure each was really compared.
    for ty in ["TQ1_0", "TQ2_0", "F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K"] {
        assert!(
            checked.iter().any(|c| c.starts_with(&format!("{ty} "))),
            "no golden sample of {ty}"
        );
    }
    println!("checked against ggml:\n  {}", checked.join("\n  "));
}

#[test]
fn dispatcher_slices_rows_of_every_quantizing_format() {
    // 3 rows of 256, quantized row by row, dequantized through the dispatcher.
    let (rows, n) = (3usize, 256usize);
    let x: Vec<f32> = (0..rows * n)
        .map(|i| ((i * 7919 % 201) as f32 - 100.0) / 64.0)
        .collect();
    type Quantize = fn(&[f32], &mut [u8]);
    type Dequantize = fn(&[u8], &mut [f32]);
    let formats: [(GgmlType, Quantize, Dequantize); 7] = [
        (
            GgmlType::F32,
            float::quantize_row_f32,
            float::dequantize_row_f32,
        ),
        (
            GgmlType::F16,
            float::quantize_row_f16,
            float::dequantize_row_f16,
        ),
        (
            GgmlType::BF16,
            float::quantize_row_bf16,
            float::dequantize_row_bf16,
        ),
        (GgmlType::Q4_0, q4_0::quantize_row, q4_0::dequantize_row),
        (GgmlType::Q8_0, q8_0::quantize_row, q8_0::dequantize_row),
        (GgmlType::TQ1_0, tq1_0::quantize_row, tq1_0::dequantize_row),
        (GgmlType::TQ2_0, tq2_0::quantize_row, tq2_0::dequantize_row),
    ];
    for (ty, quantize, dequantize) in formats {
        let rb = ty.row_bytes(n as u64).unwrap() as usize;
        let mut t = vec![0u8; rows * rb];
        for (xr, tr) in x.chunks_exact(n).zip(t.chunks_exact_mut(rb)) {
            quantize(xr, tr);
        }
        let mut want = vec![0f32; n];
        let mut got = vec![0f32; n];
        for r in 0..rows {
            dequantize(&t[r * rb..(r + 1) * rb], &mut want);
            dequantize_row(ty, "t", &t, n, r, &mut got).unwrap();
            assert_eq!(got, want, "{ty} row {r}");
        }
        let err = dequantize_row(ty, "t", &t, n, rows, &mut got).unwrap_err();
        assert!(err.to_string().contains("out of range"), "{ty}: {err}");
    }
}

#[test]
fn dispatcher_reads_the_i2s_scale_from_the_tail() {
    let s = 0.375f32;
    let w: Vec<f32> = (0..5 * 128).map(|i| ((i % 3) as f32 - 1.0) * s).collect();
    let mut t = vec![0u8; w.len() / 4 + i2s::TAIL_BYTES];
    i2s::quantize_tensor(&w, &mut t);
    let mut got = vec![0f32; 128];
    for r in 0..5 {
        dequantize_row(GgmlType::I2_S, "w", &t, 128, r, &mut got).unwrap();
        assert_eq!(got, &w[r * 128..(r + 1) * 128], "row {r}");
    }
    assert!(dequantize_row(GgmlType::I2_S, "w", &t, 128, 5, &mut got).is_err());
    // Sizes that are not whole rows plus the tail are rejected, not misread. (A slice cut
    // at a row boundary cannot be told from a shorter tensor: callers pass whole tensors.)
    for len in [16, 5 * 32 + 8] {
        let err = dequantize_row(GgmlType::I2_S, "w", &t[..len], 128, 0, &mut got).unwrap_err();
        assert!(err.to_string().contains("tail"), "{len}: {err}");
    }
}

#[test]
fn dispatcher_errors() {
    let t = vec![0u8; 1024];
    let mut dst = vec![0f32; 256];
    match dequantize_row(GgmlType::Q8_1, "blk.0.ffn_up.weight", &t, 256, 0, &mut dst) {
        Err(Error::UnsupportedType {
            tensor,
            type_id,
            type_name,
        }) => {
            assert_eq!(tensor, "blk.0.ffn_up.weight");
            assert_eq!(type_id, 9);
            assert_eq!(type_name, "Q8_1");
        }
        other => panic!("expected UnsupportedType, got {other:?}"),
    }
    // Row length not a whole number of blocks, and a wrong output length.
    let mut short = vec![0f32; 100];
    assert!(matches!(
        dequantize_row(GgmlType::Q8_0, "x", &t, 100, 0, &mut short),
        Err(Error::TensorRow {
            problem: RowProblem::NotWholeBlocks { block: 32, .. },
            ..
        })
    ));
    assert!(matches!(
        dequantize_row(GgmlType::Q8_0, "x", &t, 64, 0, &mut dst),
        Err(Error::TensorRow {
            problem: RowProblem::OutputLength { output: 256, .. },
            ..
        })
    ));
}

#[test]
fn ternary_types() {
    assert!(is_ternary(GgmlType::I2_S));
    assert!(is_ternary(GgmlType::TQ1_0));
    assert!(is_ternary(GgmlType::TQ2_0));
    assert!(!is_ternary(GgmlType::Q4_0));
    assert!(!is_ternary(GgmlType::F16));
}
