//! Text embeddings: the model's final hidden states — after the output norm, before the LM
//! head (llama.cpp's `result_norm` / `t_embd`) — pooled over the tokens of one input.
//!
//! Pooling comes from `{arch}.pooling_type` (0 none: one vector per token, 1 mean, 2 CLS:
//! the first token, 3 last; 4 rank is a reranker head and is refused). A file without the
//! key is pooled by the mean here; llama.cpp would leave it unpooled (`none`) and its
//! `/v1/embeddings` then refuses the model, so the mean is the choice that serves it.
//! Vectors are L2-normalised by default, as llama.cpp's embedding example and server do
//! (`--embd-normalize 2`). Attention is causal unless the file says
//! `{arch}.attention.causal = false`; the whole input then runs as one pass so every token
//! sees every other. When the vocabulary asks for it (`tokenizer.ggml.add_eos_token`), the
//! EOS token ends each input, as last-token pooling expects.
//!
//! The hidden states come from a [`HiddenStates`] backend: the CPU ([`CpuHidden`]) or a GPU
//! plan run without its LM head (`ternion-gpu`), fed in chunks as prompts are cut; the
//! pooling and normalisation here are the same for every backend.

use crate::backend::cpu::CpuState;
use crate::generate::{next_chunk, PREFILL_CHUNK};
use crate::model::graph::{ActId, Graph, Op};
use crate::model::{Logits, Model};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// How the per-token hidden states of one input become its embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// No pooling: one vector per token.
    None,
    /// The mean over the tokens.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
}

/// Names accepted by [`Pooling::parse`].
pub const POOLING_NAMES: &[&str] = &["none", "mean", "cls", "last"];

impl Pooling {
    /// The pooling of a GGUF `pooling_type` code.
    pub fn from_code(code: u32) -> Result<Pooling> {
        Self::from_code_of("pooling_type", code)
    }

    /// [`Pooling::from_code`] naming the metadata key `key` in the error.
    fn from_code_of(key: &str, code: u32) -> Result<Pooling> {
        match code {
            0 => Ok(Pooling::None),
            1 => Ok(Pooling::Mean),
            2 => Ok(Pooling::Cls),
            3 => Ok(Pooling::Last),
            other => Err(Error::unsupported(
                key,
                match other {
                    4 => "4 (rank: a reranker head)".to_owned(),
                    n => n.to_string(),
                },
                ["0 none", "1 mean", "2 cls", "3 last"],
                "",
            )),
        }
    }

    /// The pooling `model`'s file asks for; mean when it has no `{arch}.pooling_type`.
    pub fn of_model(model: &Model) -> Result<Pooling> {
        let key = format!("{}.pooling_type", model.config().arch_name);
        match model.file().get_u32(&key)? {
            Some(code) => Pooling::from_code_of(&key, code),
            None => Ok(Pooling::Mean),
        }
    }

    /// Parses one of [`POOLING_NAMES`].
    pub fn parse(name: &str) -> Result<Pooling> {
        match name {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            _ => Err(Error::unsupported("pooling", name, POOLING_NAMES, "")),
        }
    }

    /// Pools `hidden` (`n × width`, one row per token, n ≥ 1) into one vector, or into
    /// `n` vectors for [`Pooling::None`].
    pub fn apply(self, hidden: &[f32], width: usize) -> Vec<Vec<f32>> {
        let rows = hidden.chunks_exact(width);
        let n = rows.len();
        match self {
            Pooling::None => rows.map(<[f32]>::to_vec).collect(),
            Pooling::Cls => rows.take(1).map(<[f32]>::to_vec).collect(),
            Pooling::Last => rows
                .skip(n.saturating_sub(1))
                .map(<[f32]>::to_vec)
                .collect(),
            Pooling::Mean => {
                let mut sum = vec![0f64; width];
                for r in rows {
                    sum.iter_mut().zip(r).for_each(|(s, &x)| *s += f64::from(x));
                }
                vec![sum.iter().map(|s| (s / n as f64) as f32).collect()]
            }
        }
    }
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The LM head of `graph`: its op's index and its input (the normed final hidden state).
fn lm_head(graph: &Graph) -> Result<(usize, ActId)> {
    graph
        .ops
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, op)| match op {
            Op::Linear { x, out, .. } if *out == graph.logits => Some((i, *x)),
            _ => None,
        })
        .ok_or_else(|| Error::Model("the forward pass has no LM head to strip".into()))
}

/// `graph` without its LM head: the ops up to the matrix product that writes the logits,
/// whose input (the normed final hidden state) becomes the output. The weights are kept,
/// so the graph runs over the weights bound for `graph`.
pub fn embedding_graph(graph: &Graph) -> Result<Graph> {
    let (at, hidden) = lm_head(graph)?;
    let mut g = graph.clone();
    g.ops.truncate(at);
    g.logits = hidden;
    Ok(g)
}

/// A backend that computes the final hidden states of one input at a time: the CPU
/// ([`CpuHidden`]) or a GPU plan (`ternion-gpu`'s `GpuModel`). [`Embedder`] cuts an input
/// into chunks of at most [`HiddenStates::max_chunk`] tokens (never leaving one token
/// alone, as prompts are cut: `generate::next_chunk`) and pools the rows; a non-causal
/// model runs each input as one chunk.
pub trait HiddenStates {
    /// Most positions of one input.
    fn n_ctx(&self) -> usize;
    /// Most tokens one [`HiddenStates::extend`] takes.
    fn max_chunk(&self) -> usize;
    /// Starts a new input of `n` tokens (the previous input's positions are forgotten).
    fn begin(&mut self, n: usize) -> Result<()>;
    /// Runs `tokens` at the positions after those of this input so far and appends their
    /// post-norm hidden rows (`tokens.len() × dim`) to `out`.
    fn extend(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()>;
    /// Forgets the input (frees its cache).
    fn end(&mut self);
}

impl<T: HiddenStates + ?Sized> HiddenStates for &mut T {
    fn n_ctx(&self) -> usize {
        (**self).n_ctx()
    }

    fn max_chunk(&self) -> usize {
        (**self).max_chunk()
    }

    fn begin(&mut self, n: usize) -> Result<()> {
        (**self).begin(n)
    }

    fn extend(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        (**self).extend(tokens, out)
    }

    fn end(&mut self) {
        (**self).end()
    }
}

/// The CPU's [`HiddenStates`]: the model's [`embedding_graph`] over its CPU weights, one
/// KV cache per input.
pub struct CpuHidden<'m> {
    model: &'m Model,
    graph: Graph,
    state: Option<CpuState>,
}

impl<'m> CpuHidden<'m> {
    /// The hidden states of `model` on the CPU.
    pub fn new(model: &'m Model) -> Result<Self> {
        Ok(CpuHidden {
            model,
            graph: embedding_graph(model.graph())?,
            state: None,
        })
    }
}

impl HiddenStates for CpuHidden<'_> {
    fn n_ctx(&self) -> usize {
        self.model.config().n_ctx_train
    }

    fn max_chunk(&self) -> usize {
        PREFILL_CHUNK
    }

    fn begin(&mut self, n: usize) -> Result<()> {
        self.state = Some(self.model.cpu_state(n));
        Ok(())
    }

    fn extend(&mut self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let st = self
            .state
            .as_mut()
            .ok_or_else(|| Error::Request("hidden states asked before an input began".into()))?;
        let rows = self
            .model
            .forward_cpu_graph(&self.graph, tokens, Logits::All, st)?;
        out.extend_from_slice(rows);
        Ok(())
    }

    fn end(&mut self) {
        self.state = None;
    }
}

/// Computes embeddings with a model on a [`HiddenStates`] backend (the CPU's by default).
pub struct Embedder<'a> {
    backend: Box<dyn HiddenStates + 'a>,
    pooling: Pooling,
    normalize: bool,
    add_eos: bool,
    dim: usize,
    causal: bool,
    n_ctx: usize,
}

impl<'a> Embedder<'a> {
    /// An embedder for `model` on the CPU: pooling as the file says unless `pooling` is
    /// given, and L2-normalised vectors when `normalize`.
    pub fn new(model: &'a Model, pooling: Option<Pooling>, normalize: bool) -> Result<Self> {
        Self::with_backend(model, Box::new(CpuHidden::new(model)?), pooling, normalize)
    }

    /// [`Embedder::new`] computing the hidden states of `model` on `backend` (the same
    /// model bound to another device).
    pub fn with_backend(
        model: &Model,
        backend: Box<dyn HiddenStates + 'a>,
        pooling: Option<Pooling>,
        normalize: bool,
    ) -> Result<Self> {
        let pooling = match pooling {
            Some(p) => p,
            None => Pooling::of_model(model)?,
        };
        let add_eos = model
            .file()
            .get_bool("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false);
        let graph = model.graph();
        let (_, hidden) = lm_head(graph)?;
        Ok(Embedder {
            n_ctx: model.config().n_ctx_train.min(backend.n_ctx()),
            backend,
            pooling,
            normalize,
            add_eos,
            dim: graph.acts[hidden.0].width,
            causal: graph.attn.causal,
        })
    }

    /// The pooling used.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Values per vector.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The token ids of `text`: BOS when the vocabulary adds one, EOS at the end when
    /// `tokenizer.ggml.add_eos_token` says so (special-token text is not parsed).
    pub fn tokenize(&self, tok: &Tokenizer, text: &str) -> Result<Vec<u32>> {
        let mut ids = tok.encode(text, tok.add_bos(), false)?;
        if let Some(eos) = tok.eos_id().filter(|_| self.add_eos) {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// The per-token hidden states of `tokens` (`n × dim`), unpooled and unnormalised.
    pub fn hidden_states(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Request("cannot embed an empty input".into()));
        }
        if tokens.len() > self.n_ctx {
            return Err(Error::ContextFull {
                used: 0,
                new: tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        // Every token of a non-causal input sees every other: one pass.
        let max = if self.causal {
            self.backend.max_chunk()
        } else {
            tokens.len()
        };
        let mut rows = Vec::with_capacity(tokens.len() * self.dim);
        self.backend.begin(tokens.len())?;
        let mut done = 0;
        let run = loop {
            let n = next_chunk(tokens.len() - done, max, usize::MAX);
            if n == 0 {
                break Ok(());
            }
            if let Err(e) = self.backend.extend(&tokens[done..done + n], &mut rows) {
                break Err(e);
            }
            done += n;
        };
        self.backend.end();
        run.map(|()| rows)
    }

    /// The embedding of `tokens`: one vector, or one per token for [`Pooling::None`].
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let hidden = self.hidden_states(tokens)?;
        let mut out = self.pooling.apply(&hidden, self.dim);
        if self.normalize {
            out.iter_mut().for_each(|v| l2_normalize(v));
        }
        Ok(out)
    }
}
