//! I2_S: BitNet's 2-bit ternary format, x86 layout (QK = 128), one f32 scale per tensor.
pub const TAIL_BYTES: usize = 32;
