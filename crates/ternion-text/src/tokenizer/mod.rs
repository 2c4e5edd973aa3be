//! Tokenizers read from GGUF metadata, matching llama.cpp token for token.
//!
//! Two vocabulary kinds are supported: byte-level BPE (`tokenizer.ggml.model = "gpt2"`, with
//! the Llama-3, GPT-2 and llama.cpp "default" pre-tokenizers) and SentencePiece-style BPE
//! (`"llama"`, with byte fallback). Special tokens are split out first ([`special`]), then
//! each raw-text fragment is pre-tokenized ([`pretokenize`]) and merged ([`bpe`], [`spm`]).

mod bpe;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod unicode;
mod vocab;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_golden2;

pub use stream::StreamDecoder;

pub use crate::error::TokenizerError;
use crate::gguf::GgufFile;
use crate::{Error, Result};
use bpe::Bpe;
use special::Fragment;
use spm::Spm;
use unicode::ByteLevel;
use vocab::{Attr, Vocab};

/// How byte-level BPE text is split into words before merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// Llama-3's regex (`tokenizer.ggml.pre = "llama-bpe"`), with ignore_merges.
    Llama3,
    /// Qwen2's regex (`"qwen2"`): Llama-3's with single digits.
    Qwen2,
    /// GPT-2's regex (`"gpt-2"`).
    Gpt2,
    /// Single digits, then GPT-2's regex (`"smollm"`, `"starcoder"` and their kin).
    SmolLm,
    /// llama.cpp's fallback when `tokenizer.ggml.pre` is absent (or `"default"`): punctuation
    /// runs, then the GPT-2 regex, then digit runs, then triples of ASCII digits.
    Default,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp (src/llama-vocab.cpp) uses for a `tokenizer.ggml.pre`
    /// name, and whether it takes a word that is itself a token whole (ignore_merges).
    /// `None` for names not known here ([`PRE_TOKENIZER_NAMES`] lists those that are).
    pub fn from_name(name: &str) -> Option<(PreTokenizer, bool)> {
        Some(match name {
            "default" => (PreTokenizer::Default, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon_e" | "falcon-h1"
            | "pixtral" | "midm-2.0" | "lfm2" => (PreTokenizer::Llama3, true),
            // Same regex as Llama-3, without ignore_merges.
            "smaug-bpe" | "dbrx" | "chatglm-bpe" | "glm4" => (PreTokenizer::Llama3, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan" => {
                (PreTokenizer::Qwen2, false)
            }
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
            | "gigachat" | "a.x-4.0" | "mellum" | "exaone4" | "mpt" | "olmo" | "jais"
            | "trillion" | "granite-docling" => (PreTokenizer::Gpt2, false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => (PreTokenizer::SmolLm, false),
            _ => return None,
        })
    }
}

/// Every `tokenizer.ggml.pre` name [`PreTokenizer::from_name`] knows.
pub const PRE_TOKENIZER_NAMES: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon_e",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "smaug-bpe",
    "dbrx",
    "chatglm-bpe",
    "glm4",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "megrez",
    "stablelm2",
    "hunyuan",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "jina-v2-es",
    "jina-v2-de",
    "gigachat",
    "a.x-4.0",
    "mellum",
    "exaone4",
    "mpt",
    "olmo",
    "jais",
    "trillion",
    "granite-docling",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];

impl PreTokenizer {
    /// The pre-tokenizer for a name given by a user: a `tokenizer.ggml.pre` name (see
    /// [`PreTokenizer::from_name`]) or one of this enum's own names (`llama3`, `qwen2`,
    /// `gpt2`, `smollm`, `default`).
    pub fn parse(name: &str) -> Result<PreTokenizer> {
        match name {
            "gpt2" => Ok(PreTokenizer::Gpt2),
            _ => PreTokenizer::from_name(name)
                .map(|(p, _)| p)
                .ok_or_else(|| Error::unsupported("pre-tokenizer", name, PRE_TOKENIZER_NAMES, "")),
        }
    }
}

/// Choices the GGUF file does not settle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenizerOptions {
    /// Use this pre-tokenizer whatever `tokenizer.ggml.pre` says (byte-level BPE only).
    pub pre: Option<PreTokenizer>,
    /// The pre-tokenizer when `tokenizer.ggml.pre` is absent: `Default` reproduces
    /// llama.cpp/bitnet.cpp, `Llama3` reproduces Hugging Face for BitNet b1.58 2B-4T.
    pub pre_when_absent: PreTokenizer,
}

impl Default for TokenizerOptions {
    /// No override; an absent `pre` means llama.cpp's `Default`.
    fn default() -> Self {
        TokenizerOptions {
            pre: None,
            pre_when_absent: PreTokenizer::Default,
        }
    }
}

enum Model {
    Bpe {
        bpe: Box<Bpe>,
        pre: PreTokenizer,
        ignore_merges: bool,
    },
    Spm {
        spm: Spm,
        add_space_prefix: bool,
    },
}

/// A tokenizer loaded from a GGUF file's `tokenizer.ggml.*` metadata.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    /// Special tokens, longest text first.
    specials: Vec<u32>,
    /// Piece bytes of every token, concatenated; token `i` is `pieces[offsets[i]..offsets[i+1]]`.
    pieces: Vec<u8>,
    offsets: Vec<usize>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    add_bos: bool,
    eog: Vec<bool>,
}

/// Per-token strip attributes llama.cpp (src/llama-vocab.cpp) sets by model name: in Phi-3
/// files every special token except `<unk>`, `<s>` and `<|endoftext|>` drops the white space
/// after itself (so `<|user|>\n` tokenizes as `<|user|>` alone), and so does `</s>`.
fn set_strip_attrs(vocab: &mut Vocab, model_name: &str) {
    let name = model_name.to_lowercase();
    if !(name.contains("phi-3") || name.contains("phi3")) {
        return;
    }
    for (r, a) in vocab.rstrip.iter_mut().zip(&vocab.attrs) {
        *r = a.is_special();
    }
    for (text, on) in [
        ("</s>", true),
        ("<unk>", false),
        ("<s>", false),
        ("<|endoftext|>", false),
    ] {
        if let Some(id) = vocab.id(text) {
            vocab.rstrip[id as usize] = on;
        }
    }
}

/// Token texts llama.cpp takes as EOT when `tokenizer.ggml.eot_token_id` is absent, in the
/// order tried here.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<end_of_utterance>",
];

/// Token texts llama.cpp treats as end of generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata. Fails with
    /// [`Error::Tokenizer`] on a missing token list or merges, arrays of the wrong length,
    /// an unsupported `tokenizer.ggml.model`, or an unknown `tokenizer.ggml.pre`.
    pub fn from_gguf(file: &GgufFile, opts: &TokenizerOptions) -> Result<Tokenizer> {
        let kind =
            file.get_str("tokenizer.ggml.model")?
                .ok_or_else(|| TokenizerError::MissingKey {
                    file: file.path().to_path_buf(),
                    key: "tokenizer.ggml.model",
                })?;
        let mut vocab = Vocab::load(file)?;
        let n = vocab.len();
        let in_range = |id: u32| ((id as usize) < n).then_some(id);
        let (model, mut bos, mut eos, add_bos_default) = match kind {
            "gpt2" => {
                let merges = file
                    .get_str_array("tokenizer.ggml.merges")?
                    .ok_or_else(|| TokenizerError::MissingMerges {
                        file: file.path().to_path_buf(),
                    })?;
                let (pre, ignore_merges) = match (opts.pre, file.get_str("tokenizer.ggml.pre")?) {
                    (Some(p), _) => (p, p == PreTokenizer::Llama3),
                    (None, Some(name)) => PreTokenizer::from_name(name).ok_or_else(|| {
                        Error::unsupported(
                            "tokenizer.ggml.pre",
                            name,
                            PRE_TOKENIZER_NAMES,
                            "--pre-tokenizer NAME overrides it",
                        )
                    })?,
                    (None, None) => (
                        opts.pre_when_absent,
                        opts.pre_when_absent == PreTokenizer::Llama3,
                    ),
                };
                let bpe = Box::new(Bpe::new(&vocab, &merges)?);
                let model = Model::Bpe {
                    bpe,
                    pre,
                    ignore_merges,
                };
                let add_bos = pre == PreTokenizer::Llama3 && ignore_merges;
                (model, in_range(11), in_range(11), add_bos)
            }
            "llama" => {
                let add_space_prefix = file
                    .get_bool("tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(true);
                let model = Model::Spm {
                    spm: Spm::new(&vocab),
                    add_space_prefix,
                };
                (model, in_range(1), in_range(2), true)
            }
            other => {
                return Err(Error::unsupported(
                    "tokenizer.ggml.model",
                    other,
                    ["gpt2", "llama"],
                    "",
                ))
            }
        };
        let read_id = |key: &str, default: Option<u32>| -> Result<Option<u32>> {
            Ok(file.get_u32(key)?.and_then(in_range).or(default))
        };
        bos = read_id("tokenizer.ggml.bos_token_id", bos)?;
        eos = read_id("tokenizer.ggml.eos_token_id", eos)?;
        let mut eot = read_id("tokenizer.ggml.eot_token_id", None)?;
        let mut eom = read_id("tokenizer.ggml.eom_token_id", None)?;
        let add_bos = file
            .get_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(add_bos_default);

        // End-of-generation tokens found by their text are forced to control, as llama.cpp.
        let mut forced = Vec::new();
        if eot.is_none() {
            eot = EOT_TEXTS.iter().find_map(|t| vocab.id(t));
            forced.extend(eot);
        }
        if eom.is_none() {
            eom = vocab.id("<|eom_id|>");
            forced.extend(eom);
        }
        let mut eog = vec![false; n];
        for id in EOG_TEXTS.iter().filter_map(|t| vocab.id(t)) {
            eog[id as usize] = true;
            forced.push(id);
        }
        for id in forced {
            vocab.attrs[id as usize] = Attr::Control;
        }
        set_strip_attrs(&mut vocab, file.get_str("general.name")?.unwrap_or(""));
        for id in [eos, eot, eom].into_iter().flatten() {
            eog[id as usize] = true;
        }

        let (pieces, offsets) = build_pieces(&vocab, matches!(model, Model::Bpe { .. }));
        Ok(Tokenizer {
            specials: special::special_tokens(&vocab),
            vocab,
            model,
            pieces,
            offsets,
            bos,
            eos,
            eot,
            add_bos,
            eog,
        })
    }

    /// Tokenizes `text`. With `add_bos` the BOS token (if the vocabulary has one) comes
    /// first; with `parse_special` control-token texts such as `<|eot_id|>` become those
    /// tokens, otherwise they are tokenized as plain text (user-defined tokens are always
    /// matched, as in llama.cpp).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.bos);
        }
        let frags = special::partition(text, &self.vocab, &self.specials, parse_special);
        match &self.model {
            Model::Bpe {
                bpe,
                pre,
                ignore_merges,
            } => {
                for f in frags {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(t) => {
                            for word in pretokenize::split(*pre, t) {
                                bpe.encode_word(&self.vocab, word, *ignore_merges, &mut out);
                            }
                        }
                    }
                }
            }
            Model::Spm {
                spm,
                add_space_prefix,
            } => {
                // A space is put before raw text that opens the input or follows a special.
                let mut after_special = true;
                for f in frags {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 3);
                            if *add_space_prefix && after_special {
                                s.push(' ');
                            }
                            s.push_str(t);
                            let escaped = s.replace(' ', spm::SPACE);
                            spm.encode(&self.vocab, &escaped, &mut out)?;
                            after_special = false;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The text of `ids`: their piece bytes concatenated, as lossy UTF-8. Control tokens
    /// render as their text; ids out of range render as nothing.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes token `id` stands for: byte-level decoded for BPE, `▁` as space and
    /// `<0xNN>` as its byte for SPM, the text itself for control, user-defined and unknown
    /// tokens, nothing for unused tokens and ids out of range.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.pieces[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token (`tokenizer.ggml.eos_token_id`, or the model type's default).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token: `tokenizer.ggml.eot_token_id`, or found by text
    /// (`<|eot_id|>`, `<|im_end|>`, `<|end|>`, ...) as llama.cpp does.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// Whether prompts should start with BOS: `tokenizer.ggml.add_bos_token`, defaulting
    /// as llama.cpp does (true for SPM and the Llama-3 pre-tokenizer, false otherwise).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generating `id` ends generation: EOS, EOT, EOM, and the tokens llama.cpp finds
    /// by text (`<|eot_id|>`, `<|end|>`, `<|im_end|>`, `<|endoftext|>`, `<|end_of_text|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }

    /// Whether `id` is a control or unknown token (`<|eot_id|>`, `<unk>`, ...): its text
    /// marks structure and is not output text.
    pub fn is_control(&self, id: u32) -> bool {
        matches!(
            self.vocab.attrs.get(id as usize),
            Some(Attr::Control | Attr::Unknown)
        )
    }

    /// The id of the token whose text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    /// The pre-tokenizer in use; `None` for SPM vocabularies, which have none.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Bpe { pre, .. } => Some(*pre),
            Model::Spm { .. } => None,
        }
    }
}

/// The bytes each token stands for, as llama.cpp's `token_to_piece` with special rendering on.
fn build_pieces(vocab: &Vocab, byte_level: bool) -> (Vec<u8>, Vec<usize>) {
    let bytes = ByteLevel::new();
    let mut pieces = Vec::new();
    let mut offsets = Vec::with_capacity(vocab.len() + 1);
    offsets.push(0);
    for (text, &attr) in vocab.texts.iter().zip(&vocab.attrs) {
        match attr {
            Attr::Control | Attr::UserDefined | Attr::Unknown => {
                pieces.extend_from_slice(text.as_bytes())
            }
            Attr::Normal if byte_level => {
                // A char outside the byte table (not from a byte-level vocabulary) is kept as
                // its UTF-8 rather than llama.cpp's "[UNK_BYTE_..]" marker.
                for c in text.chars() {
                    match bytes.byte_of(c) {
                        Some(b) => pieces.push(b),
                        None => pieces.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
            }
            Attr::Normal => pieces.extend_from_slice(text.replace(spm::SPACE, " ").as_bytes()),
            Attr::Byte if !byte_level => pieces.extend(Spm::byte_of_token(text)),
            Attr::Byte | Attr::Unused | Attr::Undefined => {}
        }
        offsets.push(pieces.len());
    }
    (pieces, offsets)
}

/// The character that stands for byte `b` in GPT-2 byte-level token texts.
pub fn byte_to_unicode(b: u8) -> char {
    unicode::ByteLevel::new().char_of(b)
}
