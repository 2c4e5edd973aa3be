//! Unicode facts the pre-tokenizers need, as llama.cpp's `unicode.cpp` defines them, and the
//! GPT-2 byte <-> unicode mapping used by byte-level BPE.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// The coarse class of one code point, as llama.cpp's hand-written splitters see it.
/// White space wins over the general category (llama.cpp checks `is_whitespace` first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Unicode `White_Space` property.
    Space,
    /// General category L (Lu, Ll, Lt, Lm, Lo).
    Letter,
    /// General category N (Nd, Nl, No).
    Number,
    /// Anything else, unassigned code points included.
    Other,
}

/// The class of a code point.
pub(crate) fn class(c: char) -> Class {
    if c.is_whitespace() {
        return Class::Space;
    }
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            Class::Letter
        } else if c.is_ascii_digit() {
            Class::Number
        } else {
            Class::Other
        };
    }
    match get_general_category(c) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => Class::Letter,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

/// General category P (any punctuation), the `\p{P}` of llama.cpp's regexes.
pub(crate) fn is_punctuation(c: char) -> bool {
    matches!(
        get_general_category(c),
        Gc::ConnectorPunctuation
            | Gc::DashPunctuation
            | Gc::OpenPunctuation
            | Gc::ClosePunctuation
            | Gc::InitialPunctuation
            | Gc::FinalPunctuation
            | Gc::OtherPunctuation
    )
}

/// GPT-2's reversible byte <-> char mapping: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes take the code points 256..=323 in byte order.
pub(crate) struct ByteLevel {
    to_char: [char; 256],
    from_cp: [Option<u8>; 324],
}

impl ByteLevel {
    /// Builds both directions of the table.
    pub(crate) fn new() -> Self {
        let mut to_char = ['\0'; 256];
        let mut from_cp = [None; 324];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let cp = if printable {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            to_char[usize::from(b)] =
                char::from_u32(cp).expect("code points below 0x144 are valid");
            from_cp[cp as usize] = Some(b);
        }
        ByteLevel { to_char, from_cp }
    }

    /// The char that stands for `b` in byte-level token texts.
    pub(crate) fn char_of(&self, b: u8) -> char {
        self.to_char[usize::from(b)]
    }

    /// The byte a byte-level char stands for, or `None` for a char outside the mapping.
    pub(crate) fn byte_of(&self, c: char) -> Option<u8> {
        self.from_cp.get(c as usize).copied().flatten()
    }
}
