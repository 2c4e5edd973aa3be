//! SentencePiece `tokenizer.model`: the few protobuf fields a vocabulary needs.
//!
//! `ModelProto` (sentencepiece_model.proto): field 1 `pieces` (repeated `SentencePiece`:
//! 1 `piece` string, 2 `score` float, 3 `type` enum NORMAL=1 UNKNOWN=2 CONTROL=3
//! USER_DEFINED=4 UNUSED=5 BYTE=6), field 2 `trainer_spec` (its field 3 `model_type`:
//! UNIGRAM=1 BPE=2 WORD=3 CHAR=4). Every other field is skipped by wire type.

use super::error::{SpmProblem, TokenizerFileError};
use crate::{Error, Result};

/// SentencePiece's piece types (the numbering llama.cpp's token types share).
pub mod piece_type {
    /// An ordinary piece.
    pub const NORMAL: i32 = 1;
    /// The unknown piece.
    pub const UNKNOWN: i32 = 2;
    /// A control piece (`<s>`).
    pub const CONTROL: i32 = 3;
    /// A user-defined piece.
    pub const USER_DEFINED: i32 = 4;
    /// An unused piece.
    pub const UNUSED: i32 = 5;
    /// A byte-fallback piece (`<0x41>`).
    pub const BYTE: i32 = 6;
}

/// The trainer's `model_type` for BPE.
pub const MODEL_BPE: u64 = 2;

/// One vocabulary entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// Text (`▁` for spaces).
    pub piece: String,
    /// Merge priority.
    pub score: f32,
    /// Type ([`piece_type`]).
    pub kind: i32,
}

/// The pieces of a model and its trainer's model type (when the file gives one).
pub struct SpmModel {
    /// Pieces in id order.
    pub pieces: Vec<Piece>,
    /// `trainer_spec.model_type`.
    pub model_type: Option<u64>,
}

fn err(problem: SpmProblem) -> Error {
    TokenizerFileError::Spm(problem).into()
}

/// A protobuf reader over one message's bytes.
struct Wire<'a> {
    b: &'a [u8],
}

/// A field's value by wire type.
enum Field<'a> {
    Varint(u64),
    Fixed32([u8; 4]),
    Bytes(&'a [u8]),
    Other,
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self
                .b
                .split_first()
                .ok_or_else(|| err(SpmProblem::TruncatedVarint))?;
            self.b = rest;
            v |= u64::from(byte & 0x7F) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(err(SpmProblem::VarintTooLong))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.b.len())
            .ok_or_else(|| err(SpmProblem::FieldPastEnd))?;
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    /// The next (field number, value), or `None` at the end.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>> {
        if self.b.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Other
            }
            2 => {
                let n = self.varint()?;
                Field::Bytes(self.take(n)?)
            }
            5 => {
                let b = self.take(4)?;
                Field::Fixed32([b[0], b[1], b[2], b[3]])
            }
            wire_type => return Err(err(SpmProblem::WireType { wire_type })),
        };
        Ok(Some((key >> 3, value)))
    }
}

/// Parses a `tokenizer.model`.
pub fn parse(bytes: &[u8]) -> Result<SpmModel> {
    let mut w = Wire { b: bytes };
    let mut pieces = Vec::new();
    let mut model_type = None;
    while let Some((field, value)) = w.next()? {
        match (field, value) {
            (1, Field::Bytes(b)) => pieces.push(parse_piece(b)?),
            (2, Field::Bytes(b)) => {
                let mut t = Wire { b };
                while let Some((f, v)) = t.next()? {
                    if let (3, Field::Varint(m)) = (f, v) {
                        model_type = Some(m);
                    }
                }
            }
            (1 | 2, _) => return Err(err(SpmProblem::NotAMessage)),
            _ => {}
        }
    }
    Ok(SpmModel { pieces, model_type })
}

fn parse_piece(b: &[u8]) -> Result<Piece> {
    let mut w = Wire { b };
    let mut p = Piece {
        piece: String::new(),
        score: 0.0,
        kind: piece_type::NORMAL,
    };
    while let Some((field, value)) = w.next()? {
        match (field, value) {
            (1, Field::Bytes(s)) => {
                p.piece = std::str::from_utf8(s)
                    .map_err(|_| err(SpmProblem::PieceNotUtf8))?
                    .to_string();
            }
            (2, Field::Fixed32(f)) => p.score = f32::from_le_bytes(f),
            (3, Field::Varint(t)) => p.kind = i32::try_from(t).unwrap_or(i32::MAX),
            (1..=3, _) => return Err(err(SpmProblem::PieceWireType)),
            _ => {}
        }
    }
    Ok(p)
}

/// Encodes `pieces` and a BPE trainer spec as a `tokenizer.model` (for test directories).
pub fn encode(pieces: &[Piece]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn bytes_field(out: &mut Vec<u8>, field: u64, b: &[u8]) {
        varint(out, field << 3 | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
    let mut out = Vec::new();
    for p in pieces {
        let mut m = Vec::new();
        bytes_field(&mut m, 1, p.piece.as_bytes());
        varint(&mut m, 2 << 3 | 5);
        m.extend_from_slice(&p.score.to_le_bytes());
        varint(&mut m, 3 << 3);
        varint(&mut m, p.kind as u64);
        bytes_field(&mut out, 1, &m);
    }
    let mut trainer = Vec::new();
    varint(&mut trainer, 3 << 3);
    varint(&mut trainer, MODEL_BPE);
    bytes_field(&mut out, 2, &trainer);
    out
}
