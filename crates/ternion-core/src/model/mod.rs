//! Model definitions: hyper-parameters from metadata, and one file per architecture family
//! that builds the forward pass as a backend-neutral [`graph::Graph`].

pub mod bitnet;
mod blocks;
pub mod config;
pub mod gemma3;
pub mod gpt2;
pub mod graph;
pub mod llama;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;

pub use config::{Arch, Config};
pub use graph::{Graph, Op};

use crate::backend::cpu::{CpuModel, CpuState, SeqStep, Workspace};
use crate::gguf::GgufFile;
use crate::kv::{KvGeometry, KvPool, KvType};
use crate::Result;

/// Which rows of logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's row.
    Last,
    /// One row per input token.
    All,
}

/// How the LM head's weights are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LmHead {
    /// As stored in the file (F16 for BitNet 2B-4T): the reference numerics.
    #[default]
    AsStored,
    /// Requantized to Q8_0 at load, with Q8_0 activations: about half the bytes per token
    /// (an approximation; its effect on the golden sets is recorded in BENCHMARKS.md).
    Q8_0,
    /// Requantized to Q6_K at load (ggml's reference quantizer), with Q8_K activations:
    /// about 0.41× the F16 bytes (an approximation, as Q8_0; see BENCHMARKS.md).
    Q6K,
}

/// Choices made when binding a file to its architecture.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// LM head storage.
    pub lm_head: LmHead,
}

/// A loaded model: configuration, forward-pass graph, and the weights bound for the CPU
/// (which stay in the mapped file). Other backends prepare from it.
pub struct Model {
    cfg: Config,
    graph: Graph,
    file: Arc<GgufFile>,
    cpu: CpuModel,
    kv_type: KvType,
    lm_head: LmHead,
}

impl Model {
    /// Binds a parsed file to its architecture.
    pub fn from_file(file: Arc<GgufFile>, opts: &LoadOptions) -> Result<Model> {
        if !file.has_tensor_data() {
            return Err(crate::Error::Model(format!(
                "{}: only the header was read; the CPU model needs the whole file",
                file.path().display()
            )));
        }
        let cfg = Config::from_gguf(&file)?;
        // Every block has tensors of its own: a block count beyond the tensor count is a
        // hostile or broken file, caught before the graph is sized by it.
        if cfg.n_layer > file.tensors.len() {
            return Err(crate::Error::Model(format!(
                "{}: block_count {} exceeds the {} tensors in the file",
                file.path().display(),
                cfg.n_layer,
                file.tensors.len()
            )));
        }
        let graph = graph_for(&cfg, &file);
        let cpu = CpuModel::prepare(&graph, &file, opts)?;
        Ok(Model {
            cfg,
            graph,
            file,
            cpu,
            kv_type: KvType::default(),
            lm_head: opts.lm_head,
        })
    }

    /// The model with CPU KV caches of element type `ty` (F16 unless set).
    pub fn with_kv_type(mut self, ty: KvType) -> Model {
        self.kv_type = ty;
        self
    }

    /// How the LM head's weights are used (as loaded): the GPU built from this model takes
    /// the same head.
    pub fn lm_head(&self) -> LmHead {
        self.lm_head
    }

    /// The element type of this model's CPU KV caches.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The forward pass.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The file the weights live in.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Bytes of weights read to decode one token.
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.cpu.weight_bytes_per_token(&self.graph)
    }

    /// Bytes of KV cache one sequence's decode step reads when the sequence holds
    /// `positions` positions (the new token's included): every layer's
    /// ([`Model::layer_kv_bytes_read`]).
    pub fn kv_bytes_read(&self, positions: usize) -> u64 {
        (0..self.graph.n_layer)
            .map(|l| self.layer_kv_bytes_read(l, positions))
            .sum()
    }

    /// Bytes of KV cache layer `layer`'s attention reads in one sequence's decode step
    /// when the sequence holds `positions` positions: its keys and values over the
    /// positions it sees (a sliding-window layer's window at most).
    pub fn layer_kv_bytes_read(&self, layer: usize, positions: usize) -> u64 {
        let geo = self.kv_geometry();
        let window = self.graph.attn.window_of(layer).unwrap_or(usize::MAX);
        (positions.min(window) * 2 * geo.kv_dim() * geo.ty.bytes()) as u64
    }

    /// Bytes of weights the CPU reads for graph op `op` in a decode step.
    pub fn op_weight_bytes(&self, op: &Op) -> u64 {
        self.cpu.op_weight_bytes(&self.graph, op)
    }

    /// An empty CPU sequence state with room for `n_ctx` positions, in a pool of its own
    /// (the buffers of the last state given back where they fit).
    pub fn cpu_state(&self, n_ctx: usize) -> CpuState {
        self.cpu.new_private_state(self.kv_geometry(), n_ctx)
    }

    /// Hands a finished state's buffers to the next [`Model::cpu_state`] (see
    /// [`CpuModel::give_back`]).
    pub fn give_back_cpu_state(&self, state: &mut CpuState) {
        self.cpu.give_back(state);
    }

    /// The shape of this model's KV-cache pages.
    pub fn kv_geometry(&self) -> KvGeometry {
        CpuModel::kv_geometry(&self.graph, self.kv_type)
    }

    /// A KV page pool for this model with room for `n_seq` sequences of `n_ctx` positions.
    pub fn kv_pool(&self, n_ctx: usize, n_seq: usize) -> Arc<KvPool> {
        KvPool::for_sequences(self.kv_geometry(), n_ctx, n_seq)
    }

    /// A fresh CPU sequence state with room for `n_ctx` positions whose pages come from
    /// `pool` (made by [`Model::kv_pool`] or with [`Model::kv_geometry`]).
    pub fn cpu_state_in(&self, pool: Arc<KvPool>, n_ctx: usize) -> CpuState {
        self.cpu.new_state_in(pool, n_ctx)
    }

    /// Runs the new tokens of several sequences as one CPU pass (see
    /// [`CpuModel::forward_batch`]); step `i`'s logits are then `ws.logits(graph, i)`.
    pub fn forward_batch(&self, steps: &mut [SeqStep<'_>], ws: &mut Workspace) -> Result<()> {
        self.cpu.forward_batch(&self.graph, steps, ws)
    }

    /// Runs a CPU forward pass of `graph`, a variant of [`Model::graph`] over the same
    /// weights (the embedding graph of [`crate::embed`]).
    pub(crate) fn forward_cpu_graph<'s>(
        &self,
        graph: &Graph,
        tokens: &[u32],
        which: Logits,
        st: &'s mut CpuState,
    ) -> Result<&'s [f32]> {
        self.cpu.forward(graph, tokens, which, st)
    }

    /// Runs a CPU forward pass (see [`CpuModel::forward`]).
    pub fn forward_cpu<'s>(
        &self,
        tokens: &[u32],
        which: Logits,
        st: &'s mut CpuState,
    ) -> Result<&'s [f32]> {
        self.forward_cpu_graph(&self.graph, tokens, which, st)
    }
}

/// The forward-pass graph of `cfg`'s architecture; `file` (whose tensor table is all that
/// is read) tells which optional tensors exist.
pub fn graph_for(cfg: &Config, file: &GgufFile) -> Graph {
    match cfg.arch {
        Arch::BitNetB158 | Arch::BitNet => bitnet::graph(cfg, file),
        Arch::Llama => llama::graph(cfg),
        Arch::Phi3 => phi3::graph(cfg, file),
        Arch::Gpt2 => gpt2::graph(cfg),
        Arch::Qwen2 => qwen2::graph(cfg),
        Arch::Qwen3 => qwen3::graph(cfg),
        Arch::Gemma3 => gemma3::graph(cfg),
    }
}

/// Opens a GGUF file and binds it to its architecture with default options.
pub fn load(path: impl AsRef<Path>) -> Result<(Arc<GgufFile>, Model)> {
    load_with(path, &LoadOptions::default())
}

/// Opens a GGUF file (or an MLC directory, converted by [`crate::mlc::open`]) and binds it
/// to its architecture.
pub fn load_with(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<(Arc<GgufFile>, Model)> {
    let file = Arc::new(crate::mlc::open(path.as_ref())?);
    crate::limits::check_model_fits(&file)?;
    let model = Model::from_file(file.clone(), opts)?;
    Ok((file, model))
}
