//! The activation buffers of a CPU forward pass, one per [`ActId`] of the graph.

use crate::model::graph::ActId;

/// The activation buffers of a step.
#[derive(Default)]
pub(super) struct Acts {
    pub(super) bufs: Vec<Vec<f32>>,
    pub(super) rows: Vec<usize>,
    /// Bumped on every write of an activation, so cached quantized inputs know they are stale.
    pub(super) version: Vec<u64>,
}

impl Acts {
    /// Makes room for `n` activations (once per graph).
    pub(super) fn ensure(&mut self, n: usize) {
        if self.bufs.len() != n {
            self.bufs = vec![Vec::new(); n];
            self.rows = vec![0; n];
            self.version = vec![0; n];
        }
    }

    /// The buffer of `a`, resized to `rows × width` and marked as rewritten.
    pub(super) fn write(&mut self, a: ActId, rows: usize, width: usize) -> &mut [f32] {
        self.rows[a.0] = rows;
        self.modify(a, rows * width)
    }

    /// The first `len` values of `a`'s buffer for an in-place update.
    pub(super) fn modify(&mut self, a: ActId, len: usize) -> &mut [f32] {
        self.version[a.0] += 1;
        let buf = &mut self.bufs[a.0];
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        &mut buf[..len]
    }
}
