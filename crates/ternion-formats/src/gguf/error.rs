//! What is wrong with a malformed GGUF file ([`GgufProblem`]) and where in the file it was
//! found ([`GgufPlace`]): the two halves of [`crate::Error::Gguf`].

use std::fmt;

use crate::quant::GgmlType;

/// Where in a GGUF file a problem was found. Displays as a prefix of the problem (empty for
/// the header, otherwise ending in `": "`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GgufPlace {
    /// The fixed header, or the file as a whole (duplicate names, overlapping tensors).
    Header,
    /// The key of the metadata entry at this index (the key itself did not read).
    MetadataKey {
        /// Index of the entry in file order.
        index: u64,
    },
    /// The type or value of a metadata entry.
    Metadata {
        /// The entry's key.
        key: String,
    },
    /// The name of the tensor info at this index (the name itself did not read).
    TensorName {
        /// Index of the tensor info in file order.
        index: u64,
    },
    /// The dimensions, type or offset of a tensor info.
    TensorInfo {
        /// The tensor's name.
        tensor: String,
    },
    /// A tensor whose type and shape were read: its size or its data's place in the file.
    Tensor {
        /// The tensor's name.
        tensor: String,
        /// Its storage type.
        ty: GgmlType,
        /// Its dimensions in ggml order.
        shape: Vec<u64>,
    },
}

impl fmt::Display for GgufPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufPlace::Header => Ok(()),
            GgufPlace::MetadataKey { index } => write!(f, "metadata entry {index}: key: "),
            GgufPlace::Metadata { key } => write!(f, "metadata '{key}': "),
            GgufPlace::TensorName { index } => write!(f, "tensor info {index}: name: "),
            GgufPlace::TensorInfo { tensor } => write!(f, "tensor '{tensor}': "),
            GgufPlace::Tensor { tensor, ty, shape } => {
                write!(f, "tensor '{tensor}' ({ty}, shape {shape:?}): ")
            }
        }
    }
}

/// What is wrong with a GGUF file.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GgufProblem {
    /// A header prefix handed to `parse_header` is longer than the file it claims to start.
    #[error("prefix of {prefix} bytes is longer than the file ({file_len} bytes)")]
    PrefixTooLong {
        /// Bytes in the prefix.
        prefix: u64,
        /// Bytes in the file.
        file_len: u64,
    },
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file (magic {magic:02x?})")]
    BadMagic {
        /// The first four bytes.
        magic: [u8; 4],
    },
    /// A format version other than 2 or 3.
    #[error("{}", version_message(*.version))]
    UnsupportedVersion {
        /// The version read.
        version: u32,
    },
    /// A read needs bytes past the end of the file.
    #[error("truncated: need {needed} bytes at offset {offset}, file has {file_len}")]
    Truncated {
        /// Bytes the read needs.
        needed: u64,
        /// Where the read starts.
        offset: u64,
        /// Bytes in the file.
        file_len: u64,
    },
    /// The header runs past the prefix read so far (`parse_header` asks for a longer one).
    #[error("the header runs past the {read} bytes read so far")]
    PastPrefix {
        /// Bytes of the prefix.
        read: u64,
    },
    /// A count (metadata entries, tensor infos, array elements) cannot fit the bytes left,
    /// even at the smallest encoding of each item.
    #[error("{count} {what} cannot fit in the {left} bytes left")]
    CountTooLarge {
        /// The count read.
        count: u64,
        /// What is counted, e.g. "tensor infos".
        what: &'static str,
        /// Bytes left in the file.
        left: u64,
    },
    /// A string's length runs past the end of the file.
    #[error("string length {len} runs past the end of the file ({left} bytes left)")]
    StringTooLong {
        /// The length read.
        len: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("unknown value type {type_id}")]
    UnknownValueType {
        /// The id read.
        type_id: u32,
    },
    /// An array element type id that GGUF does not define.
    #[error("unknown array element type {type_id}")]
    UnknownElementType {
        /// The id read.
        type_id: u32,
    },
    /// A boolean stored as a byte other than 0 or 1.
    #[error("invalid bool byte {byte}")]
    InvalidBool {
        /// The byte read.
        byte: u8,
    },
    /// Arrays nested deeper than the reader accepts.
    #[error("arrays nested deeper than {max}")]
    ArrayTooDeep {
        /// The deepest nesting accepted.
        max: usize,
    },
    /// The metadata arrays together hold more elements than the reader accepts.
    #[error("array of {len} elements exceeds the limit of {limit} metadata array elements in all")]
    TooManyElements {
        /// Elements of the array that went over.
        len: u64,
        /// Elements all metadata arrays may hold together.
        limit: u64,
    },
    /// Two metadata entries share a key.
    #[error("duplicate metadata key '{key}'")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a power of two in 1..=2^30.
    #[error("general.alignment must be a power of two, found {found}")]
    BadAlignment {
        /// A summary of the value found.
        found: String,
    },
    /// A tensor's number of dimensions is 0 or more than ggml allows.
    #[error("n_dims {n_dims} not in 1..={max}")]
    BadDimCount {
        /// The count read.
        n_dims: u32,
        /// The most allowed.
        max: usize,
    },
    /// A tensor dimension is 0 or larger than `i64::MAX`.
    #[error("dimension {dim} out of range")]
    DimensionOutOfRange {
        /// The dimension read.
        dim: u64,
    },
    /// Aligning the end of the header overflows.
    #[error("data offset overflows")]
    DataOffsetOverflow,
    /// The data section starts past the end of the file.
    #[error("truncated: data section starts at {data_offset} but the file has {file_len} bytes")]
    DataSectionPastEnd {
        /// Where the data section starts.
        data_offset: u64,
        /// Bytes in the file.
        file_len: u64,
    },
    /// A row is not a whole number of the type's blocks.
    #[error("row length {row} is not a multiple of the block size {block}")]
    RowNotWholeBlocks {
        /// Elements in a row.
        row: u64,
        /// Elements in a block.
        block: usize,
    },
    /// The tensor's byte size overflows.
    #[error("size overflows")]
    SizeOverflow,
    /// A tensor's offset is not a multiple of the file's alignment.
    #[error("offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The offset, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's absolute offset overflows.
    #[error("offset overflows")]
    OffsetOverflow,
    /// A tensor's end overflows.
    #[error("end overflows")]
    EndOverflow,
    /// A tensor's data lies (partly) past the end of the file.
    #[error("data [{start}, {end}) lies past the end of the file ({file_len} bytes)")]
    TruncatedTensorData {
        /// Absolute offset of the data.
        start: u64,
        /// Absolute end of the data.
        end: u64,
        /// Bytes in the file.
        file_len: u64,
    },
    /// Two tensors share a name.
    #[error("duplicate tensor name '{tensor}'")]
    DuplicateTensor {
        /// The name.
        tensor: String,
    },
    /// The tensor's data overlaps another tensor's (the place names the one that starts
    /// first).
    #[error("its data overlaps tensor '{other}' in the file")]
    Overlap {
        /// The tensor that starts inside it.
        other: String,
    },
    /// A header given whole was still read as a prefix too short to hold it.
    #[error("the header does not parse even from the whole file")]
    HeaderIncomplete,
    /// A ranged read (HTTP range request, browser `File` slice) returned another number of
    /// bytes than asked for.
    #[error("read of bytes {start}..{end} returned {got} bytes")]
    ShortRead {
        /// First byte asked for.
        start: u64,
        /// End of the range asked for.
        end: u64,
        /// Bytes returned.
        got: u64,
    },
}

/// The message of [`GgufProblem::UnsupportedVersion`]: version 1 is named as such, and a
/// version whose swapped bytes would be a known one suggests a big-endian file.
fn version_message(version: u32) -> String {
    if version == 1 {
        return "GGUF version 1 is not supported (only 2 and 3)".into();
    }
    let hint = if version.swap_bytes() <= 3 {
        " (a big-endian file?)"
    } else {
        ""
    };
    format!("unsupported GGUF version {version}{hint}; expected 2 or 3")
}
