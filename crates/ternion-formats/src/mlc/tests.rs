use std::path::Path;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cache::INDEX_FILES;
use super::config::CONFIG_FILE;
use super::error::{SpmProblem, TokenizerFileError};
use super::*;
use crate::quant::{q4_0, q8_0};
use crate::Error;
use ternion_testkit::mlc_synth::fixture;

/// Packs codes eight per little-endian uint32 (element k at bit 4k), as MLC stores them.
fn pack(codes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in codes.chunks_exact(8) {
        let mut w = 0u32;
        for (k, &q) in c.iter().enumerate() {
            w |= u32::from(q) << (4 * k);
        }
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn repack_is_bit_exact_on_edge_blocks() {
    let mut rng = StdRng::seed_from_u64(3);
    let edge_scales = [
        0.0,
        -0.0,
        f16::MIN_POSITIVE_SUBNORMAL.to_f32(),
        f16::MAX.to_f32(),
        -f16::MAX.to_f32(),
        -0.125,
        f32::INFINITY,
        f32::NAN,
    ];
    for top in [14u8, 15] {
        let groups = 64;
        let mut codes: Vec<u8> = (0..groups * 32)
            .map(|_| rng.random_range(0..=top))
            .collect();
        // Whole groups of the extreme codes, and the extremes at both nibble positions.
        codes[..32].fill(0);
        codes[32..64].fill(top);
        codes[64] = top;
        codes[64 + 31] = 0;
        let scales: Vec<f16> = (0..groups)
            .map(|g| match edge_scales.get(g) {
                Some(&s) => f16::from_f32(s),
                None => f16::from_f32(rng.random_range(-2.0f32..2.0)),
            })
            .collect();
        let q_weight = pack(&codes);
        let q_scale: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        assert_eq!(q4f16::groups(&q_weight, &q_scale), Some(groups));
        assert_eq!(q4f16::has_code_15(&q_weight), top == 15);
        let want: Vec<f32> = codes
            .iter()
            .enumerate()
            .map(|(i, &c)| f32::from(c as i8 - 7) * scales[i / 32].to_f32())
            .collect();
        let mut got = vec![0f32; want.len()];
        if top == 14 {
            q4_0::dequantize_row(&q4f16::to_q4_0(&q_weight, &q_scale), &mut got);
        } else {
            q8_0::dequantize_row(&q4f16::to_q8_0(&q_weight, &q_scale), &mut got);
        }
        let reference = q4f16::dequantize(&q_weight, &q_scale);
        for (i, ((&w, &g), &r)) in want.iter().zip(&got).zip(&reference).enumerate() {
            assert!(
                same_f32(w, g) && same_f32(w, r),
                "top {top}, element {i}: want {w}, repacked {g}, dequantized {r}"
            );
        }
    }
}

#[test]
fn groups_rejects_mismatched_lengths() {
    assert_eq!(q4f16::groups(&[0; 32], &[0; 4]), Some(2));
    assert_eq!(q4f16::groups(&[0; 32], &[0; 2]), None);
    assert_eq!(q4f16::groups(&[0; 16], &[0; 3]), None);
}

#[test]
fn open_detects_directories_and_files() {
    let (mlc, gguf) = fixture("open", false);
    assert!(is_mlc_dir(&mlc));
    assert!(!is_mlc_dir(&gguf));
    assert!(!is_mlc_dir(mlc.parent().unwrap()));
    assert_eq!(open(&mlc).unwrap().path(), mlc.as_path());
    assert_eq!(open(&gguf).unwrap().path(), gguf.as_path());
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
}

/// Rewrites the JSON file `path` through `f`.
fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

fn edit_index(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    edit_json(&dir.join(INDEX_FILES[1]), f)
}

/// The error of loading `dir` after `edit`; the directory is rewritten first.
fn broken(tag: &str, edit: impl FnOnce(&Path)) -> Error {
    let (mlc, _) = fixture(tag, false);
    edit(&mlc);
    let e = match load_dir(&mlc) {
        Ok(_) => panic!("{tag}: a broken directory loaded"),
        Err(e) => e,
    };
    std::fs::remove_dir_all(mlc.parent().unwrap()).ok();
    e
}

#[test]
fn hostile_directories_give_typed_errors() {
    let e = broken("trunc", |d| {
        let p = d.join("params_shard_0.bin");
        let len = std::fs::metadata(&p).unwrap().len();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("shard is")),
        "{e}"
    );

    let e = broken("json", |d| {
        std::fs::write(d.join(INDEX_FILES[1]), b"{\"records\": [").unwrap()
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("invalid JSON")),
        "{e}"
    );

    let e = broken("config", |d| {
        std::fs::write(d.join(CONFIG_FILE), b"[1, 2]").unwrap()
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("invalid JSON")),
        "{e}"
    );

    let e = broken("nbytes", |d| {
        edit_index(d, |v| {
            let r = &mut v["records"][0]["records"][0]["nbytes"];
            *r = (r.as_u64().unwrap() + 4).into();
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("does not match shape")),
        "{e}"
    );

    let e = broken("offset", |d| {
        edit_index(d, |v| {
            v["records"][0]["records"][0]["byteOffset"] = u64::MAX.into()
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("run past shard")),
        "{e}"
    );

    let e = broken("missing", |d| {
        edit_index(d, |v| {
            for shard in v["records"].as_array_mut().unwrap() {
                shard["records"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|r| r["name"] != "transformer.h.1.mlp.down_proj.q_scale");
            }
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("transformer.h.1.mlp.down_proj.q_scale")),
        "{e}"
    );

    let e = broken("dtype", |d| {
        edit_index(d, |v| {
            v["records"][0]["records"][0]["dtype"] = "int4x8".into()
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("unsupported dtype 'int4x8'")),
        "{e}"
    );

    let e = broken("format", |d| {
        edit_index(d, |v| {
            v["records"][0]["records"][0]["format"] = "zstd".into()
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("format 'zstd'")),
        "{e}"
    );

    let e = broken("path", |d| {
        edit_index(d, |v| v["records"][0]["dataPath"] = "../ref.gguf".into())
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("not a file name inside")),
        "{e}"
    );

    let e = broken("noshard", |d| {
        std::fs::remove_file(d.join("params_shard_1.bin")).unwrap()
    });
    assert!(matches!(&e, Error::Io { .. }), "{e}");

    // The configuration claims a wider FFN than the tensors hold.
    let e = broken("shape", |d| {
        edit_json(&d.join(CONFIG_FILE), |v| {
            v["model_config"]["intermediate_size"] = 128.into()
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("mlp.gate_up_proj")),
        "{e}"
    );

    let e = broken("quant", |d| {
        edit_json(&d.join(CONFIG_FILE), |v| {
            v["quantization"] = "q4f16_0".into()
        })
    });
    assert!(
        matches!(&e, Error::Unsupported { found, supported, .. }
            if found == "q4f16_0" && supported == &["q4f16_1"]),
        "{e}"
    );
    assert!(
        e.to_string().contains("mlc-chat-config.json: quantization"),
        "{e}"
    );

    let e = broken("rope", |d| {
        edit_json(&d.join(CONFIG_FILE), |v| {
            v["model_config"]["rope_scaling"] = serde_json::json!({"type": "longrope"})
        })
    });
    assert!(
        matches!(&e, Error::Mlc(m) if m.to_string().contains("rope_scaling")),
        "{e}"
    );

    let e = broken("spm", |d| {
        std::fs::remove_file(d.join(tokenizer::SPM_FILE)).unwrap()
    });
    assert!(
        matches!(&e, Error::Tokenizer(TokenizerFileError::SpmMissing { path })
            if path.ends_with("tokenizer.model")),
        "{e}"
    );

    let e = broken("spmtrunc", |d| {
        let p = d.join(tokenizer::SPM_FILE);
        let mut b = std::fs::read(&p).unwrap();
        // A `pieces` field whose length runs past the end of the file.
        b.extend_from_slice(&[0x0A, 0xFF, 0xFF, 0x03]);
        std::fs::write(&p, &b).unwrap();
    });
    assert!(
        matches!(
            &e,
            Error::Tokenizer(TokenizerFileError::Spm(SpmProblem::FieldPastEnd))
        ),
        "{e}"
    );
    assert!(e.to_string().contains("tokenizer.model"), "{e}");

    let e = broken("added", |d| {
        let p = d.join(tokenizer::HF_FILE);
        let v = serde_json::json!({"added_tokens": [{"id": 1u64 << 40, "content": "x", "special": true}]});
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    });
    assert!(
        matches!(&e, Error::Tokenizer(TokenizerFileError::AddedTokenId { id, .. }) if *id == 1 << 40),
        "{e}"
    );
}

#[test]
fn float_norm_storages_convert_exactly() {
    let v = -1.40625f32; // exact in f16, bf16 and f32
    assert_eq!(float_value(Stored::F16, &f16::from_f32(v).to_le_bytes()), v);
    assert_eq!(
        float_value(Stored::Bf16, &half::bf16::from_f32(v).to_le_bytes()),
        v
    );
    assert_eq!(float_value(Stored::F32, &v.to_le_bytes()), v);
    let tiny = f16::MIN_POSITIVE_SUBNORMAL;
    assert_eq!(float_value(Stored::F16, &tiny.to_le_bytes()), tiny.to_f32());
}

#[test]
fn record_storage_follows_tvm_formats() {
    let f = "f32-to-bf16";
    assert_eq!(Stored::parse("uint32", f), Some(Stored::U32));
    assert_eq!(Stored::parse("float16", f), Some(Stored::F16));
    assert_eq!(Stored::parse("float32", f), Some(Stored::Bf16));
    assert_eq!(Stored::parse("float32", "raw"), Some(Stored::F32));
    assert_eq!(Stored::parse("bfloat16", "raw"), Some(Stored::Bf16));
    assert_eq!(Stored::parse("int8", "raw"), None);
    assert_eq!(Stored::parse("float16", "zstd"), None);
}
