//! The GPU backend of the engine: the model loaded onto the device, with the fault
//! injection the tests use to check a real device loss end to end, and the choice of
//! constrained sequences' rows ([`EngineConfig::gpu_mask`]).

use ternion::generate::{BatchBackend, BatchStep, Rows};
use ternion::model::Model;

use super::EngineConfig;
use crate::error::StartError;

/// Loads `model` onto GPU adapter `index` (`None`: the default one) for `cfg`'s sequences.
pub(super) fn gpu(
    cfg: &EngineConfig,
    model: &Model,
    n_ctx: usize,
    prefill_per_step: usize,
    index: Option<usize>,
) -> Result<Gpu, StartError> {
    use std::sync::Arc;
    use ternion::backend::gpu::{GpuContext, GpuModel, GpuModelOptions, GpuOptions, MAX_TOPK};
    use ternion::generate::{GpuBatch, PREFILL_CHUNK};
    let opts = GpuOptions {
        device_index: index,
        ..GpuOptions::default()
    };
    let ctx = GpuContext::new(&opts).map_err(|e| StartError::Gpu {
        what: "opening the GPU",
        error: Box::new(e),
    })?;
    // One step holds a prompt budget's chunk and a token of every other sequence; the
    // samplers read back the top-k candidates when they allow it. A non-causal model's
    // embedding input runs as one step: a step then holds a whole context.
    let step = prefill_per_step.min(PREFILL_CHUNK) + cfg.max_active;
    let gopts = GpuModelOptions {
        n_ctx,
        max_batch: if model.graph().attn.causal {
            step
        } else {
            step.max(n_ctx)
        },
        max_seqs: cfg.max_active,
        kv_pages: cfg.kv_pages,
        top_k: MAX_TOPK,
        ..GpuModelOptions::default()
    };
    let gpu = GpuModel::from_model(Arc::new(ctx), model, gopts).map_err(|e| StartError::Gpu {
        what: "loading the model onto the GPU",
        error: Box::new(e),
    })?;
    let lose_after = std::env::var("TERNION_TEST_GPU_LOST_AFTER")
        .ok()
        .and_then(|v| v.parse().ok());
    Ok(Gpu {
        batch: GpuBatch::new(Box::new(gpu)),
        lose_after,
        mask: cfg.gpu_mask,
    })
}

/// The GPU backend, which destroys its device before `lose_after` more steps when the
/// test variable `TERNION_TEST_GPU_LOST_AFTER` sets it.
pub(super) struct Gpu {
    batch: ternion::generate::GpuBatch,
    lose_after: Option<u64>,
    /// Select constrained sequences' top-k under their masks (else they read back whole
    /// rows).
    mask: bool,
}

/// Embeddings run on the model's own sequence of the GPU plan, between two steps.
impl super::EngineBackend for Gpu {
    fn hidden(&mut self) -> Option<&mut dyn ternion::embed::HiddenStates> {
        Some(self.batch.gpu_mut())
    }
}

impl BatchBackend for Gpu {
    type Seq = ternion::backend::gpu::GpuSeq;

    fn new_seq(&mut self, n_ctx: usize) -> ternion::Result<Self::Seq> {
        self.batch.new_seq(n_ctx)
    }

    const FORKS: bool = <ternion::generate::GpuBatch as BatchBackend>::FORKS;

    fn fork(seq: &Self::Seq) -> ternion::Result<Self::Seq> {
        <ternion::generate::GpuBatch as BatchBackend>::fork(seq)
    }

    fn pages(&self) -> (usize, usize) {
        self.batch.pages()
    }

    fn top_k(&self) -> usize {
        self.batch.top_k()
    }

    fn masks_top(&self) -> bool {
        self.mask && self.batch.masks_top()
    }

    fn forward(
        &mut self,
        steps: &mut [BatchStep<'_, Self::Seq>],
        top: bool,
    ) -> ternion::Result<Rows<'_>> {
        if let Some(n) = &mut self.lose_after {
            if *n == 0 {
                self.batch.gpu().context().device.destroy();
            }
            *n = n.saturating_sub(1);
        }
        if !self.mask {
            for s in steps.iter_mut() {
                s.mask = None;
            }
        }
        self.batch.forward(steps, top)
    }
}
