//! Hyper-parameters read from GGUF metadata and validated once, before any tensor is used.

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// The architecture families this build runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// BitNet b1.58 2B-4T (`bitnet-b1.58`, and the older name `bitnet-25`): ReLU² FFN.
    BitNetB158,
    /// 1bitLLM's BitNet (`bitnet`): SiLU-gated FFN, optional per-projection scales.
    BitNet,
    /// LLaMA family (`llama`, including Llama-3 style GQA and `rope_freqs`): RMSNorm,
    /// NORM RoPE, SwiGLU.
    Llama,
    /// Phi-3 (`phi3`): fused QKV and gate|up projections, NEOX RoPE.
    Phi3,
    /// GPT-2 (`gpt2`): LayerNorm with bias, learned positions, fused QKV, GELU FFN.
    Gpt2,
    /// Qwen2 (`qwen2`): LLaMA block with q/k/v biases and NEOX RoPE.
    Qwen2,
    /// Qwen3 (`qwen3`): LLaMA block with per-head q/k RMSNorm and NEOX RoPE.
    Qwen3,
    /// Gemma 3 (`gemma3`): scaled embeddings, q/k norms, post-norms, GEGLU, sliding-window
    /// layers.
    Gemma3,
}

/// Every `general.architecture` string this build runs.
pub const ARCH_NAMES: &[&str] = &[
    "bitnet-b1.58",
    "bitnet-25",
    "bitnet",
    "llama",
    "phi3",
    "gpt2",
    "qwen2",
    "qwen3",
    "gemma3",
];

impl Arch {
    /// The architecture for a `general.architecture` string.
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "bitnet-b1.58" | "bitnet-25" => Some(Arch::BitNetB158),
            "bitnet" => Some(Arch::BitNet),
            "llama" => Some(Arch::Llama),
            "phi3" => Some(Arch::Phi3),
            "gpt2" => Some(Arch::Gpt2),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma3" => Some(Arch::Gemma3),
            _ => None,
        }
    }
}

/// Validated model hyper-parameters.
#[derive(Clone, Debug)]
pub struct Config {
    /// Architecture family.
    pub arch: Arch,
    /// The `general.architecture` string (the prefix of every hyper-parameter key).
    pub arch_name: String,
    /// Vocabulary size (rows of the token embedding).
    pub n_vocab: usize,
    /// Model width.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// FFN inner width.
    pub n_ff: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// Rotated dimensions per head (NEOX pairing: i with i + n_rot/2).
    pub n_rot: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// LayerNorm epsilon (`attention.layer_norm_epsilon`; GPT-2).
    pub ln_eps: f32,
    /// Whether the file has a separate LM head (`output.weight`); otherwise it is tied to
    /// `token_embd`.
    pub has_output: bool,
    /// Whether the file has RoPE frequency factors (`rope_freqs.weight`, Llama-3.1 style).
    pub has_rope_freqs: bool,
    /// Whether every projection has an RMSNorm of its input (`blk.N.attn_q_norm_in.weight`
    /// and the like: BitNet-embedding models).
    pub proj_norms: bool,
    /// `attention.sliding_window`, when given. Phi-3: accepted (contexts here never
    /// exceed it, and attention is causal over the whole cache); Gemma 3: the window of its
    /// local layers.
    pub sliding_window: Option<usize>,
    /// Gemma 3: layer i is local when `i % pattern < pattern − 1`
    /// (`attention.sliding_window_pattern`, default 6).
    pub swa_pattern: usize,
    /// Gemma 3: RoPE base of the local layers (`rope.freq_base_swa`, default 10000).
    pub rope_base_swa: f32,
    /// `final_logit_softcapping`, when the file has it: logits = cap · tanh(logits / cap).
    pub logit_softcap: Option<f32>,
    /// `attention.causal` (default true): false for embedding models whose tokens attend to
    /// the whole input.
    pub causal: bool,
}

/// Largest value accepted for any single dimension: guards against absurd metadata
/// before it sizes a buffer.
const MAX_DIM: u32 = 1 << 20;

impl Config {
    /// Reads and validates the hyper-parameters of a file.
    pub fn from_gguf(file: &GgufFile) -> Result<Config> {
        let arch_name = file
            .get_str("general.architecture")?
            .ok_or_else(|| Error::Model("metadata 'general.architecture' is missing".into()))?
            .to_string();
        let arch = Arch::from_name(&arch_name).ok_or_else(|| {
            Error::Model(format!(
                "unknown architecture '{arch_name}' (this build runs: {})",
                ARCH_NAMES.join(", ")
            ))
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let dim = |k: &str| -> Result<usize> {
            let v = file.require_u32(&key(k))?;
            if v == 0 || v > MAX_DIM {
                return Err(Error::Model(format!(
                    "metadata '{}' = {v} is out of range 1..={MAX_DIM}",
                    key(k)
                )));
            }
            Ok(v as usize)
        };
        let n_embd = dim("embedding_length")?;
        let n_layer = dim("block_count")?;
        let n_head = dim("attention.head_count")?;
        let n_head_kv = match file.get_u32(&key("attention.head_count_kv"))? {
            Some(_) => dim("attention.head_count_kv")?,
            None => n_head,
        };
        let n_ff = dim("feed_forward_length")?;
        let n_ctx_train = dim("context_length")?;
        // Qwen3 and Gemma 3 give the head width (n_head·head_dim may differ from n_embd).
        let head_dim = match file.get_u32(&key("attention.key_length"))? {
            Some(_) => dim("attention.key_length")?,
            None => n_embd / n_head,
        };
        let n_rot = match file.get_u32(&key("rope.dimension_count"))? {
            Some(_) => dim("rope.dimension_count")?,
            None => head_dim,
        };
        let rope_base = file.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let rms_eps = file
            .get_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        let ln_eps = file
            .get_f32(&key("attention.layer_norm_epsilon"))?
            .unwrap_or(1e-5);
        let sliding_window = match file.get_u32(&key("attention.sliding_window"))? {
            Some(v) => Some(v as usize),
            None if arch == Arch::Phi3 => {
                return Err(Error::Model(format!(
                    "metadata '{}' is missing (required for phi3, as in llama.cpp)",
                    key("attention.sliding_window")
                )))
            }
            None => None,
        };
        let swa_pattern = match file.get_u32(&key("attention.sliding_window_pattern"))? {
            Some(_) => dim("attention.sliding_window_pattern")?,
            None => 6,
        };
        let rope_base_swa = file
            .get_f32(&key("rope.freq_base_swa"))?
            .unwrap_or(10_000.0);
        let logit_softcap = file.get_f32(&key("final_logit_softcapping"))?;
        let causal = file.get_bool(&key("attention.causal"))?.unwrap_or(true);
        if arch == Arch::Gemma3 && sliding_window.is_none() {
            return Err(Error::Model(format!(
                "metadata '{}' is missing (required for gemma3)",
                key("attention.sliding_window")
            )));
        }
        let has_output = file.tensor("output.weight").is_some();
        let has_rope_freqs = file.tensor("rope_freqs.weight").is_some();
        let proj_norms = file.tensor("blk.0.attn_q_norm_in.weight").is_some();
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::Model("tensor 'token_embd.weight' is missing".into()))?;
        if embd.shape.len() != 2 || embd.shape[0] != n_embd as u64 {
            return Err(Error::Model(format!(
                "tensor 'token_embd.weight': expected shape [{n_embd}, n_vocab], found {:?}",
                embd.shape
            )));
        }
        let n_vocab = embd.shape[1] as usize;

        let cfg = Config {
            arch,
            arch_name,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx_train,
            rope_base,
            n_rot,
            rms_eps,
            ln_eps,
            has_output,
            has_rope_freqs,
            proj_norms,
            sliding_window,
            swa_pattern,
            rope_base_swa,
            logit_softcap,
            causal,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Model(m));
        let free_heads = matches!(self.arch, Arch::Qwen3 | Arch::Gemma3);
        if !free_heads && !self.n_embd.is_multiple_of(self.n_head) {
            return bad(format!(
                "embedding_length {} is not a multiple of head_count {} (needed by {})",
                self.n_embd, self.n_head, self.arch_name
            ));
        }
        if self.head_dim * self.n_head != self.n_embd && !free_heads {
            return bad(format!(
                "head_count {} × head size {} must equal embedding_length {} for {}",
                self.n_head, self.head_dim, self.n_embd, self.arch_name
            ));
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if self.n_rot > self.head_dim
            || self.n_rot > crate::backend::cpu::MAX_ROT
            || !self.n_rot.is_multiple_of(2)
        {
            return bad(format!(
                "rope.dimension_count {} must be even and at most the head size {} (and {})",
                self.n_rot,
                self.head_dim,
                crate::backend::cpu::MAX_ROT
            ));
        }
        if self.arch == Arch::BitNetB158 && self.n_rot != self.head_dim {
            return bad(format!(
                "bitnet-b1.58 requires rope.dimension_count ({}) = head size ({})",
                self.n_rot, self.head_dim
            ));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad(format!(
                "rope.freq_base {} must be positive",
                self.rope_base
            ));
        }
        if !(self.ln_eps.is_finite() && self.ln_eps > 0.0) {
            return bad(format!(
                "attention.layer_norm_epsilon {} must be positive",
                self.ln_eps
            ));
        }
        if !(self.rope_base_swa.is_finite() && self.rope_base_swa > 0.0) {
            return bad(format!(
                "rope.freq_base_swa {} must be positive",
                self.rope_base_swa
            ));
        }
        if let Some(c) = self.logit_softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return bad(format!("final_logit_softcapping {c} must be positive"));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return bad(format!(
                "attention.layer_norm_rms_epsilon {} must be positive",
                self.rms_eps
            ));
        }
        Ok(())
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
