//! Special-token partitioning, as llama.cpp's `tokenizer_st_partition`: before any
//! splitting, the text is cut at every occurrence of a special token's text.
//!
//! Special tokens are taken longest text first; for each, every raw-text fragment is split at
//! all its non-overlapping occurrences (left to right). Control and unknown tokens are only
//! matched when `parse_special` is set; user-defined tokens are always matched (llama.cpp
//! does the same). A token with the RSTRIP attribute also drops the white space (C
//! `isspace`) that follows it.

use super::vocab::{Attr, Vocab};

/// A piece of the input: raw text still to tokenize, or a token already matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// The special tokens of a vocabulary (control, user-defined, unknown), longest text first
/// (ties by id).
pub(crate) fn special_tokens(vocab: &Vocab) -> Vec<u32> {
    let mut ids: Vec<u32> = (0u32..)
        .zip(&vocab.attrs)
        .filter(|(_, a)| a.is_special())
        .map(|(id, _)| id)
        .collect();
    ids.sort_by(|&a, &b| {
        let (ta, tb) = (&vocab.texts[a as usize], &vocab.texts[b as usize]);
        tb.len().cmp(&ta.len()).then(a.cmp(&b))
    });
    ids
}

/// Splits `text` into fragments at the special tokens in `specials`.
pub(crate) fn partition<'a>(
    text: &'a str,
    vocab: &Vocab,
    specials: &[u32],
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(text));
    for &id in specials {
        let attr = vocab.attr(id);
        if !parse_special && matches!(attr, Attr::Control | Attr::Unknown) {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        if !text.contains(needle) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Text(t) = f else {
                next.push(f);
                continue;
            };
            let mut rest = 0;
            for (at, _) in t.match_indices(needle) {
                // A match inside white space an RSTRIP token dropped is not seen again.
                if at < rest {
                    continue;
                }
                if at > rest {
                    next.push(Fragment::Text(&t[rest..at]));
                }
                next.push(Fragment::Token(id));
                rest = at + needle.len();
                if vocab.rstrip[id as usize] {
                    let bytes = t.as_bytes();
                    while rest < bytes.len() && matches!(bytes[rest], b' ' | b'\t'..=b'\r') {
                        rest += 1;
                    }
                }
            }
            if rest < t.len() {
                next.push(Fragment::Text(&t[rest..]));
            }
        }
        frags = next;
    }
    frags
}
