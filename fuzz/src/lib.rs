//! Fuzz-target bodies for Ternion, shared by the libFuzzer binaries in `fuzz_targets/` and
//! by the corpus-replay tests below (`cargo test --lib --no-default-features`), which run
//! on stable Rust without libFuzzer.
//!
//! Each function takes arbitrary bytes and must return normally: a panic, an abort, a hang
//! or an out-of-memory is a finding.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ternion::backend::cpu::simd::{self, Level};
use ternion::chat::{ChatTemplate, Message};
use ternion::gguf::{GgufFile, GgufWriter, Value, ValueType};
use ternion::model::{Config, LoadOptions, Logits, Model};
use ternion::quant::{self, act, GgmlType};
use ternion::tokenizer::{byte_to_unicode, StreamDecoder, Tokenizer, TokenizerOptions};
use ternion_server::api::{
    parse_body, ApiError, ChatRequest, Common, CompletionRequest, Prompt, Settings,
};

/// Every ggml type the table knows, for the dispatcher.
const ALL_TYPES: [GgmlType; 23] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
    GgmlType::F64,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::I2_S,
];

/// Rows longer than this are not dequantized by the GGUF target (keeps executions fast).
const MAX_ROW: u64 = 1 << 16;

// ---------------------------------------------------------------------------------------
// gguf_reader

fn touch_value(v: &Value) -> u64 {
    let mut h = v.summary().len() as u64;
    h = h.wrapping_add(v.as_int().map_or(0, |i| i as u64));
    h = h.wrapping_add(v.as_f64().map_or(0, |f| f.to_bits()));
    h = h.wrapping_add(v.as_str().map_or(0, |s| s.len() as u64));
    assert_eq!(v.value_type() as u32, v.value_type() as u32);
    if let Some(items) = v.as_array() {
        for it in items {
            h = h.wrapping_add(touch_value(it));
        }
    }
    h
}

/// Arbitrary bytes → `GgufFile::from_bytes`; on success every metadata value, every
/// tensor's bytes, the typed getters, `Config::from_gguf`, `Model::from_file` (and one forward
/// token when it loads), `Tokenizer::from_gguf` and the chat template are exercised.
pub fn gguf_reader(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let mut h = 0u64;
    assert!(file.version == 2 || file.version == 3);
    assert!(file.alignment.is_power_of_two());
    for (k, v) in &file.metadata {
        h = h.wrapping_add(touch_value(v));
        assert!(file.get(k).is_some());
        let _ = file.get_u32(k);
        let _ = file.get_f32(k);
        let _ = file.get_bool(k);
        let _ = file.get_str(k);
        let _ = file.get_str_array(k);
        let _ = file.get_f32_array(k);
        let _ = file.get_i32_array(k);
        let _ = file.require_u32(k);
    }
    let len = file.file_len();
    for t in &file.tensors {
        assert!(file.tensor(&t.name).is_some());
        assert!(t.offset.checked_add(t.size).is_some_and(|e| e <= len));
        assert_eq!(
            t.offset % file.alignment,
            0,
            "tensor '{}' misaligned",
            t.name
        );
        assert_eq!(t.ty.tensor_bytes(&t.shape), Some(t.size));
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.size);
        h = h.wrapping_add(bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
        let n = t.shape[0];
        if n <= MAX_ROW {
            let mut dst = vec![0f32; n as usize];
            let rows = t.n_rows();
            for row in [0, rows.saturating_sub(1), rows] {
                let r =
                    quant::dequantize_row(t.ty, &t.name, bytes, n as usize, row as usize, &mut dst);
                if row == rows {
                    assert!(r.is_err(), "row past the end accepted");
                }
            }
        }
    }
    std::hint::black_box(h);

    let file = Arc::new(file);
    if Config::from_gguf(&file).is_ok() {
        if let Ok(model) = Model::from_file(file.clone(), &LoadOptions::default()) {
            let mut st = model.cpu_state(2);
            let _ = model.forward_cpu(&[0], Logits::Last, &mut st);
            let _ = model.forward_cpu(&[u32::MAX], Logits::Last, &mut st);
        }
    }
    if let Ok(tok) = Tokenizer::from_gguf(&file, &TokenizerOptions::default()) {
        for text in ["Hello world! 123", " <|eot_id|> ünïcödé 🦀\n\t"] {
            if let Ok(ids) = tok.encode(text, true, true) {
                let _ = tok.decode(&ids);
            }
        }
        let template = file.get_str("tokenizer.chat_template").ok().flatten();
        let t = ChatTemplate::from_metadata(template);
        let _ = t.render(&[Message::new("user", "hi")], true, "<s>", "</s>", true);
    }
}

// ---------------------------------------------------------------------------------------
// quant_blocks

type Decoder = fn(&[u8], &mut [f32]);

/// Block formats with a standalone decoder: (type, decoder, elements per block, bytes).
const DECODERS: &[(GgmlType, Decoder, usize, usize)] = &[
    (GgmlType::F32, quant::float::dequantize_row_f32, 1, 4),
    (GgmlType::F16, quant::float::dequantize_row_f16, 1, 2),
    (GgmlType::BF16, quant::float::dequantize_row_bf16, 1, 2),
    (GgmlType::Q4_0, quant::q4_0::dequantize_row, 32, 18),
    (GgmlType::Q8_0, quant::q8_0::dequantize_row, 32, 34),
    (GgmlType::Q4_K, quant::q4_k::dequantize_row, 256, 144),
    (GgmlType::Q6_K, quant::q6_k::dequantize_row, 256, 210),
    (GgmlType::TQ1_0, quant::tq1_0::dequantize_row, 256, 54),
    (GgmlType::TQ2_0, quant::tq2_0::dequantize_row, 256, 66),
];

/// Deterministic finite activations derived from the input bytes.
fn activations(data: &[u8], n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let b = data
                .get(data.len().wrapping_sub(1 + i % data.len().max(1)))
                .copied();
            f32::from(b.unwrap_or(0) as i8) / 8.0
        })
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Arbitrary bytes → every block decoder and dot on whole blocks, the dispatcher
/// `quant::dequantize_row` on arbitrary (type, row length, row) triples, and the SIMD
/// kernels against their scalar references.
pub fn quant_blocks(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let ty = ALL_TYPES[data[0] as usize % ALL_TYPES.len()];
    let n_per_row = usize::from(u16::from_le_bytes([data[1], data[2]]));
    let row = usize::from(data[3]);
    let body = &data[4..];

    // The dispatcher on arbitrary parameters: Ok or Err, never a panic.
    let mut dst = vec![0f32; n_per_row];
    let _ = quant::dequantize_row(ty, "fuzz", body, n_per_row, row, &mut dst);
    let mut short = vec![0f32; n_per_row / 2];
    assert!(quant::dequantize_row(ty, "fuzz", body, n_per_row, row, &mut short).is_err());

    let level = Level::detect();
    for &(ty, decode, be, bb) in DECODERS {
        let nb = (body.len() / bb).min(8);
        if nb == 0 {
            continue;
        }
        let src = &body[..nb * bb];
        let n = nb * be;
        let mut out = vec![0f32; n];
        decode(src, &mut out);
        let mut via = vec![0f32; n];
        quant::dequantize_row(ty, "fuzz", src, n, 0, &mut via).expect("whole blocks");
        assert!(
            same_bits(&out, &via),
            "{ty}: dispatcher differs from decoder"
        );

        let x = activations(body, n);
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 if n.is_multiple_of(32) => {
                let (mut q, mut d) = (vec![0i8; n], vec![0f32; n / 32]);
                act::quantize_q8_0(&x, &mut q, &mut d);
                let f = if ty == GgmlType::Q8_0 {
                    quant::q8_0::dot_q8_0
                } else {
                    quant::q4_0::dot_q8_0
                };
                std::hint::black_box(f(src, &q, &d));
            }
            GgmlType::TQ1_0 | GgmlType::TQ2_0 => {
                let (mut q, mut d) = (vec![0i8; n], vec![0f32; n / 256]);
                act::quantize_q8k(&x, &mut q, &mut d);
                let f = if ty == GgmlType::TQ1_0 {
                    quant::tq1_0::dot_q8k
                } else {
                    quant::tq2_0::dot_q8k
                };
                std::hint::black_box(f(src, &q, &d));
            }
            GgmlType::F16 => {
                let a = quant::float::dot_f16(src, &x);
                let b = simd::f16_dot(level, src, &x);
                assert_eq!(a.is_nan(), b.is_nan(), "f16 dot: NaN in one kernel only");
            }
            _ => {}
        }
    }

    // I2_S: whole 32-byte blocks plus the tail; integer dots must agree exactly.
    let nb = (body.len().saturating_sub(quant::i2s::TAIL_BYTES) / 32).min(8);
    if nb > 0 {
        let tensor = &body[..nb * 32 + quant::i2s::TAIL_BYTES];
        let rowb = &tensor[..nb * 32];
        let n = nb * 128;
        let scale = quant::i2s::tensor_scale(tensor, n);
        let mut out = vec![0f32; n];
        quant::i2s::dequantize_row(rowb, scale, &mut out);
        let mut via = vec![0f32; n];
        quant::dequantize_row(GgmlType::I2_S, "fuzz", tensor, n, 0, &mut via).expect("I2_S");
        assert!(
            same_bits(&out, &via),
            "I2_S: dispatcher differs from decoder"
        );
        let q: Vec<i8> = (0..n).map(|i| body[i % body.len()] as i8).collect();
        let q_sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
        let want = quant::i2s::dot(rowb, &q);
        assert_eq!(simd::i2s_dot(level, rowb, &q, q_sum), want, "i2s_dot");
        assert_eq!(simd::i2s_dot(Level::Scalar, rowb, &q, q_sum), want);
        let got4 = simd::i2s_dot4(level, rowb, [&q, &q, &q, &q], [q_sum; 4]);
        assert_eq!(got4, [want; 4], "i2s_dot4");
    }
}

// ---------------------------------------------------------------------------------------
// tokenizer

/// Where the shared vocabularies live: `$TERNION_VOCAB_DIR`, else `../../shared/vocab`
/// relative to this crate (the layout of the project's machines).
pub fn vocab_dir() -> PathBuf {
    match std::env::var_os("TERNION_VOCAB_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vocab")),
    }
}

/// A small byte-level BPE vocabulary (256 byte tokens, a few merges, two specials), for
/// machines without the shared vocabularies.
pub fn synthetic_vocab_bytes() -> Vec<u8> {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| byte_to_unicode(b).to_string())
        .collect();
    let sp = byte_to_unicode(b' ');
    let merges = [
        format!("{sp} t"),
        "h e".to_string(),
        format!("{sp}t he"),
        "i n".to_string(),
    ];
    tokens.extend([
        format!("{sp}t"),
        "he".into(),
        format!("{sp}the"),
        "in".into(),
    ]);
    let mut types = vec![Value::I32(1); tokens.len()];
    tokens.extend(["<|endoftext|>".to_string(), "<|eot_id|>".to_string()]);
    types.extend([Value::I32(3), Value::I32(3)]);
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .add("tokenizer.ggml.pre", Value::Str("gpt-2".into()))
        .add_strings("tokenizer.ggml.tokens", &tokens)
        .add_strings("tokenizer.ggml.merges", &merges)
        .add(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types),
        );
    let path = std::env::temp_dir().join(format!("ternion-fuzz-vocab-{}.bin", std::process::id()));
    w.write_with(&path, Vec::new())
        .expect("write synthetic vocabulary");
    let bytes = std::fs::read(&path).expect("read synthetic vocabulary");
    let _ = std::fs::remove_file(&path);
    bytes
}

/// (name, tokenizer, whether decode(encode(s)) == s must hold).
fn tokenizers() -> &'static [(String, Tokenizer, bool)] {
    static TOKS: OnceLock<Vec<(String, Tokenizer, bool)>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let dir = vocab_dir();
        let mut v = Vec::new();
        for (name, byte_level) in [("llama3", true), ("gpt-2", true), ("llama-spm", false)] {
            let path = dir.join(format!("ggml-vocab-{name}.gguf"));
            if let Ok(file) = GgufFile::open(&path) {
                let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default())
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                v.push((name.to_string(), tok, byte_level));
            }
        }
        if v.is_empty() {
            eprintln!(
                "ternion-fuzz: no vocabularies in {} (set TERNION_VOCAB_DIR); using a synthetic one",
                dir.display()
            );
            let file = GgufFile::from_bytes("synthetic", synthetic_vocab_bytes()).unwrap();
            let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default()).unwrap();
            v.push(("synthetic".to_string(), tok, true));
        }
        v
    })
}

fn stream_decode(tok: &Tokenizer, ids: &[u32]) {
    let mut sd = StreamDecoder::new();
    let mut out = String::new();
    for &id in ids {
        out.push_str(&sd.push(tok, id));
    }
    out.push_str(&sd.finish());
    assert_eq!(
        out,
        tok.decode(ids),
        "stream decode differs from lossy decode of {ids:?}"
    );
}

/// Arbitrary bytes: as UTF-8 text, encode/decode round trips (byte-level BPE without
/// specials must reproduce the text exactly) and streaming decode equals lossy decode; as
/// raw ids (any bytes), streaming decode equals lossy decode.
pub fn tokenizer(data: &[u8]) {
    for (name, tok, byte_level) in tokenizers() {
        let n = tok.n_vocab() as u32;
        let ids: Vec<u32> = data
            .chunks(2)
            .map(|c| {
                let v = u32::from(c[0]) | u32::from(*c.get(1).unwrap_or(&0)) << 8;
                v % (n + 8)
            })
            .collect();
        stream_decode(tok, &ids);
        let Ok(text) = std::str::from_utf8(data) else {
            continue;
        };
        let ids = tok
            .encode(text, false, false)
            .unwrap_or_else(|e| panic!("{name}: encode failed: {e}"));
        assert!(ids.iter().all(|&id| id < n), "{name}: id out of range");
        if *byte_level {
            assert_eq!(
                tok.decode(&ids),
                text,
                "{name}: round trip of {text:?} via {ids:?}"
            );
        }
        stream_decode(tok, &ids);
        let ids = tok
            .encode(text, true, true)
            .unwrap_or_else(|e| panic!("{name}: encode (specials) failed: {e}"));
        assert!(ids.iter().all(|&id| id < n), "{name}: id out of range");
        stream_decode(tok, &ids);
    }
}

// ---------------------------------------------------------------------------------------
// chat_template

/// Arbitrary bytes → (template source, messages): the source is the text before the first
/// NUL, then alternating role/content fields. Rendering must return Ok or Err.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default().to_string();
    let rest: Vec<&str> = parts.collect();
    let messages: Vec<Message> = rest
        .chunks(2)
        .map(|c| Message::new(c[0], *c.get(1).unwrap_or(&"")))
        .collect();
    let gen = data.first().is_some_and(|b| b & 1 == 1);
    let _ = ChatTemplate::Jinja {
        source: source.clone(),
    }
    .render(&messages, gen, "<s>", "</s>", true);
    let _ = ChatTemplate::from_metadata(Some(&source)).render(&messages, gen, "", "", false);
    let _ = ChatTemplate::ChatMl.render(&messages, gen, "<s>", "</s>", true);
    let _ = ChatTemplate::BitNet.render(&messages, gen, "<s>", "</s>", true);
}

// ---------------------------------------------------------------------------------------
// server_request

/// The model id the request target validates against (the seeds name it).
const SERVED_MODEL: &str = "ternion";

/// Checks the shape of a validation error: a 4xx status and an OpenAI error body that
/// serializes to JSON.
fn check_api_error(e: &ApiError) {
    assert!(
        e.status.is_client_error(),
        "status {} for {:?}",
        e.status,
        e.message
    );
    let body = e.body();
    assert!(body["error"]["message"].is_string(), "error body {body}");
    std::hint::black_box(serde_json::to_vec(&body).expect("error body serializes"));
}

/// Checks validated settings against the limits `settings` promises.
fn check_settings(s: &Settings) {
    assert!(
        s.stop.len() <= 16,
        "{} stop sequences accepted",
        s.stop.len()
    );
    assert!(s.max_tokens.is_none_or(|n| n >= 1), "max_tokens 0 accepted");
    assert!(
        !s.include_usage || s.stream,
        "usage chunk without streaming"
    );
    assert!(
        s.sampler.validate().is_ok(),
        "settings with an invalid sampler"
    );
}

/// Validates the shared fields against [`SERVED_MODEL`]: settings within their limits, or
/// a well-formed error.
fn check_common(common: &Common) {
    match common.settings(SERVED_MODEL, 7) {
        Ok(s) => check_settings(&s),
        Err(e) => check_api_error(&e),
    }
}

/// Arbitrary bytes → `api::parse_body` as a chat-completions and as a completions body;
/// whatever parses goes through `settings`, `messages` and `prompt`. Every outcome must
/// be `Ok` or a 4xx `ApiError`, never a panic, and what is accepted must hold the limits.
pub fn server_request(data: &[u8]) {
    match parse_body::<ChatRequest>(data) {
        Ok(req) => {
            check_common(&req.common);
            match req.messages() {
                Ok(msgs) => assert_eq!(msgs.len(), req.messages.len()),
                Err(e) => check_api_error(&e),
            }
        }
        Err(e) => check_api_error(&e),
    }
    match parse_body::<CompletionRequest>(data) {
        Ok(req) => {
            check_common(&req.common);
            match req.prompt() {
                Ok(Prompt::Text(t)) => assert!(t.len() <= data.len()),
                Ok(Prompt::Tokens(ids)) => assert!(ids.len() <= data.len()),
                Err(e) => check_api_error(&e),
            }
        }
        Err(e) => check_api_error(&e),
    }
}

#[cfg(test)]
mod tests {
    //! Replays `corpus/<target>/*` and `artifacts/<target>/*` through each target: the
    //! stable-Rust fallback for machines where cargo-fuzz cannot run.

    fn replay(target: &str, f: fn(&[u8])) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut n = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(rd) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            let mut paths: Vec<_> = rd.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths {
                let bytes = std::fs::read(&p).unwrap();
                eprintln!("{target}: {}", p.display());
                f(&bytes);
                n += 1;
            }
        }
        eprintln!("{target}: replayed {n} inputs");
    }

    #[test]
    fn replay_gguf_reader() {
        replay("gguf_reader", super::gguf_reader);
    }

    #[test]
    fn replay_quant_blocks() {
        replay("quant_blocks", super::quant_blocks);
    }

    #[test]
    fn replay_tokenizer() {
        replay("tokenizer", super::tokenizer);
    }

    #[test]
    fn replay_chat_template() {
        replay("chat_template", super::chat_template);
    }

    #[test]
    fn replay_server_request() {
        replay("server_request", super::server_request);
    }
}
