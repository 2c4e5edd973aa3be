//! Grammars over the synthetic byte vocabulary, stepped with random logits.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::*;
use crate::generate::{FinishReason, Row, Stepper, StepperOptions};
use crate::sample::{Sampler, SamplerConfig};

/// Generates with random logits (a random-weight model's stand-in) under `spec`; returns
/// the text and why it ended.
fn generate(
    g: &Grammars,
    tok: &Tokenizer,
    spec: &GrammarSpec,
    seed: u64,
) -> (String, FinishReason) {
    generate_within(g, tok, spec, seed, 2000)
}

/// [`generate`] with a budget of `max_tokens`.
fn generate_within(
    g: &Grammars,
    tok: &Tokenizer,
    spec: &GrammarSpec,
    seed: u64,
    max_tokens: usize,
) -> (String, FinishReason) {
    let cfg = SamplerConfig {
        temperature: 1.0,
        seed,
        ..SamplerConfig::greedy()
    };
    let mut s = Stepper::new(
        Sampler::new(cfg).unwrap(),
        (),
        Vec::new(),
        vec![256],
        StepperOptions {
            max_tokens,
            ignore_eos: false,
            stop: Vec::new(),
            n_ctx: 4096,
            max_chunk: 512,
        },
    )
    .with_constraint(Box::new(g.compile(spec).unwrap()));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut text = String::new();
    loop {
        assert!(s.plan(&mut usize::MAX.clone()));
        let logits: Vec<f32> = (0..259).map(|_| rng.random::<f32>() * 8.0).collect();
        let adv = s.advance(Row::Logits(&logits), tok);
        text.push_str(adv.text.as_deref().unwrap_or(""));
        if let Some(end) = adv.end {
            assert_eq!(end.error, None);
            text.push_str(&end.text);
            return (text, end.finish);
        }
    }
}

#[test]
fn json_schema_output_is_valid_for_random_logits() {
    let tok = crate::synth::byte_tokenizer();
    let g = Grammars::new(&tok, 259).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false,
    });
    for seed in 0..8 {
        let (text, finish) = generate(&g, &tok, &GrammarSpec::JsonSchema(schema.clone()), seed);
        assert_eq!(finish, FinishReason::Stop, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["name", "age", "tags"], "{text}");
        assert!(v["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!(v["age"].as_u64().unwrap() <= 150, "{text}");
        let tags = v["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 3 && tags.iter().all(|t| t == "a" || t == "b"),
            "{text}"
        );
    }
}

#[test]
fn json_object_regex_and_lark_outputs_match() {
    let tok = crate::synth::byte_tokenizer();
    let g = Grammars::new(&tok, 259).unwrap();
    for seed in 0..4 {
        let (text, _) = generate(&g, &tok, &GrammarSpec::JsonObject, seed);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(v.is_object(), "{text}");
        let (text, finish) = generate(
            &g,
            &tok,
            &GrammarSpec::Regex("[a-c]{3}-[0-9]{2}".into()),
            seed,
        );
        assert_eq!(finish, FinishReason::Stop);
        let b = text.as_bytes();
        assert!(
            b.len() == 6 && b[..3].iter().all(|c| (b'a'..=b'c').contains(c)) && b[3] == b'-',
            "{text}"
        );
        assert!(b[4..].iter().all(u8::is_ascii_digit), "{text}");
        let lark = r#"start: ("yes" | "no") "!""#;
        let (text, _) = generate(&g, &tok, &GrammarSpec::Lark(lark.into()), seed);
        assert!(text == "yes!" || text == "no!", "{text}");
    }
}

#[test]
fn malformed_grammars_are_request_errors() {
    let tok = crate::synth::byte_tokenizer();
    let g = Grammars::new(&tok, 259).unwrap();
    let bad = [
        GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::Lark("start: undefined_rule".into()),
    ];
    for spec in bad {
        match g.compile(&spec) {
            Err(Error::Request(m)) => assert!(m.starts_with("invalid grammar"), "{m}"),
            Err(e) => panic!("{spec:?}: wrong error {e}"),
            Ok(_) => panic!("{spec:?} compiled"),
        }
    }
}

#[test]
fn json_closes_within_a_small_budget() {
    let tok = crate::synth::byte_tokenizer();
    let g = Grammars::new(&tok, 259).unwrap();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"},
        "b": {"type": "array", "items": {"type": "string"}}}, "required": ["a", "b"]});
    let mut shortened = 0;
    for seed in 0..8 {
        for spec in [
            GrammarSpec::JsonObject,
            GrammarSpec::JsonSchema(schema.clone()),
        ] {
            let (text, finish) = generate_within(&g, &tok, &spec, seed, 40);
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v.is_object(), "{text}");
            shortened += usize::from(finish == FinishReason::Length);
        }
    }
    assert!(
        shortened > 0,
        "random strings run past 40 bytes: some answers were closed early"
    );
    // Other grammars are not steered: a regex that cannot end in time is cut.
    let (text, finish) = generate_within(&g, &tok, &GrammarSpec::Regex("a{50}".into()), 1, 40);
    assert_eq!((text.len(), finish), (40, FinishReason::Length));
}
