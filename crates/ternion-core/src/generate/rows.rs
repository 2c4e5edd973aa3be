//! What a forward step hands back to each sequence: a whole logits row, the backend's
//! top-k pairs, or the backend's argmax alone.

use crate::backend::cpu::Workspace;
use crate::model::graph::Graph;

/// The least a sequence's sampler needs from a step's row (see [`Stepper::need`]).
///
/// [`Stepper::need`]: super::Stepper::need
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Plain greedy decoding: the argmax alone.
    Argmax,
    /// The backend's top-k pairs draw exactly as the whole row.
    Top,
    /// The whole logits row (penalties, or sampling past the top-k).
    Logits,
}

/// One sequence's result of a forward step.
#[derive(Clone, Copy, Debug)]
pub enum Row<'a> {
    /// Its whole logits row.
    Logits(&'a [f32]),
    /// The best (id, logit) pairs of its row, best first (a GPU top-k).
    Top(&'a [(u32, f32)]),
    /// The argmax of its row (given only where [`Need::Argmax`] was asked for).
    Argmax(u32),
}

impl Row<'_> {
    /// The best token of the row (the lowest id among equal logits).
    pub fn best(&self) -> u32 {
        match *self {
            Row::Logits(logits) => crate::sample::argmax(logits),
            Row::Top(top) => top.first().map_or(0, |t| t.0),
            Row::Argmax(id) => id,
        }
    }
}

/// The rows of one batched forward step, one per sequence in step order.
pub enum Rows<'a> {
    /// The CPU workspace's rows, where the graph put them (not copied).
    Cpu(&'a Workspace, &'a Graph),
    /// `n_vocab` logits per sequence, back to back.
    Logits(Vec<f32>, usize),
    /// The top-k pairs of each sequence.
    Top(Vec<Vec<(u32, f32)>>),
}

impl Rows<'_> {
    /// The row of the `i`-th sequence of the step.
    pub fn get(&self, i: usize) -> Row<'_> {
        match self {
            Rows::Cpu(ws, graph) => Row::Logits(ws.logits(graph, i)),
            Rows::Logits(l, vocab) => Row::Logits(&l[i * vocab..(i + 1) * vocab]),
            Rows::Top(t) => Row::Top(&t[i]),
        }
    }

    /// True when sampling a row is cheap (k pairs, not a vocabulary of logits).
    pub fn is_top(&self) -> bool {
        matches!(self, Rows::Top(_))
    }
}
