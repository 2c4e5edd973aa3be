//! Pre-tokenizers: split text into words before BPE, exactly as llama.cpp's `unicode.cpp` does.
//!
//! llama.cpp runs a list of regexes in turn; each one splits every piece left by the one
//! before, keeping the text between matches as pieces of their own. The GPT-2 and Llama-3
//! regexes are hand-written splitters there (`unicode_regex_split_custom_gpt2/llama3`); the
//! other stages of the "default" list go through `std::regex`. This module writes each stage
//! as a splitter over the code points of one piece: a piece never looks past its own ends.

use super::unicode::{class, is_punctuation, Class};
use super::PreTokenizer;

/// One regex stage: splits a piece and appends the lengths (in code points) of its parts.
type Stage = fn(&[char], &mut Vec<usize>);

/// Splits `text` into words (as sub-slices of `text`) with the given pre-tokenizer.
pub(crate) fn split(pre: PreTokenizer, text: &str) -> Vec<&str> {
    let cpts: Vec<char> = text.chars().collect();
    let mut lens = vec![cpts.len()];
    let stages: &[Stage] = match pre {
        PreTokenizer::Llama3 => &[split_llama3],
        PreTokenizer::Qwen2 => &[split_qwen2],
        PreTokenizer::Gpt2 => &[split_gpt2],
        PreTokenizer::SmolLm => &[split_digits, split_gpt2],
        PreTokenizer::Default => &[
            split_default_punct,
            split_gpt2,
            split_numbers,
            split_ascii_digit_triples,
        ],
    };
    for stage in stages {
        let mut next = Vec::with_capacity(lens.len());
        let mut start = 0;
        for &len in &lens {
            stage(&cpts[start..start + len], &mut next);
            start += len;
        }
        lens = next;
    }
    let offsets: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let mut words = Vec::with_capacity(lens.len());
    let mut cpt = 0;
    for len in lens {
        words.push(&text[offsets[cpt]..offsets[cpt + len]]);
        cpt += len;
    }
    words
}

/// A piece of text seen by one splitter: reads outside it answer `None`.
struct Piece<'a> {
    c: &'a [char],
    start: usize,
    out: &'a mut Vec<usize>,
}

impl Piece<'_> {
    fn get(&self, i: usize) -> Option<char> {
        self.c.get(i).copied()
    }

    fn class(&self, i: usize) -> Option<Class> {
        self.get(i).map(class)
    }

    fn is(&self, i: usize, want: Class) -> bool {
        self.class(i) == Some(want)
    }

    /// `[^\s\p{L}\p{N}]`: in range and of class Other.
    fn is_other(&self, i: usize) -> bool {
        self.is(i, Class::Other)
    }

    /// Emits the text from the last emitted end up to `end` (nothing when empty).
    fn emit(&mut self, end: usize) {
        if end > self.start {
            self.out.push(end - self.start);
        }
        self.start = end;
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d`, case-sensitive or not: the length of a contraction at `pos`.
fn contraction(p: &Piece, pos: usize, fold: bool) -> Option<usize> {
    if p.get(pos) != Some('\'') {
        return None;
    }
    let low = |i: usize| {
        p.get(i)
            .map(|c| if fold { c.to_ascii_lowercase() } else { c })
    };
    match low(pos + 1)? {
        's' | 't' | 'm' | 'd' => Some(2),
        a => match (a, low(pos + 2)?) {
            ('r', 'e') | ('v', 'e') | ('l', 'l') => Some(3),
            _ => None,
        },
    }
}

/// Whitespace at the current position: `\s+(?!\S)` then `\s+`. Returns the new position.
fn whitespace_run(p: &Piece, pos: usize) -> Option<usize> {
    let mut n = 0;
    while p.is(pos + n, Class::Space) {
        n += 1;
    }
    if n > 1 && p.get(pos + n).is_some() {
        Some(pos + n - 1)
    } else if n > 0 {
        Some(pos + n)
    } else {
        None
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(c: &[char], out: &mut Vec<usize>) {
    let mut p = Piece { c, start: 0, out };
    let mut pos = 0;
    while pos < c.len() {
        if let Some(n) = contraction(&p, pos, false) {
            pos += n;
            p.emit(pos);
            continue;
        }
        let lead = usize::from(c[pos] == ' ');
        let first = p.class(pos + lead);
        let run = match first {
            Some(Class::Letter) | Some(Class::Number) => first,
            Some(Class::Other) => Some(Class::Other),
            _ => None,
        };
        if let Some(want) = run {
            pos += lead;
            while p.is(pos, want) {
                pos += 1;
            }
            p.emit(pos);
            continue;
        }
        pos = whitespace_run(&p, pos).unwrap_or(pos + 1);
        p.emit(pos);
    }
}

/// Llama-3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn split_llama3(c: &[char], out: &mut Vec<usize>) {
    split_llama3_like(c, out, 3);
}

/// Qwen2: the Llama-3 regex with `\p{N}` (one digit per word) for `\p{N}{1,3}`.
fn split_qwen2(c: &[char], out: &mut Vec<usize>) {
    split_llama3_like(c, out, 1);
}

/// The Llama-3 regex with digit runs of at most `max_digits`.
fn split_llama3_like(c: &[char], out: &mut Vec<usize>, max_digits: usize) {
    let mut p = Piece { c, start: 0, out };
    let mut pos = 0;
    while pos < c.len() {
        let cpt = c[pos];
        let cls = class(cpt);
        if let Some(n) = contraction(&p, pos, true) {
            pos += n;
            p.emit(pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == '\r' || cpt == '\n' || cls == Class::Number)
            && (cls == Class::Letter || p.is(pos + 1, Class::Letter))
        {
            pos += 1;
            while p.is(pos, Class::Letter) {
                pos += 1;
            }
            p.emit(pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if cls == Class::Number {
            let mut ini = pos;
            while p.is(pos, Class::Number) {
                pos += 1;
                if pos - ini >= max_digits {
                    p.emit(pos);
                    ini = pos;
                }
            }
            p.emit(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let lead = usize::from(cpt == ' ');
        if p.is_other(pos + lead) {
            pos += lead;
            while p.is_other(pos) {
                pos += 1;
            }
            while matches!(p.get(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            p.emit(pos);
            continue;
        }
        // \s*[\r\n]+ : the longest whitespace run that ends in \r or \n.
        let mut n = 0;
        let mut last_newline_end = None;
        while p.is(pos + n, Class::Space) {
            if matches!(c[pos + n], '\r' | '\n') {
                last_newline_end = Some(pos + n + 1);
            }
            n += 1;
        }
        if let Some(end) = last_newline_end {
            pos = end;
            p.emit(pos);
            continue;
        }
        pos = whitespace_run(&p, pos).unwrap_or(pos + 1);
        p.emit(pos);
    }
}

/// Splits a piece into maximal runs of code points that do / do not satisfy `pred`: what a
/// `[class]+` regex stage does when the text between matches is kept.
fn split_runs(c: &[char], out: &mut Vec<usize>, pred: impl Fn(char) -> bool) {
    let mut i = 0;
    while i < c.len() {
        let inside = pred(c[i]);
        let start = i;
        while i < c.len() && pred(c[i]) == inside {
            i += 1;
        }
        out.push(i - start);
    }
}

/// Default stage 1, `[\p{P}\$\+<=>\^~\|]+` (white space never matches: llama.cpp collapses it
/// to a vertical tab before running `std::regex`).
fn split_default_punct(c: &[char], out: &mut Vec<usize>) {
    split_runs(c, out, |ch| {
        !ch.is_whitespace() && (is_punctuation(ch) || "$+<=>^~|".contains(ch))
    });
}

/// `\p{N}`: every digit a piece of its own (the first stage of SmolLM / StarCoder).
fn split_digits(c: &[char], out: &mut Vec<usize>) {
    let mut p = Piece { c, start: 0, out };
    for (i, &ch) in c.iter().enumerate() {
        if class(ch) == Class::Number {
            p.emit(i);
            p.emit(i + 1);
        }
    }
    p.emit(c.len());
}

/// Default stage 3, `\p{N}+`.
fn split_numbers(c: &[char], out: &mut Vec<usize>) {
    split_runs(c, out, |ch| class(ch) == Class::Number);
}

/// Default stage 4, `[0-9][0-9][0-9]`: leftmost non-overlapping triples of ASCII digits.
fn split_ascii_digit_triples(c: &[char], out: &mut Vec<usize>) {
    let mut p = Piece { c, start: 0, out };
    let mut pos = 0;
    while pos + 3 <= c.len() {
        if c[pos..pos + 3].iter().all(char::is_ascii_digit) {
            p.emit(pos);
            pos += 3;
            p.emit(pos);
        } else {
            pos += 1;
        }
    }
    p.emit(c.len());
}
