//! Writes the seed corpora into `fuzz/corpus/<target>/` (small files, no model weights):
//! `cargo run --release --no-default-features --example make_seeds` from `fuzz/`.
//! Seeds are then minimised with `cargo fuzz cmin`.

use std::path::{Path, PathBuf};

use ternion::gguf::{GgufWriter, Value, ValueType};
use ternion::quant::{self, GgmlType};

fn corpus(target: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_gguf(w: &GgufWriter, data: Vec<Vec<u8>>) -> Vec<u8> {
    let p = std::env::temp_dir().join(format!("ternion-seed-{}.bin", std::process::id()));
    w.write_with(&p, data).unwrap();
    let b = std::fs::read(&p).unwrap();
    std::fs::remove_file(&p).unwrap();
    b
}

fn bytes_of(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every metadata type and one tiny tensor of each dequantizable type.
fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::Str("llama".into()))
        .add("general.alignment", Value::U32(32))
        .add("a.u8", Value::U8(1))
        .add("a.i8", Value::I8(-1))
        .add("a.u16", Value::U16(2))
        .add("a.i16", Value::I16(-2))
        .add("a.u32", Value::U32(3))
        .add("a.i32", Value::I32(-3))
        .add("a.f32", Value::F32(1.5))
        .add("a.bool", Value::Bool(true))
        .add("a.u64", Value::U64(4))
        .add("a.i64", Value::I64(-4))
        .add("a.f64", Value::F64(2.5))
        .add_strings("a.strs", &["x", "", "yz"])
        .add(
            "a.nested",
            Value::Array(
                ValueType::Array,
                vec![Value::Array(ValueType::U8, vec![Value::U8(7)])],
            ),
        );
    let types = [
        (GgmlType::F32, 4u64),
        (GgmlType::F16, 4),
        (GgmlType::BF16, 4),
        (GgmlType::Q4_0, 32),
        (GgmlType::Q8_0, 32),
        (GgmlType::Q4_K, 256),
        (GgmlType::Q6_K, 256),
        (GgmlType::TQ1_0, 256),
        (GgmlType::TQ2_0, 256),
        (GgmlType::I2_S, 128),
    ];
    let mut data = Vec::new();
    for (i, (ty, n)) in types.iter().enumerate() {
        w.declare(&format!("t{i}"), *ty, &[*n, 1]).unwrap();
        data.push(bytes_of(
            ty.tensor_bytes(&[*n, 1]).unwrap() as usize,
            i as u8,
        ));
    }
    write_gguf(&w, data)
}

/// A one-block BitNet b1.58 model, width 128, with a 4-token SPM vocabulary.
fn micro_model(arch: &str) -> Vec<u8> {
    let (d, ff, nv) = (128u64, 128u64, 4u64);
    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    w.add("general.architecture", Value::Str(arch.into()))
        .add(&k("context_length"), Value::U32(64))
        .add(&k("embedding_length"), Value::U32(d as u32))
        .add(&k("block_count"), Value::U32(1))
        .add(&k("feed_forward_length"), Value::U32(ff as u32))
        .add(&k("attention.head_count"), Value::U32(1))
        .add(&k("attention.head_count_kv"), Value::U32(1))
        .add(&k("rope.freq_base"), Value::F32(10000.0))
        .add(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .add("tokenizer.ggml.model", Value::Str("llama".into()))
        .add_strings(
            "tokenizer.ggml.tokens",
            &["<unk>", "<s>", "</s>", "\u{2581}a"],
        )
        .add(
            "tokenizer.ggml.scores",
            Value::Array(ValueType::F32, vec![Value::F32(0.0); 4]),
        )
        .add(
            "tokenizer.ggml.token_type",
            Value::Array(
                ValueType::I32,
                vec![Value::I32(2), Value::I32(3), Value::I32(3), Value::I32(1)],
            ),
        )
        .add(
            "tokenizer.chat_template",
            Value::Str("{% for m in messages %}{{ m.content }}{% endfor %}".into()),
        );
    let mut data = Vec::new();
    let mut t = |w: &mut GgufWriter, name: &str, ty: GgmlType, shape: &[u64]| {
        w.declare(name, ty, shape).unwrap();
        let n = ty.tensor_bytes(shape).unwrap() as usize;
        let mut b = vec![0u8; n];
        match ty {
            GgmlType::F32 => {
                let v: Vec<f32> = (0..n / 4).map(|i| 1.0 + (i % 7) as f32 / 16.0).collect();
                quant::float::quantize_row_f32(&v, &mut b);
            }
            GgmlType::I2_S => {
                let v: Vec<f32> = (0..(n - 32) * 4).map(|i| ((i % 3) as f32) - 1.0).collect();
                quant::i2s::quantize_tensor(&v, &mut b);
            }
            _ => unreachable!(),
        }
        data.push(b);
    };
    t(&mut w, "token_embd.weight", GgmlType::F32, &[d, nv]);
    for (name, ty, shape) in [
        ("attn_norm", GgmlType::F32, vec![d]),
        ("attn_q", GgmlType::I2_S, vec![d, d]),
        ("attn_k", GgmlType::I2_S, vec![d, d]),
        ("attn_v", GgmlType::I2_S, vec![d, d]),
        ("attn_sub_norm", GgmlType::F32, vec![d]),
        ("attn_output", GgmlType::I2_S, vec![d, d]),
        ("ffn_norm", GgmlType::F32, vec![d]),
        ("ffn_gate", GgmlType::I2_S, vec![d, ff]),
        ("ffn_up", GgmlType::I2_S, vec![d, ff]),
        ("ffn_sub_norm", GgmlType::F32, vec![ff]),
        ("ffn_down", GgmlType::I2_S, vec![ff, d]),
    ] {
        t(&mut w, &format!("blk.0.{name}.weight"), ty, &shape);
    }
    t(&mut w, "output_norm.weight", GgmlType::F32, &[d]);
    write_gguf(&w, data)
}

fn main() {
    let g = corpus("gguf_reader");
    std::fs::write(g.join("sample"), sample()).unwrap();
    std::fs::write(g.join("micro-bitnet-b1.58"), micro_model("bitnet-b1.58")).unwrap();
    std::fs::write(g.join("micro-bitnet"), micro_model("bitnet")).unwrap();
    std::fs::write(
        g.join("synthetic-vocab"),
        ternion_fuzz::synthetic_vocab_bytes(),
    )
    .unwrap();

    let q = corpus("quant_blocks");
    let sizes: [(u8, usize); 9] = [
        (0, 64),
        (1, 64),
        (2, 36),
        (6, 68),
        (10, 288),
        (12, 420),
        (19, 64),
        (20, 108),
        (22, 132),
    ];
    for (sel, n) in sizes {
        let mut b = vec![sel, 64, 0, 0];
        b.extend(bytes_of(n + 32, sel));
        std::fs::write(q.join(format!("type-{sel}")), b).unwrap();
    }

    let t = corpus("tokenizer");
    let inp = ternion_fuzz::vocab_dir().join("ggml-vocab-llama3.gguf.inp");
    let mut texts: Vec<String> = vec![
        "Hello world".into(),
        " <|eot_id|><|begin_of_text|> x".into(),
        "ünïcödé 🦀 日本語 \u{0}\t\r\n  123456789".into(),
    ];
    if let Ok(s) = std::fs::read_to_string(inp) {
        texts.extend(s.split("\n__ggml_vocab_test__\n").map(str::to_string));
    }
    for (i, s) in texts.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        std::fs::write(t.join(format!("text-{i:02}")), s).unwrap();
    }

    let c = corpus("chat_template");
    let msgs = "\0system\0Be brief.\0user\0Hi <|eot_id|>\0assistant\0Hello!\0user\0Again";
    let templates = [
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        "{{ bos_token }}{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m | tojson(indent=2) }}{% endfor %}{{ ns.n }}{{ strftime_now('%Y-%m-%d') }}",
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('no system') }}{% endif %}{{ messages | map(attribute='content') | join(', ') | upper }}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(10) }}{{ 'ab' * 3 }}{{ range(5) | list }}",
        "BITNET",
    ];
    for (i, tpl) in templates.iter().enumerate() {
        std::fs::write(c.join(format!("tpl-{i}")), format!("{tpl}{msgs}")).unwrap();
    }
}
