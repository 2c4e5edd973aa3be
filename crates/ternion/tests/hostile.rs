//! The hostile corpus: malformed GGUF files generated programmatically, each of which must
//! be rejected with an `Err` (never a panic, an abort or a long computation) by the stage
//! that owns the broken part: the reader (`GgufFile::from_bytes`), the model
//! (`Model::from_file`, and `model::load` from a path) or the tokenizer
//! (`Tokenizer::from_gguf`).

use ternion_testkit::gguf_gen;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gguf_gen::*;
use ternion::gguf::GgufFile;
use ternion::model::{self, LoadOptions, Model};
use ternion::quant::GgmlType;
use ternion::tokenizer::{Tokenizer, TokenizerOptions};

/// Which stage must reject a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Reader,
    Model,
    Tokenizer,
}

/// The first stage that fails on `bytes` with its error text, or `None` if all pass.
fn first_failure(bytes: &[u8]) -> Option<(Stage, String)> {
    let file = match GgufFile::from_bytes("hostile.gguf", bytes.to_vec()) {
        Ok(f) => Arc::new(f),
        Err(e) => return Some((Stage::Reader, e.to_string())),
    };
    let model = Model::from_file(file.clone(), &LoadOptions::default());
    if let Err(e) = model {
        return Some((Stage::Model, e.to_string()));
    }
    if let Err(e) = Tokenizer::from_gguf(&file, &TokenizerOptions::default()) {
        return Some((Stage::Tokenizer, e.to_string()));
    }
    None
}

fn tmp_path(name: &str) -> std::path::PathBuf {
    let d = ternion_testkit::scratch::dir("ternion-hostile");
    d.join(name)
}

/// A hostile case: a name, its bytes, the stage that must reject it and a fragment its
/// error message must contain.
struct Case {
    name: String,
    bytes: Vec<u8>,
    stage: Stage,
    needle: &'static str,
}

fn case(cases: &mut Vec<Case>, name: &str, stage: Stage, needle: &'static str, bytes: Vec<u8>) {
    cases.push(Case {
        name: name.into(),
        bytes,
        stage,
        needle,
    });
}

/// `micro_model()` edited by `f`, laid out again (tensor data follows the table).
fn edited(f: impl FnOnce(&mut Raw)) -> Vec<u8> {
    let mut r = micro_model();
    f(&mut r);
    r.layout();
    r.bytes()
}

/// `micro_model()` edited by `f` after layout (offsets and data stay as `f` leaves them).
fn raw_edit(f: impl FnOnce(&mut Raw)) -> Vec<u8> {
    let mut r = micro_model();
    f(&mut r);
    r.bytes()
}

const A: &str = "bitnet-b1.58";

fn key(k: &str) -> String {
    format!("{A}.{k}")
}

fn all_cases() -> Vec<Case> {
    use Stage::*;
    let mut c = Vec::new();
    let good = micro_model().bytes();

    // --- Reader: framing, counts, lengths.
    case(&mut c, "empty", Reader, "truncated", Vec::new());
    // Truncated at many points: inside the header, the metadata, the tensor table and the
    // data (the last tensor loses its bytes).
    let table_end = good.len() - micro_model().data.len();
    let mut cuts: Vec<usize> = (0..64).chain((64..table_end).step_by(97)).collect();
    cuts.extend([
        table_end - 1,
        table_end + 1,
        good.len() / 2,
        good.len() - 33,
        good.len() - 1,
    ]);
    for cut in cuts {
        let needle = if cut > table_end { "past the end" } else { "" };
        case(
            &mut c,
            &format!("truncated-at-{cut}"),
            Reader,
            needle,
            good[..cut].to_vec(),
        );
    }
    case(
        &mut c,
        "bad-magic",
        Reader,
        "not a GGUF",
        raw_edit(|r| r.magic = *b"GGML"),
    );
    case(
        &mut c,
        "version-1",
        Reader,
        "version 1",
        raw_edit(|r| r.version = 1),
    );
    case(
        &mut c,
        "version-4",
        Reader,
        "version 4",
        raw_edit(|r| r.version = 4),
    );
    case(
        &mut c,
        "big-endian",
        Reader,
        "big-endian",
        raw_edit(|r| r.version = 3u32.swap_bytes()),
    );
    case(
        &mut c,
        "n-tensors-2^60",
        Reader,
        "cannot fit",
        raw_edit(|r| r.n_tensors = Some(1 << 60)),
    );
    case(
        &mut c,
        "n-kv-2^60",
        Reader,
        "cannot fit",
        raw_edit(|r| r.n_kv = Some(1 << 60)),
    );
    case(
        &mut c,
        "n-kv-u64-max",
        Reader,
        "cannot fit",
        raw_edit(|r| r.n_kv = Some(u64::MAX)),
    );
    case(
        &mut c,
        "n-tensors-one-more",
        Reader,
        "",
        raw_edit(|r| r.n_tensors = Some(14)),
    );
    case(
        &mut c,
        "n-kv-one-more",
        Reader,
        "",
        raw_edit(|r| r.n_kv = Some(r.kvs.len() as u64 + 1)),
    );
    case(&mut c, "key-length-past-end", Reader, "past the end", {
        let mut b = good.clone();
        b[24..32].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
        b
    });
    case(
        &mut c,
        "string-value-past-end",
        Reader,
        "past the end",
        raw_edit(|r| {
            let mut p = (1u64 << 50).to_le_bytes().to_vec();
            p.extend_from_slice(b"bitnet");
            r.set("general.architecture", (ty::STR, p));
        }),
    );
    case(
        &mut c,
        "array-count-2^60",
        Reader,
        "cannot fit",
        raw_edit(|r| {
            let mut p = ty::STR.to_le_bytes().to_vec();
            p.extend_from_slice(&(1u64 << 60).to_le_bytes());
            r.set("tokenizer.ggml.tokens", (ty::ARRAY, p));
        }),
    );
    case(
        &mut c,
        "array-of-u64-count-2^61",
        Reader,
        "cannot fit",
        raw_edit(|r| {
            let mut p = ty::U64.to_le_bytes().to_vec();
            p.extend_from_slice(&(1u64 << 61).to_le_bytes());
            r.set("x", (ty::ARRAY, p));
        }),
    );
    case(
        &mut c,
        "unknown-value-type",
        Reader,
        "unknown value type",
        raw_edit(|r| {
            r.set("x", (13, vec![0; 8]));
        }),
    );
    case(
        &mut c,
        "unknown-array-element-type",
        Reader,
        "unknown array element",
        raw_edit(|r| {
            r.set("x", arrv(99, &[vec![0; 4]]));
        }),
    );
    case(
        &mut c,
        "bad-bool-byte",
        Reader,
        "invalid bool",
        raw_edit(|r| {
            r.set("x", (ty::BOOL, vec![2]));
        }),
    );
    case(
        &mut c,
        "deep-array-nesting",
        Reader,
        "nested",
        raw_edit(|r| {
            let mut p = Vec::new();
            for _ in 0..1000 {
                p.extend_from_slice(&ty::ARRAY.to_le_bytes());
                p.extend_from_slice(&1u64.to_le_bytes());
            }
            p.extend_from_slice(&ty::U8.to_le_bytes());
            p.extend_from_slice(&1u64.to_le_bytes());
            p.push(0);
            r.set("x", (ty::ARRAY, p));
        }),
    );
    case(
        &mut c,
        "duplicate-key",
        Reader,
        "duplicate metadata",
        raw_edit(|r| {
            let k = r.kvs[0].clone();
            r.kvs.push(k);
        }),
    );

    // --- Reader: alignment.
    case(
        &mut c,
        "alignment-48",
        Reader,
        "power of two",
        edited(|r| {
            r.set("general.alignment", u32v(48));
        }),
    );
    case(
        &mut c,
        "alignment-0",
        Reader,
        "power of two",
        edited(|r| {
            r.set("general.alignment", u32v(0));
        }),
    );
    case(
        &mut c,
        "alignment-2^40",
        Reader,
        "power of two",
        edited(|r| {
            r.set("general.alignment", u64v(1 << 40));
        }),
    );
    case(
        &mut c,
        "alignment-string",
        Reader,
        "power of two",
        edited(|r| {
            r.set("general.alignment", strv("32"));
        }),
    );

    // --- Reader: tensor table.
    let blk_q = "blk.0.attn_q.weight";
    case(
        &mut c,
        "tensor-offset-past-end",
        Reader,
        "past the end",
        raw_edit(|r| {
            r.ti(blk_q).offset = 1 << 40;
        }),
    );
    case(
        &mut c,
        "tensor-offset-u64-max",
        Reader,
        "overflow",
        raw_edit(|r| {
            r.ti(blk_q).offset = u64::MAX - 31;
        }),
    );
    case(
        &mut c,
        "tensor-offset-misaligned",
        Reader,
        "alignment",
        raw_edit(|r| {
            r.ti(blk_q).offset += 8;
        }),
    );
    case(
        &mut c,
        "tensors-overlap",
        Reader,
        "overlap",
        raw_edit(|r| {
            let o = r.ti("blk.0.attn_k.weight").offset;
            r.ti(blk_q).offset = o;
        }),
    );
    case(
        &mut c,
        "dims-overflow",
        Reader,
        "overflow",
        raw_edit(|r| {
            r.ti(blk_q).dims = vec![1 << 40, 1 << 40];
        }),
    );
    case(
        &mut c,
        "row-bytes-overflow",
        Reader,
        "overflow",
        raw_edit(|r| {
            r.ti("output_norm.weight").dims = vec![1 << 62];
        }),
    );
    case(
        &mut c,
        "dims-4-overflow",
        Reader,
        "overflow",
        raw_edit(|r| {
            r.ti(blk_q).dims = vec![128, 1 << 20, 1 << 20, 1 << 20];
        }),
    );
    case(
        &mut c,
        "n-dims-5",
        Reader,
        "n_dims 5",
        raw_edit(|r| {
            r.ti(blk_q).dims = vec![128, 1, 1, 1, 1];
        }),
    );
    case(
        &mut c,
        "n-dims-0",
        Reader,
        "n_dims 0",
        raw_edit(|r| r.ti(blk_q).dims = vec![]),
    );
    case(
        &mut c,
        "zero-dim",
        Reader,
        "dimension 0",
        raw_edit(|r| r.ti(blk_q).dims = vec![128, 0]),
    );
    case(
        &mut c,
        "dim-over-i64-max",
        Reader,
        "out of range",
        raw_edit(|r| {
            r.ti(blk_q).dims = vec![128, 1 << 63];
        }),
    );
    case(
        &mut c,
        "unknown-type-id",
        Reader,
        "type id 77",
        raw_edit(|r| r.ti(blk_q).ty = 77),
    );
    case(
        &mut c,
        "type-id-u32-max",
        Reader,
        "unsupported type",
        raw_edit(|r| {
            r.ti(blk_q).ty = u32::MAX;
        }),
    );
    case(
        &mut c,
        "row-not-whole-blocks",
        Reader,
        "block size",
        raw_edit(|r| {
            let t = r.ti(blk_q);
            t.ty = GgmlType::Q4_0.id();
            t.dims = vec![33, 4];
        }),
    );
    case(
        &mut c,
        "i2s-row-not-whole-blocks",
        Reader,
        "block size",
        raw_edit(|r| {
            r.ti(blk_q).dims = vec![100, 128];
        }),
    );
    case(
        &mut c,
        "duplicate-tensor-name",
        Reader,
        "duplicate tensor",
        raw_edit(|r| {
            r.ti("blk.0.attn_k.weight").name = blk_q.into();
        }),
    );
    // I2_S's true size is n/4 + 32: a file that stores only n/4 bytes for its last tensor
    // (as a generic ggml size table would claim) is short by the 32-byte tail.
    case(&mut c, "i2s-without-tail", Reader, "past the end", {
        let mut r = micro_model();
        let last = r.tis.len() - 1;
        r.tis.swap(1, last); // an I2_S tensor last in the table and in the data
        r.layout();
        let b = r.bytes();
        b[..b.len() - 32].to_vec()
    });

    // --- Model: metadata types and values.
    case(
        &mut c,
        "arch-missing",
        Model,
        "general.architecture",
        edited(|r| {
            r.unset("general.architecture");
        }),
    );
    case(
        &mut c,
        "arch-unknown",
        Model,
        "unknown architecture",
        edited(|r| {
            r.set("general.architecture", strv("mamba"));
        }),
    );
    case(
        &mut c,
        "arch-is-u32",
        Model,
        "expected a string",
        edited(|r| {
            r.set("general.architecture", u32v(7));
        }),
    );
    case(
        &mut c,
        "block-count-string",
        Model,
        "block_count",
        edited(|r| {
            r.set(&key("block_count"), strv("1"));
        }),
    );
    case(
        &mut c,
        "block-count-huge",
        Model,
        "out of range",
        edited(|r| {
            r.set(&key("block_count"), u32v(u32::MAX));
        }),
    );
    case(
        &mut c,
        "block-count-u64",
        Model,
        "block_count",
        edited(|r| {
            r.set(&key("block_count"), u64v(1 << 40));
        }),
    );
    case(
        &mut c,
        "block-count-more-than-tensors",
        Model,
        "exceeds the 13 tensors",
        edited(|r| {
            r.set(&key("block_count"), u32v(1 << 20));
        }),
    );
    case(
        &mut c,
        "block-count-array",
        Model,
        "block_count",
        edited(|r| {
            r.set(&key("block_count"), i32_arr(&[1]));
        }),
    );
    case(
        &mut c,
        "embedding-length-huge",
        Model,
        "embedding_length",
        edited(|r| {
            r.set(&key("embedding_length"), u32v(u32::MAX));
        }),
    );
    case(
        &mut c,
        "embedding-length-inconsistent",
        Model,
        "token_embd",
        edited(|r| {
            r.set(&key("embedding_length"), u32v(1 << 20));
        }),
    );
    case(
        &mut c,
        "embedding-length-negative",
        Model,
        "embedding_length",
        edited(|r| {
            r.set(&key("embedding_length"), i32v(-128));
        }),
    );
    case(
        &mut c,
        "head-count-0",
        Model,
        "head_count",
        edited(|r| {
            r.set(&key("attention.head_count"), u32v(0));
        }),
    );
    case(
        &mut c,
        "head-count-not-dividing",
        Model,
        "multiple of head_count",
        edited(|r| {
            r.set(&key("attention.head_count"), u32v(3));
        }),
    );
    case(
        &mut c,
        "head-count-over-width",
        Model,
        "multiple of head_count",
        edited(|r| {
            r.set(&key("attention.head_count"), u32v(256));
        }),
    );
    case(
        &mut c,
        "head-count-kv-0",
        Model,
        "head_count_kv",
        edited(|r| {
            r.set(&key("attention.head_count_kv"), u32v(0));
        }),
    );
    case(
        &mut c,
        "head-count-kv-over-heads",
        Model,
        "head_count_kv",
        edited(|r| {
            r.set(&key("attention.head_count_kv"), u32v(2));
        }),
    );
    case(
        &mut c,
        "ffn-length-missing",
        Model,
        "feed_forward_length",
        edited(|r| {
            r.unset(&key("feed_forward_length"));
        }),
    );
    case(
        &mut c,
        "context-length-0",
        Model,
        "context_length",
        edited(|r| {
            r.set(&key("context_length"), u32v(0));
        }),
    );
    case(
        &mut c,
        "rope-base-nan",
        Model,
        "freq_base",
        edited(|r| {
            r.set(&key("rope.freq_base"), f32v(f32::NAN));
        }),
    );
    case(
        &mut c,
        "rope-base-negative",
        Model,
        "freq_base",
        edited(|r| {
            r.set(&key("rope.freq_base"), f32v(-1.0));
        }),
    );
    case(
        &mut c,
        "rope-base-string",
        Model,
        "freq_base",
        edited(|r| {
            r.set(&key("rope.freq_base"), strv("1e4"));
        }),
    );
    case(
        &mut c,
        "rms-eps-0",
        Model,
        "epsilon",
        edited(|r| {
            r.set(&key("attention.layer_norm_rms_epsilon"), f32v(0.0));
        }),
    );
    case(
        &mut c,
        "rms-eps-inf",
        Model,
        "epsilon",
        edited(|r| {
            r.set(
                &key("attention.layer_norm_rms_epsilon"),
                f32v(f32::INFINITY),
            );
        }),
    );
    case(
        &mut c,
        "rope-dims-odd",
        Model,
        "rope.dimension_count",
        edited(|r| {
            r.set(&key("rope.dimension_count"), u32v(127));
        }),
    );
    case(
        &mut c,
        "rope-dims-over-head",
        Model,
        "rope.dimension_count",
        edited(|r| {
            r.set(&key("rope.dimension_count"), u32v(256));
        }),
    );

    // --- Model: tensors missing or inconsistent with the hyper-parameters.
    case(
        &mut c,
        "missing-token-embd",
        Model,
        "token_embd.weight",
        edited(|r| {
            r.remove_tensor("token_embd.weight");
        }),
    );
    case(
        &mut c,
        "missing-ffn-down",
        Model,
        "blk.0.ffn_down.weight",
        edited(|r| {
            r.remove_tensor("blk.0.ffn_down.weight");
        }),
    );
    case(
        &mut c,
        "missing-output-norm",
        Model,
        "output_norm.weight",
        edited(|r| {
            r.remove_tensor("output_norm.weight");
        }),
    );
    case(
        &mut c,
        "token-embd-1d",
        Model,
        "token_embd",
        edited(|r| {
            r.ti("token_embd.weight").dims = vec![D * NV];
        }),
    );
    case(
        &mut c,
        "token-embd-3d",
        Model,
        "token_embd",
        edited(|r| {
            r.ti("token_embd.weight").dims = vec![D, NV, 1];
        }),
    );
    case(
        &mut c,
        "attn-q-wrong-shape",
        Model,
        "attn_q",
        edited(|r| {
            r.ti(blk_q).dims = vec![D, D / 2];
        }),
    );
    case(
        &mut c,
        "ffn-down-reshaped",
        Model,
        "ffn_down",
        edited(|r| {
            r.ti("blk.0.ffn_down.weight").dims = vec![FF * 2, D / 2];
        }),
    );
    case(
        &mut c,
        "attn-q-1d",
        Model,
        "attn_q",
        edited(|r| r.ti(blk_q).dims = vec![D * D]),
    );
    case(
        &mut c,
        "attn-q-no-kernel",
        Model,
        "attn_q",
        edited(|r| {
            r.ti(blk_q).ty = GgmlType::Q8_1.id();
        }),
    );
    case(
        &mut c,
        "norm-wrong-length",
        Model,
        "ffn_norm",
        edited(|r| {
            r.ti("blk.0.ffn_norm.weight").dims = vec![D / 2];
        }),
    );
    case(
        &mut c,
        "norm-no-dequantizer",
        Model,
        "attn_norm",
        edited(|r| {
            let t = r.ti("blk.0.attn_norm.weight");
            t.ty = GgmlType::Q8_1.id();
        }),
    );
    case(
        &mut c,
        "norm-i64",
        Model,
        "attn_norm",
        edited(|r| {
            r.ti("blk.0.attn_norm.weight").ty = GgmlType::I64.id();
        }),
    );

    // --- Tokenizer.
    case(
        &mut c,
        "vocab-tokens-missing",
        Tokenizer,
        "tokenizer.ggml.tokens",
        edited(|r| {
            r.unset("tokenizer.ggml.tokens");
        }),
    );
    case(
        &mut c,
        "vocab-tokens-empty",
        Tokenizer,
        "0 entries",
        edited(|r| {
            r.set("tokenizer.ggml.tokens", str_arr(&[]));
        }),
    );
    case(
        &mut c,
        "vocab-tokens-not-strings",
        Tokenizer,
        "array of strings",
        edited(|r| {
            r.set("tokenizer.ggml.tokens", i32_arr(&[1, 2, 3, 4]));
        }),
    );
    case(
        &mut c,
        "vocab-scores-short",
        Tokenizer,
        "scores",
        edited(|r| {
            r.set("tokenizer.ggml.scores", f32_arr(&[0.0; 3]));
        }),
    );
    case(
        &mut c,
        "vocab-types-long",
        Tokenizer,
        "token_type",
        edited(|r| {
            r.set("tokenizer.ggml.token_type", i32_arr(&[1; 5]));
        }),
    );
    case(
        &mut c,
        "vocab-types-u64",
        Tokenizer,
        "token_type",
        edited(|r| {
            let items: Vec<Vec<u8>> = (0..4).map(|_| u64::MAX.to_le_bytes().to_vec()).collect();
            r.set("tokenizer.ggml.token_type", arrv(ty::U64, &items));
        }),
    );
    case(
        &mut c,
        "vocab-model-unknown",
        Tokenizer,
        "tokenizer.ggml.model 'bert' is not supported (supported: gpt2, llama)",
        edited(|r| {
            r.set("tokenizer.ggml.model", strv("bert"));
        }),
    );
    case(
        &mut c,
        "vocab-gpt2-without-merges",
        Tokenizer,
        "merges",
        edited(|r| {
            r.set("tokenizer.ggml.model", strv("gpt2"));
        }),
    );
    case(
        &mut c,
        "vocab-unknown-pre",
        Tokenizer,
        "tokenizer.ggml.pre",
        edited(|r| {
            r.set("tokenizer.ggml.model", strv("gpt2"))
                .set("tokenizer.ggml.merges", str_arr(&["a b"]))
                .set("tokenizer.ggml.pre", strv("no-such-pre"));
        }),
    );
    case(
        &mut c,
        "vocab-bos-string",
        Tokenizer,
        "bos_token_id",
        edited(|r| {
            r.set("tokenizer.ggml.bos_token_id", strv("1"));
        }),
    );
    case(
        &mut c,
        "vocab-add-bos-2",
        Tokenizer,
        "add_bos_token",
        edited(|r| {
            r.set("tokenizer.ggml.add_bos_token", u32v(2));
        }),
    );
    c
}

#[test]
fn micro_model_is_valid() {
    let bytes = micro_model().bytes();
    assert_eq!(first_failure(&bytes).map(|(_, e)| e), None);
    let path = tmp_path("valid.gguf");
    std::fs::write(&path, &bytes).unwrap();
    model::load(&path).expect("the base of every hostile case loads");
}

#[test]
fn hostile_corpus_is_rejected() {
    let cases = all_cases();
    let distinct: std::collections::HashSet<&str> = cases
        .iter()
        .map(|c| c.name.split("-at-").next().unwrap())
        .collect();
    assert!(
        distinct.len() >= 30,
        "only {} kinds of hostile file",
        distinct.len()
    );
    let mut failures = Vec::new();
    for c in &cases {
        let t = Instant::now();
        let got = catch_unwind(AssertUnwindSafe(|| first_failure(&c.bytes)));
        let took = t.elapsed();
        match got {
            Err(_) => failures.push(format!("{}: PANICKED", c.name)),
            Ok(None) => failures.push(format!("{}: accepted", c.name)),
            Ok(Some((stage, msg))) => {
                if stage != c.stage || !msg.contains(c.needle) {
                    failures.push(format!(
                        "{}: expected {:?} error containing {:?}, got {stage:?}: {msg}",
                        c.name, c.stage, c.needle
                    ));
                }
            }
        }
        if took > Duration::from_secs(1) {
            failures.push(format!("{}: took {took:?}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn model_load_from_disk_rejects_hostile_files() {
    // model::load maps the file; the same cases through the path API (reader and model
    // stages only: it does not read the tokenizer).
    for c in all_cases().iter().filter(|c| c.stage != Stage::Tokenizer) {
        let path = tmp_path(&format!("{}.gguf", c.name));
        std::fs::write(&path, &c.bytes).unwrap();
        let t = Instant::now();
        let r = catch_unwind(|| model::load(&path).map(|_| ()));
        assert!(t.elapsed() < Duration::from_secs(1), "{}: slow", c.name);
        match r {
            Err(_) => panic!("{}: model::load panicked", c.name),
            Ok(Ok(())) => panic!("{}: model::load accepted it", c.name),
            Ok(Err(_)) => {}
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// The reader bounds every count and length by the file size: whatever a header claims,
/// parsing allocates no more than a small multiple of the file.
#[test]
fn claims_are_bounded_by_the_file() {
    for claim in [1u64 << 20, 1 << 32, 1 << 40, 1 << 62, u64::MAX] {
        // An array of `claim` u8 in a 64-byte file.
        let mut r = Raw::new();
        let mut p = ty::U8.to_le_bytes().to_vec();
        p.extend_from_slice(&claim.to_le_bytes());
        p.extend_from_slice(&[0; 16]);
        r.set("x", (ty::ARRAY, p));
        let e = GgufFile::from_bytes("c.gguf", r.bytes())
            .err()
            .expect("rejected");
        assert!(e.to_string().contains("cannot fit"), "{e}");
        // A key of `claim` bytes.
        let mut b = Raw::new().bytes();
        b.truncate(24);
        b[16..24].copy_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&claim.to_le_bytes());
        b.extend_from_slice(&[b'k'; 16]);
        let e = GgufFile::from_bytes("c.gguf", b).err().expect("rejected");
        assert!(e.to_string().contains("past the end"), "{e}");
    }
    // An array exactly as long as the bytes left is read (the bound is not off by one).
    let mut r = Raw::new();
    r.set("x", arrv(ty::U8, &vec![vec![7]; 5]));
    let f = GgufFile::from_bytes("c.gguf", r.bytes()).unwrap();
    assert_eq!(f.get("x").unwrap().as_array().unwrap().len(), 5);
}
