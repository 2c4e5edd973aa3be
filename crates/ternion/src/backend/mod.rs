//! Compute backends.

pub mod cpu;
