//! The block-format trait: what one weight storage format is (block shape, the activation
//! format its products read, dequantization, quantization, a scalar reference dot and its
//! GPU decode include), and [`Format`], the value form of it that the registry
//! ([`super::format`]) hands to the CPU and GPU backends. Layouts: docs/FORMATS.md.

use super::GgmlType;

/// The form the activations of a product take before they meet the weights (ggml's
/// `vec_dot_type` of the weight format, or BitNet's per-token int8 for I2_S).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// f32 as they are.
    F32,
    /// f32, rounded to F16 on single-token steps (ggml's single-token F16 numerics).
    F16,
    /// f32 rounded to BF16.
    BF16,
    /// BitNet's int8 per token with one f32 scale and the code sum (I2_S).
    PerToken,
    /// ggml Q8_0: int8 per 32 with an F16-rounded scale.
    Q8_0,
    /// ggml Q8_1: int8 per 32 with an F16-rounded scale `d` and F16-rounded `s = d·Σq`.
    Q8_1,
    /// ggml Q8_K: int8 per 256 with an f32 scale.
    Q8K,
}

/// A row quantizer: f32 elements in, the format's bytes out.
pub type Quantizer = fn(&[f32], &mut [u8]);
/// A reference dot against Q8_1 activations: `(row, q, d, s)`.
pub type Q8_1Dot = fn(&[u8], &[i8], &[f32], &[f32]) -> f32;

/// A scalar reference dot of one weight row with one activation row. Its variant is the
/// activation format the weight format pairs with, so the pairing is written once.
#[derive(Clone, Copy, Debug)]
pub enum RefDot {
    /// `(row, x)` with f32 activations as they are.
    F32(fn(&[u8], &[f32]) -> f32),
    /// `(row, x)`, `x` already rounded as [`ActFormat::F16`] says.
    F16(fn(&[u8], &[f32]) -> f32),
    /// `(row, x)`, `x` already rounded to BF16.
    BF16(fn(&[u8], &[f32]) -> f32),
    /// `(row, q) -> Σ code·q` (integer; the caller applies the token and tensor scales).
    PerToken(fn(&[u8], &[i8]) -> i32),
    /// `(row, q, d)` with Q8_0 activations.
    Q8_0(fn(&[u8], &[i8], &[f32]) -> f32),
    /// `(row, q, d, s)` with Q8_1 activations.
    Q8_1(Q8_1Dot),
    /// `(row, q, d)` with Q8_K activations.
    Q8K(fn(&[u8], &[i8], &[f32]) -> f32),
}

impl RefDot {
    /// The activation format this dot reads.
    pub const fn act(&self) -> ActFormat {
        match self {
            RefDot::F32(_) => ActFormat::F32,
            RefDot::F16(_) => ActFormat::F16,
            RefDot::BF16(_) => ActFormat::BF16,
            RefDot::PerToken(_) => ActFormat::PerToken,
            RefDot::Q8_0(_) => ActFormat::Q8_0,
            RefDot::Q8_1(_) => ActFormat::Q8_1,
            RefDot::Q8K(_) => ActFormat::Q8K,
        }
    }
}

/// Panics unless `bytes` hold exactly `elems` elements of whole blocks of `ty`
/// (`block_elems` elements in `block_bytes` bytes): the row check of every format module.
pub(crate) fn check_row(
    ty: GgmlType,
    block_elems: usize,
    block_bytes: usize,
    bytes: usize,
    elems: usize,
) {
    assert_eq!(
        elems % block_elems,
        0,
        "{ty}: {elems} elements is not whole blocks"
    );
    assert_eq!(
        bytes,
        elems / block_elems * block_bytes,
        "{ty}: {bytes} bytes do not hold {elems} elements"
    );
}

/// The codes `code(block, j)` of every block of `src` (`block_bytes`-byte blocks of
/// `block_elems` elements, F16 scale first) in element order, and the block scales: the
/// `codes_row` of the formats the CPU repacks (Q1_0, Q2_0, Q4_0, Q8_0).
///
/// # Panics
/// If `scales` does not hold one value per block of `codes`.
pub(crate) fn block_codes(
    src: &[u8],
    (block_bytes, block_elems): (usize, usize),
    code: impl Fn(&[u8], usize) -> u8,
    codes: &mut [u8],
    scales: &mut [f32],
) {
    assert_eq!(scales.len(), codes.len() / block_elems, "block scale count");
    for ((block, out), s) in src
        .chunks_exact(block_bytes)
        .zip(codes.chunks_exact_mut(block_elems))
        .zip(scales.iter_mut())
    {
        *s = super::float::f16_at(block, 0);
        for (j, o) in out.iter_mut().enumerate() {
            *o = code(block, j);
        }
    }
}

/// Implements [`BlockFormat`] for the unit type `$name` of a format module, from the
/// module's `BLOCK_ELEMS`, `BLOCK_BYTES` and `dequantize_row`.
macro_rules! block_format {
    ($(#[$doc:meta])* $name:ident, $ty:ident, $dot:expr, $quant:expr, $wgsl:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl $crate::quant::format::BlockFormat for $name {
            const TYPE: $crate::quant::GgmlType = $crate::quant::GgmlType::$ty;
            const BLOCK_ELEMS: usize = BLOCK_ELEMS;
            const BLOCK_BYTES: usize = BLOCK_BYTES;
            const DOT: $crate::quant::format::RefDot = $dot;
            const QUANTIZE: Option<$crate::quant::format::Quantizer> = $quant;
            const WGSL: Option<&'static str> = $wgsl;
            fn dequantize_row(src: &[u8], dst: &mut [f32]) {
                dequantize_row(src, dst)
            }
        }
    };
}
pub(crate) use block_format;

/// A weight storage format, implemented by one unit type per format module.
pub trait BlockFormat {
    /// The ggml type it stores.
    const TYPE: GgmlType;
    /// Elements per block.
    const BLOCK_ELEMS: usize;
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// The scalar reference dot (and with it the activation format).
    const DOT: RefDot;
    /// ggml's reference quantizer of a row of whole blocks, where the module has one.
    const QUANTIZE: Option<Quantizer>;
    /// The WGSL include of `qmatvec.wgsl` that decodes this format (`None`: no GPU
    /// matmul kernel reads it as stored).
    const WGSL: Option<&'static str>;
    /// Dequantizes a row of whole blocks (`dst.len()` elements, `src` exactly its bytes).
    /// I2_S rows come out as codes − 1 (its scale is per tensor).
    fn dequantize_row(src: &[u8], dst: &mut [f32]);
}

/// One format's entry in the registry: [`BlockFormat`] as a value.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// The ggml type.
    pub ty: GgmlType,
    /// Elements per block.
    pub block_elems: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// The reference dot.
    pub dot: RefDot,
    /// Row quantizer, if any.
    pub quantize: Option<Quantizer>,
    /// Row dequantizer.
    pub dequantize: fn(&[u8], &mut [f32]),
    /// GPU decode include, if any.
    pub wgsl: Option<&'static str>,
}

impl Format {
    /// The entry of format `F`.
    pub const fn of<F: BlockFormat>() -> Format {
        Format {
            ty: F::TYPE,
            block_elems: F::BLOCK_ELEMS,
            block_bytes: F::BLOCK_BYTES,
            dot: F::DOT,
            quantize: F::QUANTIZE,
            dequantize: F::dequantize_row,
            wgsl: F::WGSL,
        }
    }

    /// The activation format it pairs with.
    pub const fn act(&self) -> ActFormat {
        self.dot.act()
    }
}
