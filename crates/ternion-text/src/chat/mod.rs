//! Chat templates and multi-turn conversations.
//!
//! A [`ChatTemplate`] turns a list of [`Message`]s into prompt text. Three kinds exist:
//! BitNet's built-in format (selected by the "BITNET" marker its converter stores), any
//! Hugging Face Jinja template (rendered with minijinja, with HF's conventions) and ChatML,
//! llama.cpp's fallback when a model has no template.
//!
//! Where the tokenizer adds BOS itself, a leading BOS text produced by a Jinja template is
//! stripped once (as llama.cpp's `common_chat_template_direct_apply` does when the
//! vocabulary's `add_bos` is set); where it does not (SmolLM2, whose BOS is
//! `<|im_start|>`), the text is kept. Special-token texts such as
//! `<|eot_id|>` stay in the text; the caller tokenizes with special-token parsing on.
//!
//! A [`Conversation`] tracks what has already been fed to the model and hands back only the
//! new text for each user turn ([`TurnText::Append`]), or the whole text when the template
//! rewrote earlier turns ([`TurnText::Restart`]).

mod jinja;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;

pub use crate::error::TemplateError;
use crate::Result;
use jinja::render_jinja;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// "system", "user", "assistant", or another role the template knows.
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant turn's tool calls (OpenAI's `tool_calls` array), for Jinja templates.
    pub tool_calls: Option<serde_json::Value>,
    /// The tool call a `tool` message answers, for Jinja templates.
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
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
    /// tokens, given to Jinja templates; when `add_bos` (the tokenizer adds BOS itself), one
    /// leading `bos_token` in the output is stripped.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
        add_bos: bool,
    ) -> Result<String> {
        self.render_with_tools(
            messages,
            None,
            add_generation_prompt,
            (bos_token, eos_token),
            add_bos,
        )
    }

    /// Whether the template renders a `tools` list itself (a Jinja template that names
    /// `tools`).
    pub fn renders_tools(&self) -> bool {
        matches!(self, ChatTemplate::Jinja { source } if source.contains("tools"))
    }

    /// [`ChatTemplate::render`] with OpenAI's `tools` array given to Jinja templates as
    /// `tools` (the other formats have no place for it); `bos_eos` are the BOS and EOS texts.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        (bos_token, eos_token): (&str, &str),
        add_bos: bool,
    ) -> Result<String> {
        match self {
            ChatTemplate::BitNet => render_bitnet(messages),
            ChatTemplate::ChatMl => Ok(render_chatml(messages, add_generation_prompt)),
            ChatTemplate::Jinja { source } => {
                let out = render_jinja(
                    source,
                    messages,
                    tools,
                    add_generation_prompt,
                    bos_token,
                    eos_token,
                )?;
                match out.strip_prefix(bos_token) {
                    Some(rest) if add_bos && !bos_token.is_empty() => Ok(rest.to_owned()),
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
                return Err(TemplateError::UnknownRole {
                    role: other.to_string(),
                }
                .into())
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
    add_bos: bool,
    messages: Vec<Message>,
    fed: String,
}

impl Conversation {
    /// Starts a conversation, with `system` as its first message when given; `add_bos`
    /// tells whether the tokenizer adds BOS itself ([`ChatTemplate::render`]).
    pub fn new(
        template: ChatTemplate,
        (bos_token, eos_token): (String, String),
        add_bos: bool,
        system: Option<String>,
    ) -> Self {
        Conversation {
            template,
            bos_token,
            eos_token,
            add_bos,
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
        let full = match self.template.render(
            &self.messages,
            true,
            &self.bos_token,
            &self.eos_token,
            self.add_bos,
        ) {
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
