//! A bounds-checked little-endian reader over a GGUF file's bytes (or a prefix of them):
//! every count, length and nesting depth is checked against the bytes left before it is
//! used.

use std::cell::Cell;

use super::error::GgufProblem;
use super::value::{Value, ValueType};

/// Deepest nesting of arrays inside arrays that the reader accepts.
const MAX_ARRAY_DEPTH: usize = 4;

/// Most array elements all metadata values may hold together. Array lengths are already
/// bounded by the bytes left, but a decoded element takes 32 bytes of memory while a u8 or
/// bool element takes 1 byte of file: without a total, a 1 GiB file could ask for 32 GiB.
/// Real files hold a few million at most (vocabulary, scores, types, merges).
pub const MAX_METADATA_ELEMENTS: u64 = 1 << 24;

/// A bounds-checked little-endian reader over the file's bytes (or a prefix of them).
pub(super) struct Cursor<'a> {
    /// The bytes at hand: the whole file, or a prefix of it.
    buf: &'a [u8],
    /// Length of the whole file: counts and lengths are bounded by it.
    len: u64,
    /// Set when a read needed bytes of the file past the end of `buf`.
    short: &'a Cell<bool>,
    pos: usize,
    /// Array elements the metadata may still hold ([`MAX_METADATA_ELEMENTS`] in all).
    elements_left: u64,
}

type R<T> = std::result::Result<T, GgufProblem>;

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`, the first bytes of a file of `len` bytes; `short`
    /// is set when a read needs bytes past the end of `buf`.
    pub(super) fn new(buf: &'a [u8], len: u64, short: &'a Cell<bool>) -> Self {
        Cursor {
            buf,
            len,
            short,
            pos: 0,
            elements_left: MAX_METADATA_ELEMENTS,
        }
    }

    /// Bytes read so far.
    pub(super) fn pos(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.len - self.pos as u64
    }

    pub(super) fn bytes(&mut self, n: u64) -> R<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufProblem::Truncated {
                needed: n,
                offset: self.pos as u64,
                file_len: self.len,
            });
        }
        if n > (self.buf.len() - self.pos) as u64 {
            self.short.set(true);
            return Err(GgufProblem::PastPrefix {
                read: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        Ok(self.bytes(N as u64)?.try_into().expect("length checked"))
    }

    pub(super) fn u32(&mut self) -> R<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(super) fn u64(&mut self) -> R<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(super) fn check_count(&self, n: u64, min_each: u64, what: &'static str) -> R<()> {
        match n.checked_mul(min_each) {
            Some(b) if b <= self.remaining() => Ok(()),
            _ => Err(GgufProblem::CountTooLarge {
                count: n,
                what,
                left: self.remaining(),
            }),
        }
    }

    pub(super) fn string(&mut self) -> R<String> {
        let len = self.u64()?;
        if len > self.remaining() {
            return Err(GgufProblem::StringTooLong {
                len,
                left: self.remaining(),
            });
        }
        Ok(String::from_utf8_lossy(self.bytes(len)?).into_owned())
    }

    pub(super) fn value(&mut self, type_id: u32, depth: usize) -> R<Value> {
        let ty = ValueType::from_id(type_id).ok_or(GgufProblem::UnknownValueType { type_id })?;
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>()?[0]),
            ValueType::I8 => Value::I8(self.array::<1>()?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => Value::U32(self.u32()?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array()?)),
            ValueType::Bool => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                byte => return Err(GgufProblem::InvalidBool { byte }),
            },
            ValueType::Str => Value::Str(self.string()?),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array()?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufProblem::ArrayTooDeep {
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let elem_id = self.u32()?;
                let elem = ValueType::from_id(elem_id)
                    .ok_or(GgufProblem::UnknownElementType { type_id: elem_id })?;
                let len = self.u64()?;
                self.check_count(len, elem.min_encoded_len(), "array elements")?;
                self.elements_left =
                    self.elements_left
                        .checked_sub(len)
                        .ok_or(GgufProblem::TooManyElements {
                            len,
                            limit: MAX_METADATA_ELEMENTS,
                        })?;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_id, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}
