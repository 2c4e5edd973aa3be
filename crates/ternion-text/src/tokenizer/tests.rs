use super::*;
use crate::gguf::{GgufWriter, Value, ValueType};
use crate::test_shared::{shared_path, vectors};

fn load_with(name: &str, opts: &TokenizerOptions) -> Tokenizer {
    let path = shared_path(&format!("vocab/ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&file, opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(name: &str) -> Tokenizer {
    load_with(name, &TokenizerOptions::default())
}

fn check_vectors(name: &str) {
    let tok = load(name);
    let cases = vectors(name);
    let mut failed = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            failed.push(format!(
                "case {i} {text:?}:\n  want {want:?}\n  got  {got:?}"
            ));
        }
    }
    println!(
        "{name}: {}/{} vectors pass",
        cases.len() - failed.len(),
        cases.len()
    );
    assert!(
        failed.is_empty(),
        "{name}: {} failed\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn vectors_llama3() {
    check_vectors("llama3");
}

#[test]
fn vectors_gpt2() {
    check_vectors("gpt-2");
}

#[test]
fn vectors_llama_spm() {
    check_vectors("llama-spm");
}

#[test]
fn vectors_phi3() {
    check_vectors("phi-3");
}

#[test]
fn bitnet_default_vs_llama3_table() {
    let forced = |p| {
        load_with(
            "llama3",
            &TokenizerOptions {
                pre: Some(p),
                pre_when_absent: PreTokenizer::Default,
            },
        )
    };
    let default = forced(PreTokenizer::Default);
    let llama3 = forced(PreTokenizer::Llama3);
    assert_eq!(default.pre_tokenizer(), Some(PreTokenizer::Default));
    assert_eq!(llama3.pre_tokenizer(), Some(PreTokenizer::Llama3));
    let table: [(&str, &[u32], &[u32]); 3] = [
        ("It's", &[2181, 6, 82], &[2181, 596]),
        ("a\n\nb", &[64, 198, 198, 65], &[64, 271, 65]),
        ("x\ttabs", &[87, 197, 32093], &[87, 3324, 3518]),
    ];
    for (text, want_default, want_llama3) in table {
        assert_eq!(
            default.encode(text, false, false).unwrap(),
            want_default,
            "{text:?}"
        );
        assert_eq!(
            llama3.encode(text, false, false).unwrap(),
            want_llama3,
            "{text:?}"
        );
    }
}

#[test]
fn llama3_metadata() {
    let tok = load("llama3");
    assert_eq!(tok.n_vocab(), 128256);
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Llama3));
    assert_eq!(tok.bos_id(), Some(128000));
    assert_eq!(tok.eot_id(), Some(128009));
    assert!(tok.add_bos());
    assert!(tok.is_eog(128009));
    assert!(tok.is_eog(128001));
    assert!(!tok.is_eog(128000));
    assert!(!tok.is_eog(9906));
    assert_eq!(tok.token_id("<|eot_id|>"), Some(128009));
    assert_eq!(tok.encode("Hello", true, false).unwrap(), [128000, 9906]);
}

#[test]
fn special_tokens_parsed_only_on_request() {
    let tok = load("llama3");
    let text = "<|begin_of_text|>Hi<|eot_id|>";
    let ids = tok.encode(text, false, true).unwrap();
    assert_eq!(ids.first(), Some(&128000));
    assert_eq!(ids.last(), Some(&128009));
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(tok.decode(&ids), text);
    let plain = tok.encode(text, false, false).unwrap();
    assert!(plain.iter().all(|&id| id < 128000), "{plain:?}");
    assert_eq!(tok.decode(&plain), text);
}

const CORPUS: &[&str] = &[
    "",
    " ",
    "Hello, world! How's it going?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\n end",
    "Привет, мир! Как дела?",
    "日本語のテキストと中文文本。",
    "한국어 텍스트 🙂 mixed with English",
    "emoji: 🦀🚀👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "مرحبا بالعالم ١٢٣٤٥",
    "Ελληνικά και ελληνικοί αριθμοί",
    "fn main() {\n    println!(\"{}\", 1234567 + 0x1F);\n}\n",
    "def f(x):\n\treturn x ** 2  # comment\n",
    "numbers 1 12 123 1234 12345 3.14159 1,000,000",
    "I'M YOU'RE WE'VE THEY'LL SHE'D it's 'quoted'",
    "\u{00a0}nbsp\u{2003}em-space\u{3000}ideographic",
    "combining: e\u{301} a\u{308} n\u{303}",
    "<|eot_id|> looks special but is text",
];

#[test]
fn round_trip_bpe() {
    for name in ["llama3", "gpt-2"] {
        for pre in [
            PreTokenizer::Llama3,
            PreTokenizer::Gpt2,
            PreTokenizer::Default,
        ] {
            let opts = TokenizerOptions {
                pre: Some(pre),
                pre_when_absent: PreTokenizer::Default,
            };
            let tok = load_with(name, &opts);
            for s in CORPUS {
                let ids = tok.encode(s, false, false).unwrap();
                assert_eq!(&tok.decode(&ids), s, "{name} {pre:?}: {ids:?}");
            }
        }
    }
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let tok = load("llama3");
    for s in ["🦀 crab, 日本語, 👩‍👩‍👧‍👦 family", "é̃ 🇫🇷 ١٢٣", "plain ascii"]
    {
        let ids = tok.encode(s, false, false).unwrap();
        let mut dec = StreamDecoder::new();
        let mut text = String::new();
        for &id in &ids {
            let part = dec.push(&tok, id);
            assert!(!part.contains('\u{fffd}'), "{s:?}: {part:?}");
            text.push_str(&part);
        }
        text.push_str(&dec.finish());
        assert_eq!(text, s);
    }
    // Some token must really split a character, or the test proves nothing.
    let ids = tok.encode("🦀", false, false).unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&tok, ids[0]), "");
    // An incomplete character left at the end is flushed lossily.
    assert_eq!(dec.finish(), "\u{fffd}");
}

#[test]
fn spm_metadata_and_decode() {
    let tok = load("llama-spm");
    assert_eq!(tok.pre_tokenizer(), None);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert!(tok.add_bos());
    let ids = tok.encode("Hello world", true, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(tok.decode(&ids[1..]), " Hello world");
    // Byte fallback: a character outside the vocabulary comes back through <0xNN> tokens.
    let s = "🦀";
    let ids = tok.encode(s, false, false).unwrap();
    assert_eq!(tok.decode(&ids), format!(" {s}"));
}

#[test]
fn long_input_is_not_quadratic() {
    let tok = load("llama3");
    let word = "a".repeat(200_000);
    let start = std::time::Instant::now();
    let ids = tok.encode(&word, false, false).unwrap();
    assert_eq!(tok.decode(&ids), word);
    let text = CORPUS.join(" ").repeat(200);
    let ids = tok.encode(&text, false, false).unwrap();
    assert_eq!(tok.decode(&ids), text);
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
}

fn tiny_gguf(build: impl FnOnce(&mut GgufWriter)) -> Result<Tokenizer> {
    tiny_gguf_with(build, &TokenizerOptions::default())
}

fn tiny_gguf_with(
    build: impl FnOnce(&mut GgufWriter),
    opts: &TokenizerOptions,
) -> Result<Tokenizer> {
    let mut w = GgufWriter::new();
    build(&mut w);
    let dir = ternion_testkit::scratch::dir("ternion-tok");
    let path = dir.join(format!("{:?}.gguf", std::thread::current().id()));
    w.write_with(&path, Vec::new()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    Tokenizer::from_gguf(&file, opts)
}

fn str_value(s: &str) -> Value {
    Value::Str(s.to_owned())
}

#[test]
fn missing_tokens_array_is_an_error() {
    let err = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("gpt2"));
        w.add_strings("tokenizer.ggml.merges", &["a b"]);
    })
    .err()
    .expect("must fail");
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.to_string().contains("tokenizer.ggml.tokens")),
        "{err}"
    );
}

#[test]
fn bad_metadata_is_an_error() {
    let err = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("gpt2"));
        w.add_strings("tokenizer.ggml.tokens", &["a", "b"]);
    })
    .err()
    .expect("no merges");
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.to_string().contains("merges")),
        "{err}"
    );
    let err = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("gpt2"));
        w.add("tokenizer.ggml.pre", str_value("no-such-pre"));
        w.add_strings("tokenizer.ggml.tokens", &["a", "b"]);
        w.add_strings("tokenizer.ggml.merges", &["a b"]);
    })
    .err()
    .expect("unknown pre");
    assert!(
        matches!(&err, Error::Formats(ternion_formats::Error::Unsupported { what, found, supported, .. })
            if what == "tokenizer.ggml.pre" && found == "no-such-pre"
                && supported.iter().any(|s| s == "llama3")),
        "{err}"
    );
    let err = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("bert"));
        w.add_strings("tokenizer.ggml.tokens", &["a"]);
    })
    .err()
    .expect("unsupported model");
    assert!(
        matches!(&err, Error::Formats(ternion_formats::Error::Unsupported { found, supported, .. })
            if found == "bert" && supported == &["gpt2", "llama"]),
        "{err}"
    );
    let err = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("llama"));
        w.add_strings("tokenizer.ggml.tokens", &["a", "b"]);
        w.add(
            "tokenizer.ggml.scores",
            Value::Array(ValueType::F32, vec![Value::F32(0.0)]),
        );
    })
    .err()
    .expect("short scores");
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.to_string().contains("scores")),
        "{err}"
    );
}

#[test]
fn hostile_merges_and_ids_do_not_panic() {
    let tok = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("gpt2"));
        w.add("tokenizer.ggml.pre", str_value("gpt-2"));
        w.add_strings("tokenizer.ggml.tokens", &["a", "b", "ab", "c"]);
        w.add_strings(
            "tokenizer.ggml.merges",
            &[
                "a b", "x y", "nospace", " ", "  ", "ab zz", "a b", "q", "ab c",
            ],
        );
        w.add("tokenizer.ggml.bos_token_id", Value::U32(4_000_000));
        w.add("tokenizer.ggml.eos_token_id", Value::U32(3));
    })
    .unwrap();
    assert_eq!(tok.bos_id(), None);
    assert_eq!(tok.eos_id(), Some(3));
    // "abc": "a b" merges to "ab"; "ab c" merges to "abc", which is no token, so its
    // single ASCII bytes are looked up one by one.
    assert_eq!(tok.encode("ab", false, false).unwrap(), [2]);
    assert_eq!(tok.encode("abc", false, false).unwrap(), [0, 1, 3]);
    // Characters with no token at all vanish rather than panic.
    assert_eq!(tok.encode("zé", false, false).unwrap(), Vec::<u32>::new());
    assert_eq!(tok.token_bytes(99), b"");
    assert_eq!(tok.decode(&[0, 99, 1]), "ab");
    assert!(!tok.is_eog(99));
    assert!(tok.is_eog(3));
}

#[test]
fn spm_without_byte_tokens_reports_the_byte() {
    let tok = tiny_gguf(|w| {
        w.add("tokenizer.ggml.model", str_value("llama"));
        w.add_strings(
            "tokenizer.ggml.tokens",
            &["<unk>", "<s>", "</s>", "\u{2581}a"],
        );
    })
    .unwrap();
    assert_eq!(tok.encode("a", false, false).unwrap(), [3]);
    let err = tok.encode("é", false, false).unwrap_err();
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.to_string().contains("0xE2")),
        "{err}"
    );
}

#[test]
fn pre_tokenizer_splits() {
    let cases: [(PreTokenizer, &str, &[&str]); 8] = [
        (PreTokenizer::Default, " 12345 x", &[" ", "123", "45", " x"]),
        (
            PreTokenizer::Default,
            "a+b==c...",
            &["a", "+", "b", "==", "c", "..."],
        ),
        (PreTokenizer::Default, "It's", &["It", "'", "s"]),
        (
            PreTokenizer::Gpt2,
            "It's  fine\n\n",
            &["It", "'s", " ", " fine", "\n\n"],
        ),
        (PreTokenizer::Gpt2, "I'M", &["I", "'", "M"]),
        (
            PreTokenizer::Llama3,
            "I'M 1234567",
            &["I", "'M", " ", "123", "456", "7"],
        ),
        (PreTokenizer::Llama3, "a \n\n b", &["a", " \n\n", " b"]),
        (
            PreTokenizer::Llama3,
            "x  ...\n\ty",
            &["x", " ", " ...\n", "\ty"],
        ),
    ];
    for (pre, text, want) in cases {
        assert_eq!(pretokenize::split(pre, text), want, "{pre:?} {text:?}");
    }
}

#[test]
fn absent_pre_uses_the_option() {
    let build = |w: &mut GgufWriter| {
        w.add("tokenizer.ggml.model", str_value("gpt2"));
        w.add_strings("tokenizer.ggml.tokens", &["a", "b"]);
        w.add_strings("tokenizer.ggml.merges", &["a b"]);
    };
    let tok = tiny_gguf(build).unwrap();
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Default));
    assert!(!tok.add_bos());
    let opts = TokenizerOptions {
        pre: None,
        pre_when_absent: PreTokenizer::Llama3,
    };
    let tok = tiny_gguf_with(build, &opts).unwrap();
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Llama3));
    assert!(tok.add_bos());
}

#[test]
fn phi3_special_tokens_drop_the_white_space_after_them() {
    let tok = load("phi-3");
    let enc = |t: &str| tok.encode(t, false, true).unwrap();
    // As llama.cpp: `<|user|>` and `<|end|>` carry RSTRIP in Phi-3 files.
    assert_eq!(
        enc("<|user|>\nHi there<|end|>\n<|assistant|>\n"),
        enc("<|user|>Hi there<|end|><|assistant|>")
    );
    assert_eq!(enc("<|end|> \t\n x"), enc("<|end|>x"));
    // `<|endoftext|>` keeps what follows; white space before a token is kept.
    assert_ne!(enc("<|endoftext|>\nHi"), enc("<|endoftext|>Hi"));
    assert_ne!(enc("Hi \n<|end|>"), enc("Hi<|end|>"));
    // Without special parsing the marker is text and nothing is dropped.
    let plain = |t: &str| tok.encode(t, false, false).unwrap();
    assert_ne!(plain("<|user|>\nHi"), plain("<|user|>Hi"));
}
