//! Log-probabilities in OpenAI's answer shapes: chat's `{"content": [{token, logprob,
//! bytes, top_logprobs}]}` and the completions' `{tokens, token_logprobs, top_logprobs,
//! text_offset}`.

use serde_json::{json, Map, Value};
use ternion::sample::TokenLogprobs;
use ternion::tokenizer::Tokenizer;

/// The log-probability OpenAI reports for an impossible token (JSON has no -inf).
const FLOOR: f32 = -9999.0;

fn finite(lp: f32) -> f32 {
    lp.max(FLOOR)
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.token_bytes(id)).into_owned()
}

fn chat_one(tok: &Tokenizer, id: u32, lp: f32) -> Value {
    json!({
        "token": token_text(tok, id),
        "logprob": finite(lp),
        "bytes": tok.token_bytes(id),
    })
}

/// Chat's `logprobs` object for the tokens `lps`.
pub(crate) fn chat(tok: &Tokenizer, lps: &[TokenLogprobs]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|t| {
            let mut v = chat_one(tok, t.id, t.logprob);
            v["top_logprobs"] = t
                .top
                .iter()
                .map(|&(id, lp)| chat_one(tok, id, lp))
                .collect();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions' `logprobs` object for the tokens `lps`, whose text starts at byte
/// `offset` of the completion.
pub(crate) fn completion(tok: &Tokenizer, lps: &[TokenLogprobs], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for t in lps {
        let text = token_text(tok, t.id);
        offsets.push(offset);
        offset += text.len();
        tokens.push(text);
        token_logprobs.push(finite(t.logprob));
        let alts: Map<String, Value> = t
            .top
            .iter()
            .map(|&(id, lp)| (token_text(tok, id), json!(finite(lp))))
            .collect();
        top.push(alts);
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}
