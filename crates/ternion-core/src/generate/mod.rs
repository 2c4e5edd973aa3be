//! One generation core for every front end (CLI, server, browser): a sequence's state
//! machine ([`Stepper`]: prompt chunking, sampling, stop rules, streaming text, token
//! budget and context limit, its KV state) and the batched backend interface
//! ([`BatchBackend`]) the CPU and the GPU implement. Nothing here does I/O: a front end
//! asks each stepper for its next step, runs the steps through a backend, and hands every
//! stepper its row back.

mod admit;
mod batch;
mod chunking;
mod constraint;
mod rows;
mod stepper;
mod stop;

pub use admit::{check_room, check_step, StepLimits};
pub use batch::{BatchBackend, BatchStep, CpuBatch};
pub use chunking::{next_chunk, PREFILL_CHUNK};
pub use constraint::{allows, Constraint, Mask};
pub use rows::{Need, Row, Rows};
pub use stepper::{Advance, End, FinishReason, Stepper, StepperOptions};
pub use stop::{Filtered, StopFilter};
