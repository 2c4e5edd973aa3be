//! Reader/writer round trips and hostile-file rejection: every malformed file is a clean
//! error, never a panic or an allocation sized by the file's claims.

use super::*;
use crate::quant::GgmlType;
use crate::Error;

/// A fresh temporary path (tests run in parallel, so every call gets its own name).
fn tmp(name: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = ternion_testkit::scratch::dir("ternion-gguf");
    dir.join(format!("{n}-{name}"))
}

/// A small valid file: a few metadata types and two tensors.
fn sample_bytes() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::Str("llama".into()))
        .add("a.u32", Value::U32(7))
        .add("a.f32", Value::F32(1.5))
        .add("a.bool", Value::Bool(true))
        .add_strings("a.strings", &["x", "yy", ""])
        .add(
            "a.nested",
            Value::Array(
                ValueType::Array,
                vec![Value::Array(ValueType::I8, vec![Value::I8(-1)])],
            ),
        );
    w.declare("t.f32", GgmlType::F32, &[3, 2]).unwrap();
    w.declare("t.i2s", GgmlType::I2_S, &[128, 2]).unwrap();
    let path = tmp("sample.gguf");
    w.write_with(&path, vec![vec![1u8; 24], vec![2u8; 64 + 32]])
        .unwrap();
    std::fs::read(&path).unwrap()
}

fn parse(bytes: Vec<u8>) -> crate::Result<GgufFile> {
    GgufFile::from_bytes("test.gguf", bytes)
}

fn expect_gguf_err(bytes: Vec<u8>, needle: &str) {
    match parse(bytes) {
        Err(e @ Error::Gguf { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}")
        }
        Err(e) => panic!("wrong error kind: {e}"),
        Ok(_) => panic!("hostile file accepted (expected error containing {needle:?})"),
    }
}

#[test]
fn round_trip() {
    let f = parse(sample_bytes()).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(f.get_u32("a.u32").unwrap(), Some(7));
    assert_eq!(f.get_f32("a.f32").unwrap(), Some(1.5));
    assert_eq!(f.get_bool("a.bool").unwrap(), Some(true));
    assert_eq!(
        f.get_str_array("a.strings").unwrap(),
        Some(vec!["x", "yy", ""])
    );
    let t = f.tensor("t.i2s").unwrap();
    assert_eq!(t.size, 128 * 2 / 4 + 32, "I2_S true size is n/4 + 32");
    assert_eq!(t.offset % 32, 0);
    assert!(f.tensor_data(t).iter().all(|&b| b == 2));
    assert_eq!(f.tensor_data(f.tensor("t.f32").unwrap()), &[1u8; 24][..]);
    assert!(f.get_u32("a.strings").is_err(), "type mismatch is an error");
}

#[test]
fn version_2_is_read() {
    let mut b = sample_bytes();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(parse(b).unwrap().version, 2);
}

#[test]
fn errors_name_the_problem_and_its_place() {
    let problem = |b: Vec<u8>| match parse(b) {
        Err(Error::Gguf { file, at, problem }) => {
            assert_eq!(file, std::path::Path::new("test.gguf"));
            (*at, problem)
        }
        other => panic!("expected a GGUF error, got {:?}", other.map(|f| f.version)),
    };
    let mut b = sample_bytes();
    b[..4].copy_from_slice(b"GGML");
    assert_eq!(
        problem(b),
        (GgufPlace::Header, GgufProblem::BadMagic { magic: *b"GGML" })
    );
    for (version, message) in [
        (1u32, "GGUF version 1 is not supported (only 2 and 3)"),
        (3u32.swap_bytes(), "(a big-endian file?)"),
        (9, "unsupported GGUF version 9; expected 2 or 3"),
    ] {
        let mut b = sample_bytes();
        b[4..8].copy_from_slice(&version.to_le_bytes());
        let Err(e) = parse(b) else {
            panic!("version {version} accepted")
        };
        assert!(
            matches!(&e, Error::Gguf { problem: GgufProblem::UnsupportedVersion { version: v }, .. } if *v == version)
        );
        assert!(e.to_string().contains(message), "{e}");
        assert_eq!(e.kind(), "Gguf");
    }
    // A bool byte other than 0 or 1 is reported at its metadata key.
    let mut b = sample_bytes();
    let at = find(&b, b"a.bool") + 6 + 4;
    b[at] = 7;
    let (at, p) = problem(b);
    assert_eq!(
        at,
        GgufPlace::Metadata {
            key: "a.bool".into()
        }
    );
    assert_eq!(p, GgufProblem::InvalidBool { byte: 7 });
    // A tensor of 5 dimensions is reported at the tensor.
    let mut b = sample_bytes();
    let at = find(&b, b"t.f32") + 5;
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    assert_eq!(
        problem(b),
        (
            GgufPlace::TensorInfo {
                tensor: "t.f32".into()
            },
            GgufProblem::BadDimCount { n_dims: 5, max: 4 }
        )
    );
}

#[test]
fn metadata_of_the_wrong_type_names_key_and_expectation() {
    let f = parse(sample_bytes()).unwrap();
    match f.get_u32("a.strings") {
        Err(Error::Metadata { key, expected, .. }) => assert_eq!(
            (key.as_str(), expected),
            ("a.strings", "an unsigned 32-bit integer")
        ),
        other => panic!("expected a metadata error, got {other:?}"),
    }
    let e = f.require_str_array("absent").unwrap_err();
    assert!(
        e.to_string()
            .ends_with("metadata 'absent': expected an array of strings, found nothing"),
        "{e}"
    );
}

#[test]
fn truncated_file() {
    let b = sample_bytes();
    for cut in [0, 3, 10, 30, 100, b.len() - 1] {
        assert!(parse(b[..cut].to_vec()).is_err(), "cut at {cut} accepted");
    }
}

/// Byte offset of the tensor table's first entry in `sample_bytes()`.
fn find(b: &[u8], needle: &[u8]) -> usize {
    b.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn tensor_offset_past_end() {
    let mut b = sample_bytes();
    // name "t.i2s" (len 5) then n_dims u32, 2 dims, type u32, offset u64.
    let at = find(&b, b"t.i2s") + 5 + 4 + 16 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_gguf_err(b, "past the end");
}

#[test]
fn dimensions_overflow() {
    let mut b = sample_bytes();
    let at = find(&b, b"t.f32") + 5 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    b[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_gguf_err(b, "overflow");
}

#[test]
fn unknown_type_id() {
    let mut b = sample_bytes();
    let at = find(&b, b"t.f32") + 5 + 4 + 16;
    b[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    match parse(b) {
        Err(Error::UnsupportedType {
            tensor, type_id, ..
        }) => {
            assert_eq!(tensor, "t.f32");
            assert_eq!(type_id, 77);
        }
        other => panic!("expected UnsupportedType, got {:?}", other.err()),
    }
}

#[test]
fn huge_array_length() {
    let mut b = sample_bytes();
    // "a.strings" key, then value type u32 (9), element type u32 (8), length u64.
    let at = find(&b, b"a.strings") + 9 + 4 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    expect_gguf_err(b, "cannot fit");
}

#[test]
fn string_length_past_end() {
    let mut b = sample_bytes();
    let at = find(&b, b"general.architecture") + 20 + 4;
    b[at..at + 8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    expect_gguf_err(b, "past the end");
}

#[test]
fn huge_counts() {
    let mut b = sample_bytes();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_gguf_err(b.clone(), "cannot fit");
    let mut b = sample_bytes();
    b[16..24].copy_from_slice(&(1u64 << 59).to_le_bytes());
    expect_gguf_err(b, "cannot fit");
}

#[test]
fn bad_magic_and_version() {
    let mut b = sample_bytes();
    b[0] = b'X';
    expect_gguf_err(b, "not a GGUF");
    let mut b = sample_bytes();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_gguf_err(b, "big-endian");
    let mut b = sample_bytes();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect_gguf_err(b, "version 1");
}

#[test]
fn deep_nesting_rejected() {
    // 100 levels of arrays of arrays: rejected by depth, not by stack overflow.
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100 {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    b.extend_from_slice(&[0u8; 64]);
    expect_gguf_err(b, "nested");
}

#[test]
fn misaligned_offset_and_overlap() {
    let mut b = sample_bytes();
    let at = find(&b, b"t.i2s") + 5 + 4 + 16 + 4;
    b[at..at + 8].copy_from_slice(&8u64.to_le_bytes());
    expect_gguf_err(b, "alignment");
    let mut b = sample_bytes();
    b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    expect_gguf_err(b, "overlap");
}

#[test]
fn i2s_row_length_must_be_whole_blocks() {
    let mut w = GgufWriter::new();
    assert!(w.declare("bad", GgmlType::I2_S, &[100, 2]).is_err());
    assert!(w.declare("bad", GgmlType::Q4_0, &[33]).is_err());
}

/// Fuzz finding (gguf_reader): a row length whose byte size overflows u64 (here 2^62 F32
/// elements, 2^64 bytes) made `GgmlType::row_bytes` overflow; with overflow checks off the
/// size wrapped to 0 and the tensor was accepted with a size that did not match its shape.
#[test]
fn row_bytes_overflow_is_an_error() {
    assert_eq!(GgmlType::F32.row_bytes(1 << 62), None);
    assert_eq!(GgmlType::Q8_0.row_bytes(u64::MAX / 32 * 32), None);
    let mut b = sample_bytes();
    let at = find(&b, b"t.f32") + 5 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    b[at + 8..at + 16].copy_from_slice(&1u64.to_le_bytes());
    expect_gguf_err(b, "overflow");
}

/// Decoded metadata takes up to 32× the file bytes it came from (a u8 element is 1 byte on
/// disk, a `Value` in memory): the total number of array elements is capped, so a large
/// file of byte arrays cannot ask for tens of gigabytes.
#[test]
fn metadata_elements_are_capped_in_total() {
    let limit = cursor::MAX_METADATA_ELEMENTS;
    let header = |n_kv: u64| {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&n_kv.to_le_bytes());
        b
    };
    let array = |b: &mut Vec<u8>, key: &[u8], n: u64| {
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(&(ValueType::Array as u32).to_le_bytes());
        b.extend_from_slice(&(ValueType::U8 as u32).to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        b.resize(b.len() + n as usize, 0);
    };
    // Small arrays are fine; arrays that together pass the limit are not (refused before
    // the second one is decoded).
    let mut b = header(2);
    array(&mut b, b"a", 1000);
    array(&mut b, b"b", 1000);
    assert!(parse(b).is_ok());
    let mut b = header(2);
    array(&mut b, b"a", 1000);
    array(&mut b, b"b", limit - 999);
    expect_gguf_err(b, "metadata array elements");
}

#[test]
fn header_from_every_prefix() {
    let full = sample_bytes();
    let whole = parse(full.clone()).unwrap();
    let len = full.len() as u64;
    let mut first_complete = None;
    for cut in 0..=full.len() {
        match GgufFile::parse_header("prefix.gguf", full[..cut].to_vec(), len).unwrap() {
            None => assert!(
                first_complete.is_none(),
                "prefix {cut} short after a complete one"
            ),
            Some(h) => {
                first_complete.get_or_insert(cut);
                assert_eq!(h.file_len(), len);
                assert_eq!(h.has_tensor_data(), cut == full.len());
                assert_eq!(h.data_offset, whole.data_offset);
                for (a, b) in h.tensors.iter().zip(&whole.tensors) {
                    assert_eq!((&a.name, a.offset, a.size), (&b.name, b.offset, b.size));
                }
                assert_eq!(
                    h.get_str_array("a.strings").unwrap(),
                    Some(vec!["x", "yy", ""])
                );
            }
        }
    }
    let cut = first_complete.expect("the whole file parses");
    assert!(cut as u64 <= whole.data_offset, "header needs {cut} bytes");
    let h = GgufFile::parse_header("p.gguf", full[..cut].to_vec(), len)
        .unwrap()
        .unwrap();
    assert!(h.tensor_data(h.tensor("t.i2s").unwrap()).is_empty());
}

#[test]
fn header_checks_the_declared_length() {
    let full = sample_bytes();
    let data_offset = parse(full.clone()).unwrap().data_offset as usize;
    let head = full[..data_offset].to_vec();
    // Tensor data past the declared end is the same error as for a truncated file.
    let short_len = full.len() as u64 - 1;
    match GgufFile::parse_header("p.gguf", head.clone(), short_len) {
        Err(Error::Gguf {
            problem: GgufProblem::TruncatedTensorData { file_len, .. },
            ..
        }) => assert_eq!(file_len, short_len),
        other => panic!("expected an error, got {:?}", other.map(|o| o.is_some())),
    }
    assert!(
        GgufFile::parse_header("p.gguf", head, 4).is_err(),
        "prefix longer than file"
    );
    let mut bad = full[..64].to_vec();
    bad[0] = b'X';
    assert!(GgufFile::parse_header("p.gguf", bad, full.len() as u64).is_err());
}
