//! Compute backends: the CPU one here, the GPU one in the `ternion-gpu` crate.

pub mod cpu;
