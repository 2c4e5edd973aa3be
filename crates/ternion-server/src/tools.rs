//! Tool calls in OpenAI's shape: the `tools` and `tool_choice` of a chat request, the
//! prompt that offers them, the grammar that forces a call (`required` or a named
//! function), and the `tool_calls` read back from the output.
//!
//! A call is written by the model as one JSON object `{"name": ..., "arguments": {...}}`
//! (optionally inside `<tool_call>...</tool_call>`, as Hermes-style templates ask;
//! `parameters` is read as `arguments`, as Llama 3.1's template asks). Templates that render
//! `tools` themselves get them; for the others the tools and that format are described in
//! a system message.

use serde::Deserialize;
use serde_json::{json, Value};
use ternion::chat::{ChatTemplate, Message};
use ternion::constrain::GrammarSpec;

use crate::api::ApiError;

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    /// Only "function".
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: Function,
}

/// A function the model may call.
#[derive(Debug, Clone, Deserialize)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON schema of its arguments (default: any object).
    pub parameters: Option<Value>,
}

/// How the request lets the model use its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// The model answers in text or with a call, as it likes.
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this function.
    Named(String),
}

/// The tools of a request that offers some (`tool_choice` other than "none").
#[derive(Debug, Clone)]
pub struct Tools {
    /// The functions.
    pub tools: Vec<Tool>,
    /// How they may be used.
    pub choice: Choice,
}

fn bad(message: String, param: &'static str) -> ApiError {
    ApiError::bad_request(message, Some(param)).with_code("invalid_value")
}

impl Tools {
    /// Checks `tools` and `tool_choice`; `None` when no tool is offered (none given, or
    /// `tool_choice: "none"`).
    pub fn parse(tools: Option<&Value>, choice: Option<&Value>) -> Result<Option<Tools>, ApiError> {
        let tools: Vec<Tool> = match tools {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|e| bad(format!("invalid tools: {e}"), "tools"))?,
        };
        if let Some(t) = tools.iter().find(|t| t.kind != "function") {
            return Err(bad(
                format!("tool type '{}' is not supported; only 'function'", t.kind),
                "tools",
            ));
        }
        let choice = match choice {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => return Ok(None),
                "auto" => Choice::Auto,
                "required" => Choice::Required,
                other => {
                    return Err(bad(
                        format!("tool_choice '{other}' is not one of none, auto, required"),
                        "tool_choice",
                    ))
                }
            },
            Some(v) => {
                let name = v["function"]["name"].as_str().ok_or_else(|| {
                    bad(
                        format!("tool_choice must be a string or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"),
                        "tool_choice",
                    )
                })?;
                if !tools.iter().any(|t| t.function.name == name) {
                    return Err(bad(
                        format!("tool_choice names '{name}', which is not among the tools"),
                        "tool_choice",
                    ));
                }
                Choice::Named(name.to_owned())
            }
        };
        if tools.is_empty() {
            return match choice {
                Choice::Auto => Ok(None),
                _ => Err(bad("tool_choice needs tools".into(), "tool_choice")),
            };
        }
        Ok(Some(Tools { tools, choice }))
    }

    /// The JSON schema of one call to `f`.
    fn call_schema(f: &Function) -> Value {
        let params = f
            .parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object"}));
        json!({
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        })
    }

    /// The grammar that forces a call: `required` (any of the tools) or a named one;
    /// `None` for `auto`.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        let schemas: Vec<Value> = self
            .tools
            .iter()
            .filter(|t| match &self.choice {
                Choice::Auto => false,
                Choice::Required => true,
                Choice::Named(n) => &t.function.name == n,
            })
            .map(|t| Tools::call_schema(&t.function))
            .collect();
        match schemas.len() {
            0 => None,
            1 => Some(GrammarSpec::JsonSchema(schemas[0].clone())),
            _ => Some(GrammarSpec::JsonSchema(json!({"anyOf": schemas}))),
        }
    }

    /// The `tools` array as the template sees it.
    pub fn as_json(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.function.name,
                        "description": t.function.description,
                        "parameters": t.function.parameters,
                    }})
                })
                .collect(),
        )
    }

    /// Adds the tool description to `messages` when `template` does not render tools: a
    /// system message (merged into a leading one) listing them and the call format.
    pub fn describe(&self, template: &ChatTemplate, messages: &mut Vec<Message>) {
        if template.renders_tools() {
            return;
        }
        let text = format!(
            "You can call these functions:\n{}\nTo call one, answer with only a JSON object \
             {{\"name\": <function name>, \"arguments\": <arguments object>}}.",
            self.as_json()
        );
        match messages.first_mut() {
            Some(m) if m.role == "system" => {
                m.content.push_str("\n\n");
                m.content.push_str(&text);
            }
            _ => messages.insert(0, Message::new("system", text)),
        }
    }

    /// The call in `text`, when the whole output is one (see the module docs) naming one
    /// of the tools: `(name, arguments as JSON text)`.
    pub fn parse_call(&self, text: &str) -> Option<(String, String)> {
        let t = text.trim();
        let t = t
            .strip_prefix("<tool_call>")
            .and_then(|r| r.trim_end().strip_suffix("</tool_call>"))
            .unwrap_or(t)
            .trim();
        let v: Value = serde_json::from_str(t).ok()?;
        let name = v.get("name")?.as_str()?;
        if !self.tools.iter().any(|t| t.function.name == name) {
            return None;
        }
        let args = v.get("arguments").or_else(|| v.get("parameters"))?;
        if !args.is_object() {
            return None;
        }
        Some((name.to_owned(), args.to_string()))
    }
}

/// Fits messages of the tool protocol to `template`: an assistant turn's `tool_calls`
/// become its text where the template does not render them, and `tool` results become
/// user turns in BitNet's format (which has no such role).
pub fn adapt(template: &ChatTemplate, messages: &mut [Message]) {
    let renders_calls =
        matches!(template, ChatTemplate::Jinja { source } if source.contains("tool_calls"));
    for m in messages {
        if let Some(calls) = &m.tool_calls {
            if !renders_calls && m.content.is_empty() {
                m.content = calls_as_text(calls);
            }
        }
        if m.role == "tool" && *template == ChatTemplate::BitNet {
            m.role = "user".into();
            m.content = format!("Function result: {}", m.content);
        }
    }
}

/// OpenAI's `tool_calls` array for one call.
pub fn tool_calls(id: &str, name: &str, arguments: &str) -> Value {
    json!([{
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }])
}

/// An assistant message's `tool_calls` as text, for templates that do not render them:
/// the call objects in the format the model is asked to write.
pub fn calls_as_text(calls: &Value) -> String {
    let objs: Vec<Value> = calls
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = &c["function"];
            let args = f["arguments"]
                .as_str()
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or_else(|| f["arguments"].clone());
            json!({"name": f["name"], "arguments": args})
        })
        .collect();
    match objs.as_slice() {
        [one] => one.to_string(),
        _ => Value::Array(objs).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}])
    }

    #[test]
    fn choices_grammars_and_calls() {
        let t = weather();
        assert!(Tools::parse(Some(&t), Some(&json!("none")))
            .unwrap()
            .is_none());
        let auto = Tools::parse(Some(&t), None).unwrap().unwrap();
        assert_eq!(auto.choice, Choice::Auto);
        assert_eq!(auto.grammar(), None);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let n = Tools::parse(Some(&t), Some(&named)).unwrap().unwrap();
        assert!(matches!(n.grammar(), Some(GrammarSpec::JsonSchema(_))));
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert!(Tools::parse(Some(&t), Some(&other)).is_err());
        assert!(Tools::parse(None, Some(&json!("required"))).is_err());
        assert_eq!(
            auto.parse_call("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"),
            Some(("get_weather".into(), "{\"city\":\"Oslo\"}".into()))
        );
        assert_eq!(
            auto.parse_call("{\"name\": \"other\", \"arguments\": {}}"),
            None
        );
        assert_eq!(auto.parse_call("Sunny."), None);
        let calls = tool_calls("call_1", "get_weather", "{\"city\":\"Oslo\"}");
        assert_eq!(
            calls_as_text(&calls),
            "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"
        );
    }
}
