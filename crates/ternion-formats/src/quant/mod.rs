//! Tensor storage formats: the ggml type table and one module per block format.
//!
//! Every format module holds its layout constants, `dequantize_row`, `quantize_row` (where
//! ggml's is simple), a scalar reference dot product and its [`BlockFormat`] impl; [`format`]
//! is the registry. Layouts, pairings and their upstream sources: docs/FORMATS.md. Sizes here are the *true* byte sizes; BitNet's I2_S lies in
//! ggml's generic table (it claims one byte per element) and is special-cased.

/// ggml tensor types that can appear in a GGUF tensor table, with their on-disk ids.
///
/// Ids 36..=39 are BitNet's (I2_S, I8_S, TL1, TL2); upstream ggml later reused them for other
/// types, so a file is read with BitNet's meaning.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    IQ4_NL,
    IQ4_XS,
    TQ1_0,
    TQ2_0,
    I2_S,
    Q1_0,
    Q2_0,
}

/// (type, ggml id, name, elements per block, bytes per block).
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::I2_S, 36, "I2_S", 128, 32),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
    (GgmlType::Q2_0, 42, "Q2_0", 64, 18),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every GgmlType has a table row")
    }

    /// The type for a ggml id, or `None` for ids this build does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// Every type this build knows.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.0)
    }

    /// The ggml id stored in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The ggml name ("Q4_K", "I2_S", ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (the row length must be a multiple of it).
    pub fn block_elems(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }

    /// Bytes of one row of `n` elements, or `None` if `n` is not a whole number of blocks
    /// or the size overflows u64. For I2_S this is the packed size only (rows are
    /// contiguous, the tensor tail is extra).
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }

    /// The true byte size of a tensor of this type and shape (ggml order, `shape[0]`
    /// contiguous), or `None` on overflow or when `shape[0]` is not a whole number of blocks.
    /// I2_S adds its 32-byte tail that holds the per-tensor scale.
    pub fn tensor_bytes(self, shape: &[u64]) -> Option<u64> {
        let n0 = *shape.first().unwrap_or(&1);
        let rows = shape
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        let bytes = self.row_bytes(n0)?.checked_mul(rows)?;
        match self {
            GgmlType::I2_S => bytes.checked_add(i2s::TAIL_BYTES as u64),
            _ => Some(bytes),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub mod act;
pub mod float;
pub mod format;
pub mod i2s;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod q1_0;
pub mod q2_0;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod tq1_0;
pub mod tq2_0;

#[cfg(test)]
mod tests;

pub use format::{ActFormat, BlockFormat, Format, RefDot};

use crate::{Error, Result};

/// Why a row of a tensor cannot be dequantized (inside [`Error::TensorRow`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RowProblem {
    /// The output slice is not one row long.
    #[error("output holds {output} elements, the row has {row}")]
    OutputLength {
        /// Elements the output holds.
        output: usize,
        /// Elements in a row.
        row: usize,
    },
    /// Rows of no elements.
    #[error("rows of 0 elements")]
    EmptyRows,
    /// A row is not a whole number of blocks.
    #[error("row length {row} is not a multiple of the block size {block}")]
    NotWholeBlocks {
        /// Elements in a row.
        row: usize,
        /// Elements in a block.
        block: usize,
    },
    /// The tensor's bytes are not whole rows (plus the I2_S tail).
    #[error("{bytes} bytes are not whole rows of {row_bytes} bytes plus the {tail}-byte tail")]
    NotWholeRows {
        /// Bytes of the tensor.
        bytes: usize,
        /// Bytes of a row.
        row_bytes: usize,
        /// Bytes after the rows.
        tail: usize,
    },
    /// The row asked for is past the last one.
    #[error("row {row} is out of range ({rows} rows of {row_bytes} bytes)")]
    RowOutOfRange {
        /// The row asked for.
        row: usize,
        /// Rows in the tensor.
        rows: usize,
        /// Bytes of a row.
        row_bytes: usize,
    },
}

/// Whether `ty` stores ternary weights {−1, 0, +1}·scale (I2_S, TQ1_0, TQ2_0).
pub fn is_ternary(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::I2_S | GgmlType::TQ1_0 | GgmlType::TQ2_0)
}

/// The registry: the [`Format`] of every type this build multiplies and dequantizes, or
/// `None`. One arm per type and no wildcard, so a type added to [`GgmlType`] must be
/// placed here; the CPU linear layer and the GPU format tables are derived from it.
pub fn format(ty: GgmlType) -> Option<&'static Format> {
    match ty {
        GgmlType::F32 => Some(const { &Format::of::<float::F32>() }),
        GgmlType::F16 => Some(const { &Format::of::<float::F16>() }),
        GgmlType::BF16 => Some(const { &Format::of::<float::BF16>() }),
        GgmlType::Q4_0 => Some(const { &Format::of::<q4_0::Q4_0>() }),
        GgmlType::Q4_1 => Some(const { &Format::of::<q4_1::Q4_1>() }),
        GgmlType::Q5_0 => Some(const { &Format::of::<q5_0::Q5_0>() }),
        GgmlType::Q5_1 => Some(const { &Format::of::<q5_1::Q5_1>() }),
        GgmlType::Q8_0 => Some(const { &Format::of::<q8_0::Q8_0>() }),
        GgmlType::Q8_1 => None,
        GgmlType::Q2_K => Some(const { &Format::of::<q2_k::Q2K>() }),
        GgmlType::Q3_K => Some(const { &Format::of::<q3_k::Q3K>() }),
        GgmlType::Q4_K => Some(const { &Format::of::<q4_k::Q4K>() }),
        GgmlType::Q5_K => Some(const { &Format::of::<q5_k::Q5K>() }),
        GgmlType::Q6_K => Some(const { &Format::of::<q6_k::Q6K>() }),
        GgmlType::Q8_K => None,
        GgmlType::I8 => None,
        GgmlType::I16 => None,
        GgmlType::I32 => None,
        GgmlType::I64 => None,
        GgmlType::F64 => None,
        GgmlType::TQ1_0 => Some(const { &Format::of::<tq1_0::TQ1_0>() }),
        GgmlType::TQ2_0 => Some(const { &Format::of::<tq2_0::TQ2_0>() }),
        GgmlType::I2_S => Some(const { &Format::of::<i2s::I2S>() }),
        GgmlType::IQ4_NL => Some(const { &Format::of::<iq4_nl::IQ4NL>() }),
        GgmlType::IQ4_XS => Some(const { &Format::of::<iq4_xs::IQ4XS>() }),
        GgmlType::Q1_0 => Some(const { &Format::of::<q1_0::Q1_0>() }),
        GgmlType::Q2_0 => Some(const { &Format::of::<q2_0::Q2_0>() }),
    }
}

/// Every type the registry holds, in [`GgmlType`] table order.
pub fn supported() -> impl Iterator<Item = &'static Format> {
    TABLE.iter().filter_map(|r| format(r.0))
}

/// Dequantizes row `row` (of `n_per_row` elements) of a whole tensor's bytes `tensor` into
/// `dst`. For I2_S, `tensor` must be the complete tensor, tail included: the scale is read
/// from it.
///
/// Types outside the registry ([`format`]) give [`Error::UnsupportedType`]; a row length
/// that is not whole blocks, a `dst` of the wrong length or a row past the end of the data
/// give [`Error::TensorRow`].
pub fn dequantize_row(
    ty: GgmlType,
    tensor_name: &str,
    tensor: &[u8],
    n_per_row: usize,
    row: usize,
    dst: &mut [f32],
) -> Result<()> {
    let fmt = format(ty).ok_or_else(|| Error::UnsupportedType {
        tensor: tensor_name.to_string(),
        type_id: ty.id(),
        type_name: ty.name().to_string(),
    })?;
    let bad = |problem: RowProblem| Error::TensorRow {
        tensor: tensor_name.to_string(),
        ty,
        problem,
    };
    if dst.len() != n_per_row {
        return Err(bad(RowProblem::OutputLength {
            output: dst.len(),
            row: n_per_row,
        }));
    }
    if n_per_row == 0 {
        return Err(bad(RowProblem::EmptyRows));
    }
    let row_bytes = ty.row_bytes(n_per_row as u64).ok_or_else(|| {
        bad(RowProblem::NotWholeBlocks {
            row: n_per_row,
            block: ty.block_elems(),
        })
    })? as usize;
    let data_bytes = match ty {
        GgmlType::I2_S => tensor
            .len()
            .checked_sub(i2s::TAIL_BYTES)
            .filter(|packed| packed % row_bytes == 0)
            .ok_or_else(|| {
                bad(RowProblem::NotWholeRows {
                    bytes: tensor.len(),
                    row_bytes,
                    tail: i2s::TAIL_BYTES,
                })
            })?,
        _ => tensor.len(),
    };
    let start = row.checked_mul(row_bytes);
    let src = match start.and_then(|s| Some(s..s.checked_add(row_bytes)?)) {
        Some(range) if range.end <= data_bytes => &tensor[range],
        _ => {
            return Err(bad(RowProblem::RowOutOfRange {
                row,
                rows: data_bytes / row_bytes,
                row_bytes,
            }))
        }
    };
    if ty == GgmlType::I2_S {
        i2s::dequantize_row(src, i2s::tensor_scale(tensor, data_bytes * 4), dst);
    } else {
        (fmt.dequantize)(src, dst);
    }
    Ok(())
}
