//! Structured output for `ternion run` and `chat` (each reply): a JSON schema, any JSON
//! object, a regular expression or a Lark grammar, compiled into the token mask of every
//! draw; `bench-serve` sends the same as a request's fields.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use ternion::constrain::{GrammarSpec, Grammars};
use ternion::session::Session;
use ternion::tokenizer::Tokenizer;

/// At most one of these constrains the output.
#[derive(Args)]
pub struct ConstrainArgs {
    /// The output is JSON valid under the JSON schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json_object", "regex", "grammar"])]
    json_schema: Option<PathBuf>,
    /// The output is a JSON object.
    #[arg(long, conflicts_with_all = ["regex", "grammar"])]
    json_object: bool,
    /// The output fully matches this regular expression.
    #[arg(long, value_name = "REGEX", conflicts_with = "grammar")]
    regex: Option<String>,
    /// The output is in the language of the Lark grammar in FILE (llguidance's dialect).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

fn read(path: &PathBuf) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

impl ConstrainArgs {
    /// The grammar asked for, if any.
    fn spec(&self) -> Result<Option<GrammarSpec>> {
        if let Some(p) = &self.json_schema {
            let schema = serde_json::from_str(&read(p)?)
                .with_context(|| format!("{} is not JSON", p.display()))?;
            return Ok(Some(GrammarSpec::JsonSchema(schema)));
        }
        if self.json_object {
            return Ok(Some(GrammarSpec::JsonObject));
        }
        if let Some(rx) = &self.regex {
            return Ok(Some(GrammarSpec::Regex(rx.clone())));
        }
        match &self.grammar {
            Some(p) => Ok(Some(GrammarSpec::Lark(read(p)?))),
            None => Ok(None),
        }
    }

    /// The grammar asked for (if any), ready to compile for `tok` and logits rows of
    /// `n_vocab`.
    pub fn constrainer(&self, tok: &Tokenizer, n_vocab: usize) -> Result<Option<Constrainer>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let grammars = Grammars::new(tok, n_vocab)?;
        // Compiled once here so that a bad grammar is reported before any generation.
        grammars.compile(&spec)?;
        Ok(Some(Constrainer { grammars, spec }))
    }

    /// Compiles the grammar (if any) for `tok` and logits rows of `n_vocab`, and sets it
    /// on `session`'s next generation.
    pub fn apply(&self, session: &mut Session<'_>, tok: &Tokenizer, n_vocab: usize) -> Result<()> {
        if let Some(c) = self.constrainer(tok, n_vocab)? {
            c.apply(session)?;
        }
        Ok(())
    }

    /// The fields of a request asking the server for the same output: `response_format`
    /// (a strict JSON schema or `json_object`), or the `regex` / `grammar` extensions.
    pub fn request_fields(&self) -> Result<Map<String, Value>> {
        let (key, value) = match self.spec()? {
            None => return Ok(Map::new()),
            Some(GrammarSpec::JsonSchema(schema)) => (
                "response_format",
                json!({"type": "json_schema",
                       "json_schema": {"name": "output", "schema": schema, "strict": true}}),
            ),
            Some(GrammarSpec::JsonObject) => ("response_format", json!({"type": "json_object"})),
            Some(GrammarSpec::Regex(rx)) => ("regex", json!(rx)),
            Some(GrammarSpec::Lark(g)) => ("grammar", json!(g)),
        };
        Ok(Map::from_iter([(key.to_owned(), value)]))
    }
}

/// A grammar compiled anew for each generation it constrains.
pub struct Constrainer {
    grammars: Grammars,
    spec: GrammarSpec,
}

impl Constrainer {
    /// Sets the grammar on `session`'s next generation.
    pub fn apply(&self, session: &mut Session<'_>) -> Result<()> {
        session.set_constraint(Box::new(self.grammars.compile(&self.spec)?));
        Ok(())
    }
}
