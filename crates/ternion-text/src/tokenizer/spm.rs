//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session`: start from single chars, repeatedly merge the adjacent pair
//! whose concatenation is the token with the highest score (ties: leftmost), then emit each
//! symbol as its token or, failing that, as `<0xNN>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;
use crate::{Result, TokenizerError};

const NONE: usize = usize::MAX;

/// The byte-fallback table of an SPM vocabulary.
pub(crate) struct Spm {
    /// The token of each byte value.
    byte_tokens: Box<[Option<u32>]>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// Highest score first, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}

/// `▁` (U+2581), SentencePiece's escaped space.
pub(crate) const SPACE: &str = "\u{2581}";

impl Spm {
    /// Finds the `<0xNN>` token of every byte (or, as llama.cpp falls back to, the token
    /// whose text is the byte itself).
    pub(crate) fn new(vocab: &Vocab) -> Spm {
        let byte_tokens = (0..=255u8)
            .map(|b| {
                vocab
                    .id(&format!("<0x{b:02X}>"))
                    .or_else(|| b.is_ascii().then(|| vocab.id(&(b as char).to_string()))?)
            })
            .collect();
        Spm { byte_tokens }
    }

    /// The byte a `<0xNN>` token stands for, from its text.
    pub(crate) fn byte_of_token(text: &str) -> Option<u8> {
        let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
        u8::from_str_radix(hex, 16).ok()
    }

    /// Tokenizes already escaped text (spaces replaced by `▁`) and appends the ids to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) -> Result<()> {
        struct Sym {
            start: usize,
            len: usize,
            prev: usize,
            next: usize,
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let len = c.len_utf8();
            let n = syms.len();
            syms.push(Sym {
                start,
                len,
                prev: if n == 0 { NONE } else { n - 1 },
                next: if start + len == text.len() {
                    NONE
                } else {
                    n + 1
                },
            });
        }
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Bigram>, syms: &[Sym], l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let len = syms[l].len + syms[r].len;
            let start = syms[l].start;
            if let Some(id) = vocab.id(&text[start..start + len]) {
                queue.push(Bigram {
                    score: vocab.scores[id as usize],
                    left: l,
                    right: r,
                    len,
                });
            }
        };
        for i in 1..syms.len() {
            push(&mut queue, &syms, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (b.left, b.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.len {
                continue;
            }
            syms[l].len = b.len;
            syms[r].len = 0;
            let next = syms[r].next;
            syms[l].next = next;
            if next != NONE {
                syms[next].prev = l;
            }
            push(&mut queue, &syms, syms[l].prev, l);
            push(&mut queue, &syms, l, next);
        }
        let mut i = if syms.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = &syms[i];
            let piece = &text[s.start..s.start + s.len];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        out.push(self.byte_tokens[usize::from(b)].ok_or_else(|| {
                            TokenizerError::NoByteToken {
                                byte: b,
                                piece: piece.to_string(),
                            }
                        })?);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }
}
