//! Hugging Face chat templates through minijinja: the environment (HF's conventions,
//! Python string methods, `tojson`, `strftime_now`) and its budgets against hostile
//! templates.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, ErrorKind, Value};

use super::Message;
use crate::{jinja_budget, Result, TemplateError};

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

/// Renders a Hugging Face template: `trim_blocks` and `lstrip_blocks` on, Python string
/// methods, `raise_exception`, `strftime_now` and a Python-compatible `tojson`, with fuel,
/// recursion and byte-budget limits against hostile templates (see `jinja_budget`).
pub(super) fn render_jinja(
    source: &str,
    messages: &[Message],
    tools: Option<&serde_json::Value>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let render = || {
        render_jinja_here(
            source,
            messages,
            tools,
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
                .map_err(|error| TemplateError::RendererStart { error })?;
            worker.join().map_err(|_| TemplateError::RendererPanicked)?
        })
    }
    #[cfg(target_arch = "wasm32")]
    render()
}

/// [`render_jinja`] on the calling thread.
pub(super) fn render_jinja_here(
    source: &str,
    messages: &[Message],
    tools: Option<&serde_json::Value>,
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
    let json_len = |v: Option<&serde_json::Value>| v.map_or(0, |v| v.to_string().len());
    let input_bytes = messages
        .iter()
        .map(|m| m.role.len() + m.content.len() + json_len(m.tool_calls.as_ref()))
        .sum::<usize>()
        + json_len(tools)
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
            let mut fields = vec![
                ("role", Value::from(m.role.as_str())),
                ("content", Value::from(m.content.as_str())),
            ];
            if let Some(calls) = &m.tool_calls {
                fields.push(("tool_calls", Value::from_serialize(calls)));
            }
            if let Some(id) = &m.tool_call_id {
                fields.push(("tool_call_id", Value::from(id.as_str())));
            }
            Value::from_iter(fields)
        })
        .collect();
    let ctx = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    };
    let ctx = match tools {
        Some(t) => context! { tools => Value::from_serialize(t), ..ctx },
        None => ctx,
    };
    jinja_budget::render(&mut env, source, ctx, JINJA_FUEL)
        .map_err(|error| TemplateError::Render { error }.into())
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
pub(super) fn strftime(fmt: &str, unix_secs: i64) -> std::result::Result<String, minijinja::Error> {
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
pub(super) fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian (year, month, day) of a day count since 1970-01-01.
pub(super) fn civil_from_days(days: i64) -> (i64, i64, i64) {
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
