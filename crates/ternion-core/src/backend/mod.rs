//! Compute backends.

pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
