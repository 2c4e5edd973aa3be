//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the merge table and the merge loop of
//! llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! Each word from the pre-tokenizer is byte-encoded (GPT-2 byte -> char table), split into
//! chars, and adjacent symbols are merged lowest merge rank first (ties: leftmost first) with
//! a priority queue over a linked list of symbols, so a word of n chars costs O(n log n).
//! Strings are interned: every token text and every merge part gets a piece id, so the queue
//! works on integer pairs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::unicode::ByteLevel;
use super::vocab::Vocab;
use crate::{Result, TokenizerError};

const NONE: usize = usize::MAX;
const NO_PIECE: u32 = u32::MAX;

/// The merge table of a byte-level BPE vocabulary.
pub(crate) struct Bpe {
    /// Merge parts and results that are not token texts, with ids from `n_vocab` up.
    extra: HashMap<String, u32>,
    /// (left piece, right piece) -> (rank, merged piece). The first of duplicate merges wins.
    merges: HashMap<(u32, u32), (u32, u32)>,
    bytes: ByteLevel,
}

impl Bpe {
    /// Parses `"left right"` merge strings (rank = index). A merge with no space after its
    /// first byte, or an empty side, can never apply and is skipped, as in llama.cpp.
    pub(crate) fn new(vocab: &Vocab, merges: &[&str]) -> Result<Bpe> {
        let mut bpe = Bpe {
            extra: HashMap::new(),
            merges: HashMap::with_capacity(merges.len()),
            bytes: ByteLevel::new(),
        };
        let rank_limit = u32::try_from(merges.len())
            .map_err(|_| TokenizerError::TooManyMerges { len: merges.len() })?;
        for (rank, m) in (0..rank_limit).zip(merges) {
            if m.is_empty() {
                return Err(TokenizerError::EmptyMerge { rank }.into());
            }
            let Some(space) = m.as_bytes()[1..].iter().position(|&b| b == b' ') else {
                continue;
            };
            let (left, right) = (&m[..space + 1], &m[space + 2..]);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let l = bpe.intern(vocab, left)?;
            let r = bpe.intern(vocab, right)?;
            let merged = bpe.intern(vocab, &format!("{left}{right}"))?;
            bpe.merges.entry((l, r)).or_insert((rank, merged));
        }
        Ok(bpe)
    }

    fn intern(&mut self, vocab: &Vocab, s: &str) -> Result<u32> {
        if let Some(id) = self.piece(vocab, s) {
            return Ok(id);
        }
        let id = u32::try_from(vocab.len() + self.extra.len())
            .ok()
            .filter(|&id| id != NO_PIECE)
            .ok_or(TokenizerError::TooManyMergeStrings)?;
        self.extra.insert(s.to_owned(), id);
        Ok(id)
    }

    fn piece(&self, vocab: &Vocab, s: &str) -> Option<u32> {
        vocab.id(s).or_else(|| self.extra.get(s).copied())
    }

    /// Byte-encodes one pre-tokenized word and appends its token ids to `out`.
    /// With `ignore_merges`, a word that is itself a token is taken whole.
    pub(crate) fn encode_word(
        &self,
        vocab: &Vocab,
        word: &str,
        ignore_merges: bool,
        out: &mut Vec<u32>,
    ) {
        let mapped: String = word.bytes().map(|b| self.bytes.char_of(b)).collect();
        if ignore_merges {
            if let Some(id) = vocab.id(&mapped) {
                out.push(id);
                return;
            }
        }
        self.merge(vocab, &mapped, out);
    }

    fn merge(&self, vocab: &Vocab, w: &str, out: &mut Vec<u32>) {
        struct Sym {
            start: usize,
            len: usize,
            piece: u32,
            prev: usize,
            next: usize,
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(w.len());
        for (start, c) in w.char_indices() {
            let len = c.len_utf8();
            let n = syms.len();
            syms.push(Sym {
                start,
                len,
                piece: self
                    .piece(vocab, &w[start..start + len])
                    .unwrap_or(NO_PIECE),
                prev: if n == 0 { NONE } else { n - 1 },
                next: if start + len == w.len() { NONE } else { n + 1 },
            });
        }
        // (rank, left, right, merged length, merged piece): lowest rank, then leftmost.
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            let (a, b) = (&syms[l], &syms[r]);
            if a.piece == NO_PIECE || b.piece == NO_PIECE {
                return;
            }
            if let Some(&(rank, merged)) = self.merges.get(&(a.piece, b.piece)) {
                queue.push(Reverse((rank, l, r, a.len + b.len, merged)));
            }
        };
        for i in 1..syms.len() {
            push(&mut queue, &syms, i - 1, i);
        }
        while let Some(Reverse((_, l, r, len, merged))) = queue.pop() {
            // Outdated when either side was merged since: llama.cpp compares the texts.
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != len {
                continue;
            }
            syms[l].len = len;
            syms[l].piece = merged;
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
            match usize::try_from(s.piece) {
                Ok(p) if p < vocab.len() => out.push(s.piece),
                _ => {
                    // No token for this symbol: llama.cpp looks its bytes up one by one.
                    for &b in &w.as_bytes()[s.start..s.start + s.len] {
                        if let Some(id) = b.is_ascii().then(|| vocab.id(&(b as char).to_string())) {
                            out.extend(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}
