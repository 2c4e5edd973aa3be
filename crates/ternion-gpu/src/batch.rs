//! The GPU implementation of [`BatchBackend`]: sequences are [`GpuSeq`]s of one
//! [`GpuModel`] (paged KV caches on the device), a step is one
//! [`GpuModel::forward_seqs`] (or its top-k variant, which reads back k pairs per
//! sequence instead of a vocabulary of floats, each selected under its step's token mask).

use crate::generate::{BatchBackend, BatchStep, Mask, Rows};
use crate::Result;
use crate::{GpuModel, GpuSeq, GpuSeqStep};

/// The GPU backend over a model loaded onto the device.
pub struct GpuBatch {
    gpu: Box<GpuModel>,
}

impl GpuBatch {
    /// Sequences of `gpu`.
    pub fn new(gpu: Box<GpuModel>) -> GpuBatch {
        GpuBatch { gpu }
    }

    /// The model on the device.
    pub fn gpu(&self) -> &GpuModel {
        &self.gpu
    }

    /// The model on the device, to run it outside the batch's sequences (its own sequence:
    /// embeddings).
    pub fn gpu_mut(&mut self) -> &mut GpuModel {
        &mut self.gpu
    }
}

impl BatchBackend for GpuBatch {
    type Seq = GpuSeq;

    fn new_seq(&mut self, _n_ctx: usize) -> Result<GpuSeq> {
        self.gpu.new_seq()
    }

    const FORKS: bool = true;

    fn fork(seq: &GpuSeq) -> Result<GpuSeq> {
        seq.fork()
    }

    fn pages(&self) -> (usize, usize) {
        self.gpu.kv_pages()
    }

    fn top_k(&self) -> usize {
        self.gpu.top_k()
    }

    fn masks_top(&self) -> bool {
        true
    }

    fn forward(&mut self, steps: &mut [BatchStep<'_, GpuSeq>], top: bool) -> Result<Rows<'_>> {
        let masks: Vec<Option<&Mask>> = steps.iter().map(|s| s.mask).collect();
        let steps: Vec<GpuSeqStep<'_>> = steps
            .iter()
            .map(|s| GpuSeqStep {
                seq: &*s.seq,
                tokens: s.tokens,
            })
            .collect();
        if top && self.gpu.top_k() > 0 {
            self.gpu
                .forward_seqs_topk_masked(&steps, &masks)
                .map(Rows::Top)
        } else {
            let vocab = self.gpu.config().n_vocab;
            self.gpu
                .forward_seqs(&steps)
                .map(|l| Rows::Logits(l, vocab))
        }
    }
}
