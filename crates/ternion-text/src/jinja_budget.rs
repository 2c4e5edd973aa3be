//! Memory and time bounds for rendering untrusted Jinja chat templates.
//!
//! minijinja's fuel bounds the number of instructions and its recursion limit the nesting,
//! but a single instruction can build an arbitrarily large value: `s ~ s` doubles a string,
//! so 40 loop steps ask for 2^41 bytes. This module bounds the bytes a render may create:
//!
//! - every operation that can make a value larger than its inputs charges the size of its
//!   result to a per-render [`Budget`] *before* building it: `~`, `+` and `*` (the compiled
//!   template's `StringConcat`/`Add`/`Mul` instructions are swapped one for one with calls
//!   to checked functions), the filters `replace`, `join`, `indent`, `format`, `batch`,
//!   `slice` and `tojson`, and the Python string methods (`str.format`, `replace`, `join`);
//! - width and count arguments above [`MAX_WIDTH`] are refused, as are format strings
//!   asking for such widths or precisions;
//! - every `{{ … }}` emission is charged, and the fuel is lowered so that the template's
//!   literal text, emitted once per instruction at most, cannot exceed [`RAW_OUTPUT_BYTES`].
//!
//! Values can also nest without bound: `{% set ns.l = [ns.l] %}` in a loop wraps a list
//! once per step, and minijinja drops and prints nested values recursively, so a deep
//! enough value overflows the stack. Nesting only grows through values kept across
//! instructions, so every store (`StoreLocal`, `SetAttr`) is preceded by a check that the
//! stored value nests at most [`MAX_VALUE_DEPTH`] deep (a reference cycle, a namespace
//! stored into itself, counts as too deep). This holds on every target, the browser's
//! small wasm stack included.
//!
//! Exceeding the budget is an ordinary template error, so a hostile template renders to a
//! clear [`Error::Template`](crate::Error::Template) in bounded memory and time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use minijinja::machinery::{
    get_compiled_template, make_string_output, Instruction, Instructions, Vm,
};
use minijinja::machinery::{tokenize, Token, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, StringInput, ValueKind};
use minijinja::{context, filters, AutoEscape, Environment, Error, ErrorKind, State, Value};

/// Bytes a render may create before counting its input: ample for real templates.
pub(crate) const BASE_BUDGET: usize = 64 << 20;

/// Bytes a render may create per byte of input (messages and special-token texts).
pub(crate) const BUDGET_PER_INPUT_BYTE: usize = 8;

/// Largest width, precision or count a template may pass to a filter or method.
pub(crate) const MAX_WIDTH: usize = 100_000;

/// Most bytes of literal template text a render may emit.
pub(crate) const RAW_OUTPUT_BYTES: usize = 256 << 20;

/// Deepest nesting of a value a template may store (lists, maps and namespaces count one
/// level each). Real chat templates nest a handful of levels (tool schemas a few dozen);
/// dropping or printing 256 levels needs well under the 1 MiB stack of a wasm module.
pub(crate) const MAX_VALUE_DEPTH: usize = 256;

/// Container elements the depth checks of one render may visit: bounds their time when a
/// template stores a large value over and over.
pub(crate) const DEPTH_CHECK_VISITS: usize = 20_000_000;

/// Bytes charged per element of a sequence a template builds.
const VALUE_BYTES: usize = std::mem::size_of::<Value>();

/// The bytes one render may still create; shared by the checked operations.
#[derive(Debug)]
pub(crate) struct Budget {
    left: AtomicUsize,
    visits_left: AtomicUsize,
}

impl Budget {
    /// A budget for a render whose inputs total `input_bytes`.
    pub(crate) fn for_input(input_bytes: usize) -> Arc<Budget> {
        let bytes = BASE_BUDGET.saturating_add(input_bytes.saturating_mul(BUDGET_PER_INPUT_BYTE));
        Arc::new(Budget {
            left: AtomicUsize::new(bytes),
            visits_left: AtomicUsize::new(DEPTH_CHECK_VISITS),
        })
    }

    /// Takes `bytes` from the budget, or fails when it does not hold them.
    pub(crate) fn charge(&self, bytes: usize) -> Result<(), Error> {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(bytes)
            })
            .map(|_| ())
            .map_err(|left| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "template output too large: {bytes} more bytes asked, {left} left \
                         of the render's budget"
                    ),
                )
            })
    }

    /// Fails unless `value` nests at most [`MAX_VALUE_DEPTH`] deep; the elements visited
    /// are taken from the render's [`DEPTH_CHECK_VISITS`]. Walks with its own stack, so
    /// checking a deep value does not recurse.
    pub(crate) fn check_depth(&self, value: &Value) -> Result<(), Error> {
        let mut todo = vec![(value.clone(), 0usize)];
        while let Some((v, depth)) = todo.pop() {
            let kind = v.kind();
            if !matches!(kind, ValueKind::Seq | ValueKind::Map) {
                continue;
            }
            if depth >= MAX_VALUE_DEPTH {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "value nested more than {MAX_VALUE_DEPTH} levels deep (or containing \
                         itself)"
                    ),
                ));
            }
            let n = v.len().unwrap_or(0);
            self.visits_left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(n)
                })
                .map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "template stores too much: its values' nesting checks visited \
                             {DEPTH_CHECK_VISITS} elements"
                        ),
                    )
                })?;
            // Objects that cannot be iterated hold nothing a template can reach.
            let Ok(items) = v.try_iter() else { continue };
            for item in items {
                let child = if kind == ValueKind::Map {
                    v.get_item(&item).unwrap_or_default()
                } else {
                    item
                };
                todo.push((child, depth + 1));
            }
        }
        Ok(())
    }

    /// Bytes still available.
    pub(crate) fn left(&self) -> usize {
        self.left.load(Ordering::Relaxed)
    }
}

fn too_wide(what: &str, n: usize) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{what} {n} is larger than {MAX_WIDTH}"),
    )
}

fn check_width(what: &str, n: Option<usize>) -> Result<(), Error> {
    match n {
        Some(n) if n > MAX_WIDTH => Err(too_wide(what, n)),
        _ => Ok(()),
    }
}

/// Refuses format strings (`%`-style or `{}`-style) with a number above [`MAX_WIDTH`]:
/// such a number can only be a width, precision or argument index.
fn check_format_string(fmt: &str) -> Result<(), Error> {
    for run in fmt.split(|c: char| !c.is_ascii_digit()) {
        if run.len() > 6 || run.parse::<usize>().is_ok_and(|n| n > MAX_WIDTH) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("format string with a number larger than {MAX_WIDTH}"),
            ));
        }
    }
    Ok(())
}

/// Upper bound of the bytes `replace(from, to)` adds to `s` (an empty `from` matches
/// between every character, as in Python).
fn replace_growth(s: &str, from: &str, to: &str) -> usize {
    let hits = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    hits.saturating_mul(to.len())
}

/// Bytes of a value once rendered as text.
fn text_len(v: &Value) -> usize {
    v.as_str().map_or_else(|| v.to_string().len(), str::len)
}

/// Elements of a sized sequence (0 for anything else).
fn seq_len(v: &Value) -> usize {
    match v.kind() {
        ValueKind::Seq | ValueKind::Iterable => v.len().unwrap_or(0),
        _ => 0,
    }
}

/// `a + b` and `a * b` with minijinja's own semantics, for the operands whose result size
/// has been charged.
fn builtin_op(op: &'static str, a: Value, b: Value) -> Result<Value, Error> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    let env = ENV.get_or_init(Environment::new);
    env.compile_expression(op)?
        .eval(context! { a => a, b => b })
}

/// Registers the checked operations, filters, methods and formatter on `env`.
pub(crate) fn install(env: &mut Environment<'_>, budget: &Arc<Budget>) {
    let b = budget.clone();
    env.add_function("__ternion_concat", move |x: Value, y: Value| {
        b.charge(text_len(&x).saturating_add(text_len(&y)))?;
        Ok::<_, Error>(Value::from(format!("{x}{y}")))
    });
    let b = budget.clone();
    env.add_function("__ternion_depth", move |x: Value| {
        b.check_depth(&x)?;
        Ok::<_, Error>(x)
    });
    let b = budget.clone();
    env.add_function("__ternion_add", move |x: Value, y: Value| {
        if let (Some(s), Some(t)) = (x.as_str(), y.as_str()) {
            b.charge(s.len().saturating_add(t.len()))?;
            return Ok(Value::from([s, t].concat()));
        }
        let items = seq_len(&x).saturating_add(seq_len(&y));
        b.charge(items.saturating_mul(VALUE_BYTES))?;
        builtin_op("a + b", x, y)
    });
    let b = budget.clone();
    env.add_function("__ternion_mul", move |x: Value, y: Value| {
        let times = |n: &Value| usize::try_from(n.clone()).unwrap_or(0);
        let bytes = match (x.as_str(), y.as_str()) {
            (Some(s), None) => s.len().saturating_mul(times(&y)),
            (None, Some(s)) => s.len().saturating_mul(times(&x)),
            _ => (seq_len(&x).saturating_mul(times(&y)))
                .saturating_add(seq_len(&y).saturating_mul(times(&x)))
                .saturating_mul(VALUE_BYTES),
        };
        b.charge(bytes)?;
        builtin_op("a * b", x, y)
    });

    let b = budget.clone();
    env.add_filter(
        "replace",
        move |state: &State, v: StringInput, from: StringInput, to: StringInput| {
            let s = v.as_str();
            b.charge(
                s.len()
                    .saturating_add(replace_growth(s, from.as_str(), to.as_str())),
            )?;
            filters::replace(state, v, from, to)
        },
    );
    let b = budget.clone();
    env.add_filter(
        "join",
        move |state: &State, v: Value, sep: Option<StringInput>| {
            let mut bytes = 0usize;
            let mut n = 0usize;
            for item in v.try_iter()? {
                bytes = bytes.saturating_add(text_len(&item));
                n += 1;
            }
            let sep_len = sep.as_ref().map_or(0, |s| s.as_str().len());
            b.charge(bytes.saturating_add(n.saturating_mul(sep_len)))?;
            filters::join(state, &v, sep)
        },
    );
    let b = budget.clone();
    env.add_filter(
        "indent",
        move |v: StringInput,
              width: Option<usize>,
              first: Option<bool>,
              blank: Option<bool>,
              kwargs: Kwargs| {
            let w = kwargs.get::<Option<usize>>("width")?.or(width);
            check_width("indent width", w)?;
            let lines = v.as_str().lines().count() + 1;
            b.charge(
                v.as_str()
                    .len()
                    .saturating_add(lines.saturating_mul(w.unwrap_or(4))),
            )?;
            filters::indent(v, width, first, blank, kwargs)
        },
    );
    let b = budget.clone();
    env.add_filter(
        "format",
        move |state: &State, fmt: Value, args: Rest<Value>| {
            check_format_string(fmt.as_str().unwrap_or_default())?;
            let bytes = args.iter().map(text_len).sum::<usize>();
            b.charge(text_len(&fmt).saturating_add(bytes))?;
            filters::format(state, &fmt, args)
        },
    );
    env.add_filter(
        "batch",
        |state: &State, v: Value, count: usize, fill: Option<Value>| {
            check_width("batch size", Some(count))?;
            filters::batch(state, v, count, fill)
        },
    );
    env.add_filter(
        "slice",
        |state: &State, v: Value, count: usize, fill: Option<Value>| {
            check_width("slice count", Some(count))?;
            filters::slice(state, v, count, fill)
        },
    );

    let b = budget.clone();
    env.set_unknown_method_callback(move |state, value, method, args| {
        for a in args {
            if let Ok(n) = usize::try_from(a.clone()) {
                check_width("method argument", Some(n))?;
            }
        }
        if let Some(s) = value.as_str() {
            let grows = match method {
                "format" => {
                    check_format_string(s)?;
                    args.iter().map(text_len).sum::<usize>()
                }
                "join" => args.first().map_or(Ok(0), |items| {
                    let mut total = 0usize;
                    for item in items.try_iter()? {
                        total = total.saturating_add(text_len(&item).saturating_add(s.len()));
                    }
                    Ok::<_, Error>(total)
                })?,
                "replace" => {
                    let from = args.first().and_then(Value::as_str).unwrap_or_default();
                    let to = args.get(1).and_then(Value::as_str).unwrap_or_default();
                    replace_growth(s, from, to)
                }
                _ => 0,
            };
            b.charge(s.len().saturating_add(grows))?;
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });

    let b = budget.clone();
    env.set_formatter(move |out, state, value| {
        b.charge(text_len(value))?;
        minijinja::escape_formatter(out, state, value)
    });
}

/// Instructions [`rewrite`] puts before `instr`: a depth check of the value a store keeps
/// (`StoreLocal` pops it from the top; `SetAttr` finds it under the namespace).
fn depth_check_before(instr: &Instruction<'_>) -> &'static [Instruction<'static>] {
    const CHECK: Instruction<'static> = Instruction::CallFunction("__ternion_depth", Some(1));
    match instr {
        Instruction::StoreLocal(_) => &[CHECK],
        Instruction::SetAttr(_) => &[Instruction::Swap, CHECK, Instruction::Swap],
        _ => &[],
    }
}

/// Copies `instrs`, swapping the size-amplifying operators for calls to the checked
/// functions [`install`] registers and putting a depth check before every store; jump
/// targets and macro offsets are moved to the instructions' new places.
fn rewrite<'s>(instrs: &Instructions<'s>) -> Instructions<'s> {
    let n = instrs.len() as u32;
    // New index of each old instruction (and of the end, a valid jump target).
    let mut at = Vec::with_capacity(n as usize + 1);
    let mut next = 0u32;
    for idx in 0..n {
        at.push(next);
        let extra = instrs.get(idx).map_or(0, |i| depth_check_before(i).len())
            + namespace_check_after(instrs, idx).len();
        next += 1 + extra as u32;
    }
    at.push(next);
    let to = |t: u32| at.get(t as usize).copied().unwrap_or(t);
    let mut out = Instructions::new(instrs.name(), instrs.source());
    for idx in 0..n {
        let Some(instr) = instrs.get(idx) else { break };
        let line = instrs.get_line(idx).unwrap_or(0) as u16;
        let span = instrs.get_span(idx);
        let mut emit = |i: Instruction<'s>| match span {
            Some(span) => out.add_with_span(i, span),
            None => out.add_with_line(i, line),
        };
        for check in depth_check_before(instr) {
            emit(check.clone());
        }
        emit(match instr {
            Instruction::StringConcat => Instruction::CallFunction("__ternion_concat", Some(2)),
            Instruction::Add => Instruction::CallFunction("__ternion_add", Some(2)),
            Instruction::Mul => Instruction::CallFunction("__ternion_mul", Some(2)),
            Instruction::Jump(t) => Instruction::Jump(to(*t)),
            Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(to(*t)),
            Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(to(*t)),
            Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(to(*t)),
            Instruction::Iterate(t) => Instruction::Iterate(to(*t)),
            Instruction::BuildMacro(name, t, flags) => {
                Instruction::BuildMacro(name, to(*t), *flags)
            }
            other => other.clone(),
        });
        for check in namespace_check_after(instrs, idx) {
            emit(check);
        }
    }
    out
}

/// Instructions [`rewrite`] puts after instruction `idx` when it assigns to a namespace
/// named by a variable (`{% set ns.x = … %}` compiles to `Lookup(ns)`, `SetAttr(x)`): a
/// depth check of the namespace itself, which catches a namespace made to hold itself
/// (`{% set ns.me = ns %}`), a cycle no check of the stored value can see.
fn namespace_check_after<'s>(instrs: &Instructions<'s>, idx: u32) -> Vec<Instruction<'s>> {
    match (
        idx.checked_sub(1).and_then(|i| instrs.get(i)),
        instrs.get(idx),
    ) {
        (Some(Instruction::Lookup(ns)), Some(Instruction::SetAttr(_))) => vec![
            Instruction::Lookup(ns),
            Instruction::CallFunction("__ternion_depth", Some(1)),
            Instruction::DiscardTop,
        ],
        _ => Vec::new(),
    }
}

/// Longest literal text of `source` before whitespace control (an upper bound of what
/// one `EmitRaw` instruction writes).
// `SyntaxConfig` is a unit struct only without minijinja's `custom_syntax` feature.
#[allow(clippy::default_constructed_unit_structs)]
fn longest_literal(source: &str) -> usize {
    let ws = WhitespaceConfig {
        keep_trailing_newline: true,
        lstrip_blocks: false,
        trim_blocks: false,
    };
    // The lexer repeats its error forever: stop at the first one (compiling reports it).
    tokenize(source, false, SyntaxConfig::default(), ws)
        .map_while(Result::ok)
        .filter_map(|(t, _)| match t {
            Token::TemplateData(s) => Some(s.len()),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Compiles `source` on `env` (which [`install`] prepared), rewrites it with the checked
/// operators, caps the fuel so literal text stays within [`RAW_OUTPUT_BYTES`], and
/// renders it with `ctx`.
pub(crate) fn render<'s>(
    env: &mut Environment<'s>,
    source: &'s str,
    ctx: Value,
    fuel: u64,
) -> Result<String, Error> {
    let raw_fuel = (RAW_OUTPUT_BYTES / longest_literal(source).max(1)) as u64;
    env.set_fuel(Some(fuel.min(raw_fuel)));
    let env = &*env;
    let tmpl = env.template_from_str(source)?;
    let compiled = get_compiled_template(&tmpl);
    let instrs = rewrite(&compiled.instructions);
    let blocks: BTreeMap<_, _> = compiled
        .blocks
        .iter()
        .map(|(name, block)| (*name, rewrite(block)))
        .collect();
    let mut text = String::new();
    let mut out = make_string_output(&mut text);
    Vm::new(env).eval(&instrs, ctx, &blocks, &mut out, AutoEscape::None)?;
    Ok(text)
}
