//! Structured output: JSON schemas, "any JSON object", regular expressions and Lark
//! grammars compiled by llguidance into a token mask per step ([`Grammar`], a
//! [`Constraint`] for the stepper). [`Grammars`] holds what every grammar of one
//! vocabulary shares (the token trie), built once per model.
//!
//! JSON closes within the token budget: when at most [`WRAP_UP`] tokens are left, a JSON
//! grammar allows only tokens made of `"`, `]` and `}` (and the end) wherever it allows
//! any, so open strings, arrays and objects close; a value the grammar still needs is drawn
//! from the whole mask. An answer shortened this way ends as `Length`.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::generate::{Constraint, Mask};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `json_object` mode).
    JsonObject,
    /// A JSON value valid under this JSON schema.
    JsonSchema(Value),
    /// Text fully matching this regular expression.
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
}

/// How JSON is laid out unless a schema's `x-guidance` says otherwise: `{"a": 1, "b": 2}`,
/// no other white space (a model cannot pad it without end).
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "})
}

/// Tokens left in the budget at which a JSON answer starts closing.
pub const WRAP_UP: usize = 24;

impl GrammarSpec {
    /// Whether the output is JSON.
    fn is_json(&self) -> bool {
        matches!(self, GrammarSpec::JsonObject | GrammarSpec::JsonSchema(_))
    }

    /// The llguidance grammar: JSON schemas get [`json_layout`] under their own
    /// `x-guidance` settings.
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": json_layout()}),
            ),
            GrammarSpec::JsonSchema(schema) => {
                let mut schema = schema.clone();
                if let Value::Object(map) = &mut schema {
                    let mut layout = json_layout();
                    if let Some(own) = map.get("x-guidance") {
                        llguidance::json_merge(&mut layout, own);
                    }
                    map.insert("x-guidance".into(), layout);
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The grammar compiler of one vocabulary.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    /// Tokens that only close JSON (`"`, `]`, `}`), and the end-of-generation tokens.
    closers: Arc<Vec<u32>>,
}

impl Grammars {
    /// Builds the token trie from `tok`'s token bytes for logits rows of `n_vocab`
    /// entries (ids the tokenizer lacks are never allowed). Control tokens are special
    /// (never output text); the end-of-generation tokens end a grammar's output.
    pub fn new(tok: &Tokenizer, n_vocab: usize) -> Result<Grammars> {
        let n = n_vocab.max(tok.n_vocab());
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let bytes = tok.token_bytes(id);
                if tok.is_control(id) && !bytes.is_empty() {
                    [&[TokTrie::SPECIAL_TOKEN_MARKER], bytes].concat()
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let eog: Vec<u32> = (0..n as u32).filter(|&id| tok.is_eog(id)).collect();
        let Some(&first) = eog.first() else {
            return Err(Error::Request(
                "structured output needs an end-of-generation token; the vocabulary has none"
                    .into(),
            ));
        };
        let mut closers = vec![0u32; n.div_ceil(32)];
        for (id, w) in words.iter().enumerate() {
            let closes = !w.is_empty() && w.iter().all(|b| b"\"]}".contains(b));
            if closes || eog.contains(&(id as u32)) {
                closers[id / 32] |= 1 << (id % 32);
            }
        }
        let info = TokRxInfo::new(n as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Request(format!("building the grammar engine: {e}")))?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
            closers: Arc::new(closers),
        })
    }

    /// Compiles `spec`; a malformed schema, regex or grammar is an [`Error::Request`]
    /// saying what llguidance found.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar> {
        let parser = self
            .factory
            .create_parser(spec.top_level())
            .map_err(|e| Error::Request(format!("invalid grammar: {e}")))?;
        Ok(Grammar {
            matcher: Matcher::new(Ok(parser)),
            mask: Vec::new(),
            closers: spec.is_json().then(|| self.closers.clone()),
            shortened: false,
        })
    }
}

/// One sequence's grammar state.
pub struct Grammar {
    matcher: Matcher,
    mask: Vec<u32>,
    /// JSON's closing tokens (see the module docs); `None` for other grammars.
    closers: Option<Arc<Vec<u32>>>,
    /// Whether the closing tokens narrowed a mask.
    shortened: bool,
}

impl Constraint for Grammar {
    fn mask(&mut self, left: usize) -> std::result::Result<&Mask, String> {
        let m = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        self.mask.clear();
        self.mask.extend_from_slice(m.as_slice());
        if let Some(closers) = self.closers.as_deref().filter(|_| left <= WRAP_UP) {
            let both: Vec<u32> = (self.mask.iter().enumerate())
                .map(|(i, a)| a & closers.get(i).copied().unwrap_or(0))
                .collect();
            if both.iter().any(|&w| w != 0) {
                self.shortened |= both != self.mask;
                self.mask = both;
            }
        }
        Ok(&self.mask)
    }

    fn shortened(&self) -> bool {
        self.shortened
    }

    fn commit(&mut self, id: u32) -> std::result::Result<bool, String> {
        self.matcher
            .consume_token(id)
            .map_err(|e| format!("the grammar rejected token {id}: {e}"))?;
        Ok(self.matcher.is_stopped())
    }
}

#[cfg(test)]
mod tests;
