//! The CPU backend: kernels for each op of the forward pass, run on a worker pool started
//! once (see [`pool`]).

mod acts;
mod attention;
mod bandwidth;
mod exec;
mod handoff;
mod huge;
mod linear;
mod norm;
pub mod op_profile;
mod pass;
pub mod pool;
mod quant_input;
mod rope;
pub mod simd;
mod ternary;
mod unary;

pub use attention::{
    attention, attention_rows, attention_scratch, AttnShape, Contiguous, Heads, KvRows, QueryRow,
};
pub use bandwidth::{measure_read_bandwidth, ReadProbe};
pub use exec::{CpuModel, CpuState, SeqStep, Workspace};
pub use handoff::handoff_ns;
pub(crate) use huge::{HugeBuf, Lifetime};
pub use linear::{requantize_rows, requantized_row_bytes, Linear};
pub use norm::{layer_norm, rms_norm};
pub use quant_input::QuantInput;
pub use rope::{rope, rope_neox, MAX_ROT};
pub(crate) use rope::{rotate_rows, RopeAngles};
pub use unary::{add_rows, gelu_ggml, gelu_tanh_f32};
