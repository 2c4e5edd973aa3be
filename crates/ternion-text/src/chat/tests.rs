//! Chat template and conversation tests.

use super::jinja::{civil_from_days, days_from_civil, render_jinja_here, strftime};
use super::*;
use crate::Error;

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
    jinja(source).render(&msgs(&[("user", "hi")]), true, BOS, EOS, true)
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
        ChatTemplate::BitNet.render(&m, true, BOS, EOS, true).unwrap(),
        "System: You are a helpful assistantUser: Hello<|eot_id|>Assistant: Hi thereUser: How are you?<|eot_id|>Assistant: "
    );
    let bad = msgs(&[("tool", "x")]);
    assert!(matches!(
        ChatTemplate::BitNet.render(&bad, true, BOS, EOS, true),
        Err(Error::Template(_))
    ));
}

#[test]
fn bitnet_three_turn_conversation() {
    let mut c = Conversation::new(
        ChatTemplate::BitNet,
        (BOS.into(), EOS.into()),
        true,
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
    let out = jinja(LLAMA3).render(&m, true, BOS, EOS, true).unwrap();
    assert_eq!(
        out,
        "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let out = jinja(LLAMA3).render(&m, false, BOS, EOS, true).unwrap();
    assert!(out.ends_with("Hello<|eot_id|>"), "{out}");
}

#[test]
fn llama3_conversation_appends() {
    let mut c = Conversation::new(
        jinja(LLAMA3),
        (BOS.into(), EOS.into()),
        true,
        Some("S".into()),
    );
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
    let from_jinja = jinja(CHATML_JINJA)
        .render(&m, true, BOS, EOS, true)
        .unwrap();
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
        ChatTemplate::ChatMl
            .render(&m, true, BOS, EOS, true)
            .unwrap(),
        expected
    );
    let mut c = Conversation::new(ChatTemplate::ChatMl, (BOS.into(), EOS.into()), true, None);
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
        Err(Error::Template(e)) => {
            let msg = e.to_string();
            assert!(msg.contains("Conversation roles must alternate"), "{msg}")
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    let mut c = Conversation::new(jinja(src), (BOS.into(), EOS.into()), true, None);
    assert!(c.add_user("x").is_err());
    assert!(c.messages().is_empty());
}

#[test]
fn python_methods_loop_and_tokens() {
    let src = "{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.content.startswith(' h') }}|{{ m.content.split('i') | length }}|{{ loop.first }}{{ loop.last }}{% endfor %}{{ eos_token }}";
    let out = jinja(src)
        .render(&msgs(&[("user", " hi ")]), false, BOS, EOS, true)
        .unwrap();
    assert_eq!(out, "HI|True|2|TrueTrue<|end_of_text|>");
    // loop controls as HF enables them.
    let src = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
    let out = jinja(src)
        .render(
            &msgs(&[("user", "a"), ("user", "b")]),
            false,
            BOS,
            EOS,
            true,
        )
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
        Err(Error::Template(e)) => {
            let msg = e.to_string();
            assert!(msg.contains(what), "{msg}")
        }
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
            Err(Error::Template(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("indent"), "{msg}")
            }
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
            Err(Error::Template(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("nested more than"), "{msg}")
            }
            other => panic!("expected a nesting error for {src}, got {other:?}"),
        }
    }
    // The namespace counts one level: its list may nest MAX_VALUE_DEPTH - 1 deep.
    let deepest = wraps(MAX_VALUE_DEPTH - 2, "{{ ns.l|length }}:{{ ns.l }}");
    let out = std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || render_jinja_here(&deepest, &msgs(&[("user", "hi")]), None, true, BOS, EOS))
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
            Err(Error::Template(e)) => {
                let msg = e.to_string();
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

/// A Hermes-style template: tools in the system turn, calls and results as tagged turns.
const TOOLS_JINJA: &str = "\
{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}
{% for m in messages %}
{% if m.tool_calls is defined %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>tool\n[{{ m.tool_call_id }}] {{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}
{% endfor %}";

#[test]
fn tools_tool_calls_and_results_reach_the_template() {
    let t = jinja(TOOLS_JINJA);
    assert!(t.renders_tools());
    assert!(!ChatTemplate::ChatMl.renders_tools());
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    let mut call = Message::new("assistant", "");
    call.tool_calls = Some(serde_json::json!([{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{}"}}]));
    let mut result = Message::new("tool", "42");
    result.tool_call_id = Some("c1".into());
    let m = vec![Message::new("user", "hi"), call, result];
    let out = t
        .render_with_tools(&m, Some(&tools), false, (BOS, EOS), true)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nTools: [{\"function\": {\"name\": \"f\"}, \"type\": \"function\"}]<|im_end|>\n\
         <|im_start|>user\nhi<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>{\"arguments\": \"{}\", \"name\": \"f\"}</tool_call><|im_end|>\n\
         <|im_start|>tool\n[c1] 42<|im_end|>\n"
    );
    let plain = t.render(&m[..1], false, BOS, EOS, true).unwrap();
    assert_eq!(plain, "<|im_start|>user\nhi<|im_end|>\n");
}

/// SmolLM2-135M-Instruct's `tokenizer.chat_template`, as its GGUF stores it.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[test]
fn smollm2_template_adds_its_default_system_turn_as_jinja2_does() {
    let m = msgs(&[(
        "user",
        "What is the capital of France? Answer in one sentence.",
    )]);
    // Python's jinja2 renders the file's template to this text (docs/VALIDATION.md).
    assert_eq!(
        jinja(SMOLLM2)
            .render(&m, true, "<|im_start|>", "<|im_end|>", false)
            .unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in one \
         sentence.<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_system = msgs(&[("system", "Be brief."), ("user", "Hi")]);
    assert_eq!(
        jinja(SMOLLM2)
            .render(&with_system, false, "<|im_start|>", "<|im_end|>", false)
            .unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}
