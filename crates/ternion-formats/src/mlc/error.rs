//! What is wrong with an MLC directory ([`MlcError`], inside [`crate::Error::Mlc`]) or
//! with the tokenizer files beside its weights ([`TokenizerFileError`], inside
//! [`crate::Error::Tokenizer`]). Each variant names the file or tensor it concerns.

use std::path::PathBuf;

use super::cache::{Stored, INDEX_FILES};

/// What is wrong with an MLC `q4f16_1` weight directory.
#[derive(Debug, thiserror::Error)]
pub enum MlcError {
    /// A JSON or tokenizer file is larger than the loader accepts.
    #[error("{file}: {bytes} bytes is more than the {max} accepted")]
    FileTooLarge {
        /// The file.
        file: String,
        /// Its size.
        bytes: u64,
        /// The most accepted.
        max: u64,
    },
    /// A JSON file does not parse into what the loader expects (the parser's message,
    /// shown in this message and so not also a `source`).
    #[error("{file}: invalid JSON: {error}")]
    InvalidJson {
        /// The file.
        file: String,
        /// The JSON parser's error.
        error: serde_json::Error,
    },
    /// The directory has no tensor-cache index.
    #[error(
        "{dir}: no {} or {} (the tensor index of an MLC directory)",
        INDEX_FILES[1],
        INDEX_FILES[0]
    )]
    NoIndex {
        /// The directory (a path, or a URL for the browser loader).
        dir: String,
    },
    /// A file the directory needs is not there.
    #[error("{file}: not found; an MLC directory needs it ({why})")]
    MissingFile {
        /// The file (a path, or a URL for the browser loader).
        file: String,
        /// What it is needed for.
        why: &'static str,
    },
    /// A shard of the index has a format other than `raw-shard`.
    #[error("{file}: shard '{shard}' has format '{format}' (only 'raw-shard' is known)")]
    ShardFormat {
        /// The index file.
        file: String,
        /// The shard's path.
        shard: String,
        /// Its format.
        format: String,
    },
    /// A shard path is not a plain file name inside the directory.
    #[error("{file}: shard path '{shard}' is not a file name inside the directory")]
    ShardPath {
        /// The index file.
        file: String,
        /// The shard's path.
        shard: String,
    },
    /// A record's dtype and format are not a pair the loader reads.
    #[error("{file}: tensor '{tensor}': unsupported dtype '{dtype}' with format '{format}'")]
    UnsupportedDtype {
        /// The index file.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: String,
        /// Its format.
        format: String,
    },
    /// A record's `nbytes` is not what its shape and dtype need.
    #[error(
        "{file}: tensor '{tensor}': nbytes {nbytes} does not match shape {shape:?} of {dtype}"
    )]
    NbytesMismatch {
        /// The index file.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its `nbytes`.
        nbytes: u64,
        /// Its shape.
        shape: Vec<u64>,
        /// Its dtype.
        dtype: String,
    },
    /// A record's bytes run past the end of its shard.
    #[error(
        "{file}: tensor '{tensor}': bytes {offset}..+{nbytes} run past shard '{shard}' \
         ({shard_bytes} bytes)"
    )]
    RecordPastShard {
        /// The index file.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its offset in the shard.
        offset: u64,
        /// Its size.
        nbytes: u64,
        /// The shard's path.
        shard: String,
        /// The shard's size.
        shard_bytes: u64,
    },
    /// Two records share a name.
    #[error("{file}: tensor '{tensor}' appears twice")]
    DuplicateTensor {
        /// The index file.
        file: String,
        /// The tensor.
        tensor: String,
    },
    /// A tensor the model needs is not in the index.
    #[error("tensor '{tensor}' is missing from the index")]
    MissingTensor {
        /// The tensor.
        tensor: String,
    },
    /// A shard file's length is not the one the index gives.
    #[error("{file}: shard is {len} bytes, the index says {expected}")]
    ShardLength {
        /// The shard file (a path, or a URL for the browser loader).
        file: String,
        /// Its length.
        len: u64,
        /// The index's `nbytes`.
        expected: u64,
    },
    /// `mlc-chat-config.json` holds a value the loader cannot use.
    #[error("{file}: {problem}")]
    Config {
        /// The configuration file.
        file: String,
        /// What is wrong in it.
        problem: ConfigProblem,
    },
    /// A norm tensor is not a float vector of the model width.
    #[error("tensor '{tensor}': expected a float vector of [{width}], found {stored:?} {shape:?}")]
    NormShape {
        /// The tensor.
        tensor: String,
        /// The model width.
        width: usize,
        /// How it is stored.
        stored: Stored,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A quantized weight's `q_weight`/`q_scale` pair does not have the shapes and dtypes
    /// its `n_out × n_in` size needs.
    #[error(
        "'{prefix}': expected q_weight uint32 [{n_out}, {}] and q_scale float16 [{n_out}, {}] \
         for a {n_out} × {n_in} weight, found {:?} {:?} and {:?} {:?}",
        .n_in / 8, .n_in / .group, .weight.0, .weight.1, .scale.0, .scale.1
    )]
    QuantShape {
        /// The weight's name prefix.
        prefix: String,
        /// Input width.
        n_in: u64,
        /// Output rows.
        n_out: u64,
        /// Elements per scale group.
        group: u64,
        /// How `q_weight` is stored, and its shape.
        weight: (Stored, Vec<u64>),
        /// How `q_scale` is stored, and its shape.
        scale: (Stored, Vec<u64>),
    },
    /// A weight's code and scale bytes do not agree with each other.
    #[error("'{tensor}': q_weight of {weight_bytes} bytes and q_scale of {scale_bytes} bytes do not agree")]
    QuantBytes {
        /// The GGUF tensor being made.
        tensor: String,
        /// Bytes of `q_weight`.
        weight_bytes: usize,
        /// Bytes of `q_scale`.
        scale_bytes: usize,
    },
    /// A 4-bit code 15 in a weight the loader typed as Q4_0 before reading it.
    #[error(
        "'{tensor}': a code 15, which MLC's q4f16_1 quantizer never writes (it clamps to \
         0..=14) and Q4_0 cannot hold; this loader fixed the type before reading the weights \
         (the native loader converts such a tensor to Q8_0)"
    )]
    Code15 {
        /// The MLC tensor holding the code.
        tensor: String,
    },
    /// A tensor of the GGUF being made has no conversion recipe.
    #[error("{dir}: no recipe for tensor '{tensor}'")]
    NoRecipe {
        /// The directory (a path, or a URL for the browser loader).
        dir: String,
        /// The GGUF tensor.
        tensor: String,
    },
    /// A conversion was handed the wrong number of inputs.
    #[error("'{tensor}': {given} inputs given, {expected} expected")]
    InputCount {
        /// The GGUF tensor being made.
        tensor: String,
        /// Inputs given.
        given: usize,
        /// Inputs the recipe names.
        expected: usize,
    },
}

/// What is wrong in an `mlc-chat-config.json`.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ConfigProblem {
    /// LongRoPE scaling (the 128k-context models), which the loader does not implement.
    #[error("model_config.rope_scaling is set (LongRoPE, the 128k models): not supported")]
    RopeScaling,
    /// A size is 0 or larger than the loader accepts.
    #[error("model_config.{key} = {value} is out of range 1..={max}")]
    OutOfRange {
        /// The key.
        key: &'static str,
        /// Its value.
        value: u32,
        /// The largest accepted.
        max: u32,
    },
    /// The head counts do not divide the width, or each other.
    #[error(
        "{n_head} heads do not divide hidden_size {n_embd}, or {n_head_kv} key/value heads \
         do not divide them"
    )]
    Heads {
        /// `hidden_size`.
        n_embd: usize,
        /// `num_attention_heads`.
        n_head: usize,
        /// `num_key_value_heads`.
        n_head_kv: usize,
    },
    /// `head_dim` disagrees with the width and head count.
    #[error(
        "model_config.head_dim {found:?} is not hidden_size / num_attention_heads = {head_dim}"
    )]
    HeadDim {
        /// The `head_dim` given.
        found: Option<u32>,
        /// The one the width and head count give.
        head_dim: usize,
    },
    /// `partial_rotary_factor` gives no, or an odd number of, rotated dimensions.
    #[error("partial_rotary_factor {factor} gives {n_rot} rotated dimensions of {head_dim}")]
    RotaryFactor {
        /// The factor.
        factor: f32,
        /// Rotated dimensions it gives.
        n_rot: usize,
        /// Dimensions per head.
        head_dim: usize,
    },
    /// The RoPE base is not a positive number.
    #[error("RoPE base {base} is not a positive number")]
    RopeBase {
        /// The base.
        base: f32,
    },
    /// `rms_norm_eps` is not a positive number.
    #[error("rms_norm_eps {eps} is not a positive number")]
    RmsEps {
        /// The epsilon.
        eps: f32,
    },
    /// A special-token id is not an unsigned 32-bit integer.
    #[error("{key} {value} is not a token id")]
    TokenId {
        /// The key, e.g. `bos_token_id`.
        key: String,
        /// The JSON value found.
        value: String,
    },
}

/// What is wrong with the tokenizer files beside MLC weights.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerFileError {
    /// `tokenizer.model` is not there.
    #[error(
        "{}: missing; the SentencePiece model is needed for its piece scores (tokenizer.json \
         has none)",
        .path.display()
    )]
    SpmMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// `tokenizer.model` is not a BPE model.
    #[error(
        "{file}: trainer model_type {model_type:?} is not BPE (the only SentencePiece kind \
         mapped)"
    )]
    NotBpe {
        /// The file.
        file: String,
        /// Its trainer's model type.
        model_type: Option<u64>,
    },
    /// `tokenizer.model` has more pieces than the vocabulary.
    #[error("{file}: {pieces} pieces for a vocab_size of {vocab}")]
    TooManyPieces {
        /// The file.
        file: String,
        /// Pieces in it.
        pieces: usize,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// A key of `added_tokens_decoder` is not a token id.
    #[error("{file}: added_tokens_decoder key '{key}' is not a token id")]
    AddedTokenKey {
        /// The file.
        file: String,
        /// The key.
        key: String,
    },
    /// An added token's id is past the vocabulary.
    #[error("{file}: added token '{content}' has id {id}, past the vocab_size {vocab}")]
    AddedTokenId {
        /// The file.
        file: String,
        /// The token's text.
        content: String,
        /// Its id.
        id: u64,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// `tokenizer.model` is not a protobuf message the loader can read.
    #[error("tokenizer.model: {0}")]
    Spm(SpmProblem),
}

/// Why a SentencePiece `tokenizer.model` does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpmProblem {
    /// The bytes end inside a varint.
    #[error("truncated varint")]
    TruncatedVarint,
    /// A varint has more than 10 bytes.
    #[error("varint longer than 10 bytes")]
    VarintTooLong,
    /// A field's length runs past the end of its message.
    #[error("field runs past the end")]
    FieldPastEnd,
    /// A wire type protobuf does not define (or a deprecated group).
    #[error("unsupported wire type {wire_type}")]
    WireType {
        /// The wire type.
        wire_type: u64,
    },
    /// `pieces` or `trainer_spec` is not length-delimited.
    #[error("pieces or trainer_spec is not a message")]
    NotAMessage,
    /// A piece's text is not UTF-8.
    #[error("a piece is not UTF-8")]
    PieceNotUtf8,
    /// A piece's field has a wire type other than its own.
    #[error("a piece field has the wrong wire type")]
    PieceWireType,
}
