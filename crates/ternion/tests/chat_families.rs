//! Chat templates and stop tokens of the Qwen2, SmolLM and Gemma 3 vocabularies (the
//! tokenizers of `../shared/golden2/models/`, copied from the real files): the template in
//! the file renders, its turn markers tokenize to one special token each, and the
//! end-of-turn token stops generation.

use ternion::chat::{ChatTemplate, Message};
use ternion::gguf::GgufFile;
use ternion::tokenizer::{Tokenizer, TokenizerOptions};

use ternion_testkit::shared;

fn open(model: &str) -> (GgufFile, Tokenizer) {
    let path = shared::shared_path(&format!("golden2/models/{model}"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default()).unwrap();
    (file, tok)
}

fn conversation() -> Vec<Message> {
    vec![
        Message::new("user", "Hi!"),
        Message::new("assistant", "Hello."),
        Message::new("user", "Name a colour."),
    ]
}

/// Renders the file's template and checks the ChatML turns, their tokens and the stop token.
fn check_chatml(model: &str, system: &str) {
    let (file, tok) = open(model);
    let source = file.get_str("tokenizer.chat_template").unwrap();
    assert!(source.is_some(), "{model}: no chat template");
    let text = ChatTemplate::from_metadata(source)
        .render(&conversation(), true, "", "<|im_end|>", false)
        .unwrap();
    let want = format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(text, want, "{model}");
    let ids = tok.encode(&text, tok.add_bos(), true).unwrap();
    let (start, end) = (
        tok.token_id("<|im_start|>").unwrap(),
        tok.token_id("<|im_end|>").unwrap(),
    );
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 5, "{model}");
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 4, "{model}");
    assert!(tok.is_eog(end), "{model}: <|im_end|> must stop generation");
    assert!(!tok.is_eog(start), "{model}");
}

#[test]
fn qwen2_chatml_template_and_stop_token() {
    check_chatml("qwen2-d64-f16.gguf", "You are a helpful assistant");
}

#[test]
fn smollm_chatml_template_and_stop_token() {
    check_chatml(
        "llama-smollm-d64-q4_1.gguf",
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    );
}

#[test]
fn gemma3_turn_tokens_and_stop_token() {
    let (_, tok) = open("gemma3-d64-q4_k.gguf");
    let text = "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n";
    let ids = tok.encode(text, tok.add_bos(), true).unwrap();
    let (start, end) = (
        tok.token_id("<start_of_turn>").unwrap(),
        tok.token_id("<end_of_turn>").unwrap(),
    );
    assert_eq!(ids.first().copied(), tok.bos_id());
    assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1);
    assert!(tok.is_eog(end), "<end_of_turn> must stop generation");
    assert!(tok.is_eog(tok.eos_id().unwrap()));
}
