//! The CPU backend: kernels for each op of the forward pass, threaded with rayon.

mod attention;
mod linear;
mod norm;
mod rope;
pub mod simd;

pub use attention::{attention, AttnShape};
pub use linear::{Linear, QuantInput};
pub use norm::rms_norm;
pub use rope::rope_neox;
