//! Chat templates and multi-turn conversations.
//!
//! A [`ChatTemplate`] turns a list of [`Message`]s into prompt text. Three kinds exist:
//! BitNet's built-in format (selected by the "BITNET" marker its converter stores), any
//! Hugging Face Jinja template (rendered with minijinja, with HF's conventions) and ChatML,
//! llama.cpp's fallback when a model has no template.
//!
//! Rendered text never starts with the BOS token: the tokenizer adds BOS, so a leading BOS
//! text produced by a Jinja template is stripped once. Special-token texts such as
//! `<|eot_id|>` stay in the text; the caller tokenizes with special-token parsing on.
//!
//! A [`Conversation`] tracks what has already been fed to the model and hands back only the
//! new text for each user turn ([`TurnText::Append`]), or the whole text when the template
//! rewrote earlier turns ([`TurnText::Restart`]).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, ErrorKind, Value};

use crate::{jinja_budget, Error, Result};

/// Instruction budget of one Jinja render: ample for real templates over long
/// conversations, yet a runaway loop stops within a fraction of a second.
const JINJA_FUEL: u64 = 5_000_000;

/// Stack of the thread a Jinja render runs on (native builds). minijinja drops and prints
/// nested values recursively; `jinja_budget` bounds the nesting of every stored value on
/// every target (the browser's included, which has no threads), and this stack is a second
/// line of defence for native renders: even a value nested as deep as the fuel allows
/// (each level costs a few instructions, so below ~`JINJA_FUEL / 4`) fits it.
#[cfg(not(target_arch = "wasm32"))]
const RENDER_STACK_BYTES: usize = 1 << 30;

/// Nesting budget of one Jinja render (loops, conditionals, macro calls).
const JINJA_RECURSION_LIMIT: usize = 200;

/// Deepest value nesting `tojson` writes before giving up.
const TOJSON_MAX_DEPTH: usize = 64;

/// Widest `tojson` indent accepted: the indent is repeated per nesting level, so a huge
/// one (from a hostile template) would otherwise size an allocation.
const TOJSON_MAX_INDENT: usize = 256;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// "system", "user", "assistant", or another role the template knows.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How messages are turned into prompt text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplate {
    /// BitNet b1.58's built-in format (docs/FORMATS.md#bitnet-chat-format): `System: {text}`,
    /// `User: {text}<|eot_id|>Assistant: `, and the assistant's text, with no terminators.
    BitNet,
    /// A Hugging Face Jinja chat template.
    Jinja {
        /// The template source, as stored in `tokenizer.chat_template`.
        source: String,
    },
    /// ChatML (`<|im_start|>{role}\n{content}<|im_end|>\n`), llama.cpp's fallback.
    ChatMl,
}

impl ChatTemplate {
    /// Chooses the template from the GGUF `tokenizer.chat_template` value: one containing
    /// the marker "BITNET" selects [`ChatTemplate::BitNet`], any other non-blank text is
    /// [`ChatTemplate::Jinja`], and a missing or blank one falls back to ChatML.
    pub fn from_metadata(template: Option<&str>) -> ChatTemplate {
        match template {
            Some(t) if t.contains("BITNET") => ChatTemplate::BitNet,
            Some(t) if !t.trim().is_empty() => ChatTemplate::Jinja {
                source: t.to_owned(),
            },
            _ => ChatTemplate::ChatMl,
        }
    }

    /// Renders `messages` to prompt text, ending with the assistant's turn opener when
    /// `add_generation_prompt` is set. BitNet's format always opens the assistant turn
    /// after a user message, so the flag does not change it, and it accepts only the
    /// roles system, user and assistant. `bos_token` and `eos_token` are the texts of those
    /// tokens, given to Jinja templates; one leading `bos_token` in the output is stripped
    /// because the tokenizer adds BOS itself.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        match self {
            ChatTemplate::BitNet => render_bitnet(messages),
            ChatTemplate::ChatMl => Ok(render_chatml(messages, add_generation_prompt)),
            ChatTemplate::Jinja { source } => {
                let out = render_jinja(
                    source,
                    messages,
                    add_generation_prompt,
                    bos_token,
                    eos_token,
                )?;
                match out.strip_prefix(bos_token) {
                    Some(rest) if !bos_token.is_empty() => Ok(rest.to_owned()),
                    _ => Ok(out),
                }
            }
        }
    }
}

fn render_bitnet(messages: &[Message]) -> Result<String> {
    let mut out = String::new();
    for m in messages {
        match m.role.as_str() {
            "system" => write!(out, "System: {}", m.content),
            "user" => write!(out, "User: {}<|eot_id|>Assistant: ", m.content),
            "assistant" => write!(out, "{}", m.content),
            other => {
                return Err(Error::Template(format!(
                    "BitNet format has no role '{other}' (system, user, assistant)"
                )))
            }
        }
        .expect("writing to a String cannot fail");
    }
    Ok(out)
}

fn render_chatml(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// Renders a Hugging Face template: `trim_blocks` and `lstrip_blocks` on, Python string
/// methods, `raise_exception`, `strftime_now` and a Python-compatible `tojson`, with fuel,
/// recursion and byte-budget limits against hostile templates (see `jinja_budget`).
fn render_jinja(
    source: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let render = || {
        render_jinja_here(
            source,
            messages,
            add_generation_prompt,
            bos_token,
            eos_token,
        )
    };
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::thread::scope(|s| {
            let worker = std::thread::Builder::new()
                .name("jinja".into())
                .stack_size(RENDER_STACK_BYTES)
                .spawn_scoped(s, render)
                .map_err(|e| Error::Template(format!("cannot start the template renderer: {e}")))?;
            worker
                .join()
                .map_err(|_| Error::Template("the template renderer panicked".into()))?
        })
    }
    #[cfg(target_arch = "wasm32")]
    render()
}

/// [`render_jinja`] on the calling thread.
fn render_jinja_here(
    source: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_recursion_limit(JINJA_RECURSION_LIMIT);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("raise_exception: {msg}"),
            ))
        },
    );
    env.add_function("strftime_now", |fmt: String| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        strftime(&fmt, secs)
    });
    let input_bytes = messages
        .iter()
        .map(|m| m.role.len() + m.content.len())
        .sum::<usize>()
        + bos_token.len()
        + eos_token.len();
    let budget = jinja_budget::Budget::for_input(input_bytes);
    jinja_budget::install(&mut env, &budget);
    env.add_filter(
        "tojson",
        move |value: &Value, indent: Option<usize>, kwargs: Kwargs| {
            let out = tojson(value, indent, kwargs, budget.left())?;
            budget.charge(out.len())?;
            Ok::<_, minijinja::Error>(out)
        },
    );
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| {
            Value::from_iter([
                ("role", Value::from(m.role.as_str())),
                ("content", Value::from(m.content.as_str())),
            ])
        })
        .collect();
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    };
    jinja_budget::render(&mut env, source, ctx, JINJA_FUEL)
        .map_err(|e| Error::Template(e.to_string()))
}

/// Output style of [`tojson`], following Python's `json.dumps`.
struct JsonStyle {
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
    /// Longest output accepted (the render's remaining byte budget).
    max_len: usize,
}

/// The `tojson` filter as Hugging Face defines it: `json.dumps(value, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`, no HTML escaping, and at
/// most `max_len` bytes of output.
fn tojson(
    value: &Value,
    indent: Option<usize>,
    kwargs: Kwargs,
    max_len: usize,
) -> std::result::Result<String, minijinja::Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    if indent.is_some_and(|i| i > TOJSON_MAX_INDENT) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent larger than {TOJSON_MAX_INDENT}"),
        ));
    }
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) => match <[String; 2]>::try_from(seps) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        },
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        max_len,
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    if depth > TOJSON_MAX_DEPTH {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value.to_string().as_str() {
            "inf" => out.push_str("Infinity"),
            "-inf" => out.push_str("-Infinity"),
            s => out.push_str(s),
        },
        ValueKind::String => write_json_str(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), items.len(), style, depth, |out, i| {
                write_json(out, &items[i], style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let key = key.as_str().map_or_else(|| key.to_string(), str::to_owned);
                entries.push((key, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, ('{', '}'), entries.len(), style, depth, |out, i| {
                write_json_str(out, &entries[i].0, style);
                out.push_str(&style.key_sep);
                write_json(out, &entries[i].1, style, depth + 1)
            })?;
        }
        _ => write_json_str(out, &value.to_string(), style),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    style: &JsonStyle,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> std::result::Result<(), minijinja::Error>,
) -> std::result::Result<(), minijinja::Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(width) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
    };
    for i in 0..len {
        if out.len() > style.max_len {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: output larger than the render's budget",
            ));
        }
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        item(out, i)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A JSON string literal escaped as Python's `json.dumps` does.
fn write_json_str(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").expect("writing to a String cannot fail");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Formats the UTC time `unix_secs` with a C `strftime` format. Supports `%Y %y %m %d %e
/// %H %I %M %S %p %j %a %A %b %B %h %F %T %%`; anything else is an error.
fn strftime(fmt: &str, unix_secs: i64) -> std::result::Result<String, minijinja::Error> {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = DAYS[(days + 3).rem_euclid(7) as usize];
    let month_name = MONTHS[month as usize - 1];
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = chars.next();
        let w = match spec {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{hour12:02}"),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('j') => write!(out, "{yday:03}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('b') | Some('h') => write!(out, "{}", &month_name[..3]),
            Some('B') => write!(out, "{month_name}"),
            Some('F') => write!(out, "{year}-{month:02}-{day:02}"),
            Some('T') => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            Some('%') => write!(out, "%"),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported directive %{}",
                        other.map_or_else(String::new, String::from)
                    ),
                ))
            }
        };
        w.expect("writing to a String cannot fail");
    }
    Ok(out)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The text to feed the model for a new user turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnText {
    /// Extend the existing KV cache with this text.
    Append(String),
    /// The template changed text that was already fed: clear the KV cache and prefill
    /// this whole text.
    Restart(String),
}

/// A multi-turn chat: the messages so far and the exact text already fed to the model.
#[derive(Debug, Clone)]
pub struct Conversation {
    template: ChatTemplate,
    bos_token: String,
    eos_token: String,
    messages: Vec<Message>,
    fed: String,
}

impl Conversation {
    /// Starts a conversation, with `system` as its first message when given.
    pub fn new(
        template: ChatTemplate,
        bos_token: String,
        eos_token: String,
        system: Option<String>,
    ) -> Self {
        Conversation {
            template,
            bos_token,
            eos_token,
            messages: system
                .into_iter()
                .map(|s| Message::new("system", s))
                .collect(),
            fed: String::new(),
        }
    }

    /// Adds a user message and returns the text to feed next: the whole history is
    /// rendered with the generation prompt, and when the text fed so far (earlier renders
    /// plus the assistant replies as generated) is a prefix of it, only the rest is
    /// returned. On a template error the message is not kept.
    pub fn add_user(&mut self, text: &str) -> Result<TurnText> {
        self.messages.push(Message::new("user", text));
        let full =
            match self
                .template
                .render(&self.messages, true, &self.bos_token, &self.eos_token)
            {
                Ok(full) => full,
                Err(e) => {
                    self.messages.pop();
                    return Err(e);
                }
            };
        let turn = match full.strip_prefix(self.fed.as_str()) {
            Some(delta) => TurnText::Append(delta.to_owned()),
            None => TurnText::Restart(full.clone()),
        };
        self.fed = full;
        Ok(turn)
    }

    /// Records the model's reply exactly as generated and fed (without the end-of-turn
    /// token that stopped generation).
    pub fn add_assistant(&mut self, text: &str) {
        self.messages.push(Message::new("assistant", text));
        self.fed.push_str(text);
    }

    /// The messages so far, system message first when there is one.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The text fed to the model so far (without the BOS token).
    pub fn fed_text(&self) -> &str {
        &self.fed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

    const CHATML_JINJA: &str = "\
{% for message in messages %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' -}}
{% endfor %}
{% if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' -}}
{% endif %}";

    const BOS: &str = "<|begin_of_text|>";
    const EOS: &str = "<|end_of_text|>";

    fn msgs(pairs: &[(&str, &str)]) -> Vec<Message> {
        pairs.iter().map(|&(r, c)| Message::new(r, c)).collect()
    }

    fn jinja(source: &str) -> ChatTemplate {
        ChatTemplate::Jinja {
            source: source.to_owned(),
        }
    }

    fn render_one(source: &str) -> Result<String> {
        jinja(source).render(&msgs(&[("user", "hi")]), true, BOS, EOS)
    }

    #[test]
    fn from_metadata_selects_kind() {
        assert_eq!(
            ChatTemplate::from_metadata(Some("{{ 'BITNET' }}")),
            ChatTemplate::BitNet
        );
        assert_eq!(ChatTemplate::from_metadata(None), ChatTemplate::ChatMl);
        assert_eq!(
            ChatTemplate::from_metadata(Some("  ")),
            ChatTemplate::ChatMl
        );
        assert_eq!(ChatTemplate::from_metadata(Some(LLAMA3)), jinja(LLAMA3));
    }

    #[test]
    fn bitnet_matches_llama_cli_example() {
        let m = msgs(&[
            ("system", "You are a helpful assistant"),
            ("user", "Hello"),
            ("assistant", "Hi there"),
            ("user", "How are you?"),
        ]);
        assert_eq!(
            ChatTemplate::BitNet.render(&m, true, BOS, EOS).unwrap(),
            "System: You are a helpful assistantUser: Hello<|eot_id|>Assistant: Hi thereUser: How are you?<|eot_id|>Assistant: "
        );
        let bad = msgs(&[("tool", "x")]);
        assert!(matches!(
            ChatTemplate::BitNet.render(&bad, true, BOS, EOS),
            Err(Error::Template(_))
        ));
    }

    #[test]
    fn bitnet_three_turn_conversation() {
        let mut c = Conversation::new(
            ChatTemplate::BitNet,
            BOS.into(),
            EOS.into(),
            Some("S".into()),
        );
        let mut fed = String::new();
        let TurnText::Append(t) = c.add_user("A").unwrap() else {
            panic!("first turn must append");
        };
        assert_eq!(t, "System: SUser: A<|eot_id|>Assistant: ");
        fed += &t;
        c.add_assistant("R");
        fed += "R";
        let TurnText::Append(t) = c.add_user("B").unwrap() else {
            panic!("second turn must append");
        };
        assert_eq!(t, "User: B<|eot_id|>Assistant: ");
        fed += &t;
        assert_eq!(
            fed,
            "System: SUser: A<|eot_id|>Assistant: RUser: B<|eot_id|>Assistant: "
        );
        assert_eq!(c.fed_text(), fed);
        assert_eq!(c.messages().len(), 4);
    }

    #[test]
    fn llama3_renders_and_strips_bos() {
        let m = msgs(&[("system", " S "), ("user", "Hello")]);
        let out = jinja(LLAMA3).render(&m, true, BOS, EOS).unwrap();
        assert_eq!(
            out,
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let out = jinja(LLAMA3).render(&m, false, BOS, EOS).unwrap();
        assert!(out.ends_with("Hello<|eot_id|>"), "{out}");
    }

    #[test]
    fn llama3_conversation_appends() {
        let mut c = Conversation::new(jinja(LLAMA3), BOS.into(), EOS.into(), Some("S".into()));
        let TurnText::Append(first) = c.add_user("A").unwrap() else {
            panic!("first turn must append");
        };
        assert!(!first.starts_with(BOS));
        c.add_assistant("R");
        let second = c.add_user("B").unwrap();
        assert_eq!(
            second,
            TurnText::Append(
                "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nB<|eot_id|>\
                 <|start_header_id|>assistant<|end_header_id|>\n\n"
                    .into()
            )
        );
        // The template trims replies: a reply with trailing space rewrites fed text.
        c.add_assistant("R2 ");
        match c.add_user("C").unwrap() {
            TurnText::Restart(full) => assert_eq!(full, c.fed_text()),
            other => panic!("expected a restart, got {other:?}"),
        }
    }

    #[test]
    fn chatml_jinja_matches_builtin() {
        let m = msgs(&[
            ("system", "S"),
            ("user", "  A "),
            ("assistant", "R"),
            ("user", "B"),
        ]);
        let from_jinja = jinja(CHATML_JINJA).render(&m, true, BOS, EOS).unwrap();
        let expected = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nA<|im_end|>\n\
                        <|im_start|>assistant\nR<|im_end|>\n<|im_start|>user\nB<|im_end|>\n\
                        <|im_start|>assistant\n";
        assert_eq!(from_jinja, expected);
        let m = msgs(&[
            ("system", "S"),
            ("user", "A"),
            ("assistant", "R"),
            ("user", "B"),
        ]);
        assert_eq!(
            ChatTemplate::ChatMl.render(&m, true, BOS, EOS).unwrap(),
            expected
        );
        let mut c = Conversation::new(ChatTemplate::ChatMl, BOS.into(), EOS.into(), None);
        c.add_user("A").unwrap();
        c.add_assistant("R");
        assert_eq!(
            c.add_user("B").unwrap(),
            TurnText::Append(
                "<|im_end|>\n<|im_start|>user\nB<|im_end|>\n<|im_start|>assistant\n".into()
            )
        );
    }

    #[test]
    fn raise_exception_is_a_template_error() {
        let src = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}";
        match render_one(src) {
            Err(Error::Template(msg)) => {
                assert!(msg.contains("Conversation roles must alternate"), "{msg}")
            }
            other => panic!("expected a template error, got {other:?}"),
        }
        let mut c = Conversation::new(jinja(src), BOS.into(), EOS.into(), None);
        assert!(c.add_user("x").is_err());
        assert!(c.messages().is_empty());
    }

    #[test]
    fn python_methods_loop_and_tokens() {
        let src = "{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.content.startswith(' h') }}|{{ m.content.split('i') | length }}|{{ loop.first }}{{ loop.last }}{% endfor %}{{ eos_token }}";
        let out = jinja(src)
            .render(&msgs(&[("user", " hi ")]), false, BOS, EOS)
            .unwrap();
        assert_eq!(out, "HI|True|2|TrueTrue<|end_of_text|>");
        // loop controls as HF enables them.
        let src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
        let out = jinja(src)
            .render(&msgs(&[("user", "a"), ("user", "b")]), false, BOS, EOS)
            .unwrap();
        assert_eq!(out, "a");
    }

    #[test]
    fn tojson_is_python_compatible() {
        assert_eq!(
            render_one("{{ messages[0] | tojson }}").unwrap(),
            r#"{"content": "hi", "role": "user"}"#
        );
        assert_eq!(
            render_one(r#"{{ [1, 2.5, none, true, "a\"<b>\n", []] | tojson }}"#).unwrap(),
            r#"[1, 2.5, null, true, "a\"<b>\n", []]"#
        );
        assert_eq!(
            render_one("{{ {'a': [1, 2]} | tojson(indent=2) }}").unwrap(),
            "{\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
        assert_eq!(
            render_one("{{ 'é😀' | tojson }}|{{ 'é😀' | tojson(ensure_ascii=true) }}").unwrap(),
            "\"é😀\"|\"\\u00e9\\ud83d\\ude00\""
        );
        assert_eq!(
            render_one("{{ [1, 2] | tojson(separators=[',', ':']) }}").unwrap(),
            "[1,2]"
        );
    }

    #[test]
    fn strftime_now_formats() {
        let out = render_one("{{ strftime_now('%Y-%m-%d') }}").unwrap();
        assert_eq!(out.len(), 10, "{out}");
        assert!(render_one("{{ strftime_now('%Q') }}").is_err());
        // 2024-02-29 13:05:09 UTC was a Thursday, day 60 of the year.
        let t = days_from_civil(2024, 2, 29) * 86_400 + 13 * 3600 + 5 * 60 + 9;
        assert_eq!(
            strftime("%d %b %Y|%A %B %j|%I:%M:%S %p|%F %T %%", t).unwrap(),
            "29 Feb 2024|Thursday February 060|01:05:09 PM|2024-02-29 13:05:09 %"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn hostile_templates_error() {
        let expect_err = |src: &str, what: &str| match render_one(src) {
            Err(Error::Template(msg)) => assert!(msg.contains(what), "{msg}"),
            other => panic!("expected a template error, got {other:?}"),
        };
        expect_err(
            "{% for i in range(10000) %}{% for j in range(10000) %}{{ '' }}{% endfor %}{% endfor %}",
            "fuel",
        );
        expect_err(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "recursion",
        );
        assert!(matches!(
            render_one("{% for x in %}"),
            Err(Error::Template(_))
        ));
    }

    /// Review finding (chat_template target): `tojson(indent=N)` repeated N spaces per
    /// level with no bound, so a template could ask for a 2^62-byte string (an abort, not
    /// an error) or overflow `N * level`.
    #[test]
    fn huge_tojson_indent_is_an_error() {
        for src in [
            "{{ [1] | tojson(indent=4611686018427387904) }}",
            "{{ [[1]] | tojson(indent=10000000000) }}",
            "{{ [1] | tojson(257) }}",
        ] {
            match render_one(src) {
                Err(Error::Template(msg)) => assert!(msg.contains("indent"), "{msg}"),
                other => panic!("{src}: expected a template error, got {other:?}"),
            }
        }
        assert!(render_one("{{ [1] | tojson(indent=256) }}").is_ok());
    }

    /// Hostile templates that once exhausted memory (formerly
    /// `fuzz/known-issues/chat_template/`): each must end in a template error, quickly.
    /// Values may nest at most `MAX_VALUE_DEPTH` deep, however they are built and stored
    /// (lists in a namespace, a chain of namespaces, a namespace holding itself): the
    /// deepest allowed value is printed and dropped within a 1 MiB stack (a wasm module's
    /// default), on the calling thread as the browser build renders.
    #[test]
    fn value_nesting_is_bounded_on_every_target() {
        use crate::jinja_budget::MAX_VALUE_DEPTH;
        let wraps = |n: usize, body: &str| {
            format!(
                "{{% set ns = namespace(l=[]) %}}{{% for i in range({n}) %}}\
                 {{% set ns.l = [ns.l] %}}{{% endfor %}}{body}"
            )
        };
        let too_deep = [
            wraps(MAX_VALUE_DEPTH, "{{ ns.l|length }}"),
            // Far past the limit: stopped at the limit, long before the fuel runs out.
            "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}\
             {% for j in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{% endfor %}\
             {{ ns.l }}"
                .to_string(),
            format!(
                "{{% set o = namespace(ns=namespace()) %}}\
                 {{% for i in range({MAX_VALUE_DEPTH}) %}}\
                 {{% set o.ns = namespace(p=o.ns) %}}{{% endfor %}}{{{{ o.ns }}}}"
            ),
            "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}".to_string(),
        ];
        for src in &too_deep {
            match render_one(src) {
                Err(Error::Template(msg)) => assert!(msg.contains("nested more than"), "{msg}"),
                other => panic!("expected a nesting error for {src}, got {other:?}"),
            }
        }
        // The namespace counts one level: its list may nest MAX_VALUE_DEPTH - 1 deep.
        let deepest = wraps(MAX_VALUE_DEPTH - 2, "{{ ns.l|length }}:{{ ns.l }}");
        let out = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || render_jinja_here(&deepest, &msgs(&[("user", "hi")]), true, BOS, EOS))
            .unwrap()
            .join()
            .expect("rendered within a 1 MiB stack")
            .unwrap();
        let brackets = "[".repeat(MAX_VALUE_DEPTH - 1) + &"]".repeat(MAX_VALUE_DEPTH - 1);
        assert_eq!(out, format!("1:{brackets}"));
    }

    #[test]
    fn hostile_templates_fail_in_bounded_memory_and_time() {
        let cases = [
            // doubling a string through a namespace (2^41 bytes in 40 steps)
            r#"{% set ns = namespace(s="ab") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"#,
            // the same through macro recursion
            r#"{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ f("ab", 40) }}"#,
            // the same with `+`, with a list, and with repetition
            r#"{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"#,
            r#"{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|join }}"#,
            r#"{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s * 2 %}{% endfor %}"#,
            r#"{{ "ab" * 99999999 }}"#,
            // squaring with replace (filter and method), join amplification
            r#"{% set ns = namespace(s="aaaa") %}{% for i in range(40) %}{% set ns.s = ns.s|replace("a", ns.s) %}{% endfor %}"#,
            r#"{% set ns = namespace(s="aaaa") %}{% for i in range(40) %}{% set ns.s = ns.s.replace("a", ns.s) %}{% endfor %}"#,
            r#"{% set ns = namespace(s="x" * 1000) %}{% for i in range(20) %}{% set ns.s = range(1000)|join(ns.s) %}{% endfor %}"#,
            // huge widths in upstream filters and Python string methods
            r#"{{ "%0999999999999d"|format(1) }}"#,
            r#"{{ messages[0].content|indent(999999999999) }}"#,
            r#"{{ '{:>999999999999}'.format(1) }}"#,
            r#"{{ [1]|batch(999999999999, 0)|list }}"#,
            // output growth by emission and by literal text
            r#"{% set s = "x" * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}"#,
            &format!(
                "{{% for i in range(100000) %}}{{% for j in range(100000) %}}{}{{% endfor %}}{{% endfor %}}",
                "y".repeat(4096)
            ),
        ];
        for src in cases {
            let t = std::time::Instant::now();
            match render_one(src) {
                Err(Error::Template(msg)) => {
                    assert!(
                        ["budget", "larger than", "too large", "fuel"]
                            .iter()
                            .any(|w| msg.contains(w)),
                        "{src}: unexpected error {msg}"
                    );
                }
                other => panic!("{src}: expected a template error, got {other:?}"),
            }
            assert!(t.elapsed().as_secs() < 10, "{src}: took {:?}", t.elapsed());
        }
    }

    /// A template the lexer rejects is an error, not a hang (found by the `chat_template`
    /// fuzzer: measuring the literal text looped on the lexer's repeated error).
    #[test]
    fn lexer_error_is_an_error_not_a_hang() {
        for src in ["\r{%\u{1d}", "{{ 'unterminated", "{% for %}"] {
            assert!(
                matches!(render_one(src), Err(Error::Template(_))),
                "{src:?}"
            );
        }
    }

    /// The checked operators keep minijinja's semantics on ordinary values.
    #[test]
    fn checked_operators_keep_their_meaning() {
        let src = "{{ 1 + 2 }} {{ 1.5 + 1 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 'ab' ~ 3 }} \
                   {{ 2 * 3 }} {{ 'x' * 3 }} {{ [0] * 2 }} {{ 'a-b'|replace('-', '+') }} \
                   {{ [1, 2]|join(',') }} {{ '%03d'|format(7) }} {{ '{}!'.format('hi') }} \
                   {{ 'a\nb'|indent(2) }} {{ [1, 2, 3]|batch(2)|list }}";
        assert_eq!(
            render_one(src).unwrap(),
            "3 2.5 ab [1, 2] ab3 6 xxx [0, 0] a+b 1,2 007 hi! a\n  b [[1, 2], [3]]"
        );
        assert!(matches!(
            render_one("{{ 9223372036854775807 + 1 }}"),
            Ok(_) | Err(Error::Template(_))
        ));
    }
}
