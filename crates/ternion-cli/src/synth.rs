//! `ternion synth`: write a random-weight model of a real shape.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use ternion::quant::GgmlType;
use ternion_testkit::mlc_synth::{write_phi3, Phi3Spec};
use ternion_testkit::synth::{self, Shape, Spec, Vocab};

/// Arguments of `ternion synth`.
#[derive(Args)]
pub struct SynthArgs {
    /// Architecture: bitnet-b1.58, bitnet-25, bitnet, llama (ternary weights, Falcon3-1.58 / TriLM style), qwen3 (ternary, Ternary-Bonsai style), or gpt2 (dense weights).
    #[arg(long, default_value = "bitnet-b1.58")]
    arch: String,
    /// Shape: 2b-4t (BitNet b1.58 2B-4T), small, tiny, gpt2-124m, falcon3-1b (Falcon3-1B-1.58bit, with --arch llama), or bonsai-1.7b (Ternary-Bonsai-1.7B, with --arch qwen3 --type q2_0).
    #[arg(long, default_value = "tiny")]
    shape: String,
    /// Weight type: i2_s, tq2_0, tq1_0 or q2_0 (ternary); f32, f16, q8_0 or q4_0 (gpt2).
    #[arg(long = "type", default_value = "i2_s")]
    ty: String,
    /// GGUF whose tokenizer to copy (e.g. ../shared/vocab/ggml-vocab-llama3.gguf);
    /// without it a 259-token byte vocabulary is used.
    #[arg(long)]
    vocab: Option<PathBuf>,
    /// Keep at most this many tokens of --vocab (special tokens are kept).
    #[arg(long)]
    vocab_limit: Option<usize>,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write an MLC `q4f16_1` Phi-3 directory at --out instead (what WebLLM and
    /// `Ternion.loadMlc` load), and the same model as `<out>.gguf`; needs --vocab with a
    /// SentencePiece vocabulary (e.g. ../shared/vocab/ggml-vocab-phi-3.gguf).
    #[arg(long)]
    mlc: bool,
    /// Largest MLC shard in bytes (MLC writes 32 MiB shards; small values give many).
    #[arg(long, default_value_t = 32 << 20)]
    shard_bytes: usize,
    /// Output file (a directory with --mlc).
    #[arg(long)]
    out: PathBuf,
}

/// Runs `ternion synth`.
pub fn run(a: SynthArgs) -> Result<()> {
    let Some(shape) = Shape::named(&a.shape) else {
        bail!(
            "unknown shape '{}' (known: {})",
            a.shape,
            Shape::NAMES.join(", ")
        );
    };
    if a.mlc {
        let Some(vocab) = &a.vocab else {
            bail!("--mlc needs --vocab (a SentencePiece GGUF, e.g. ggml-vocab-phi-3.gguf)");
        };
        let gguf = a.out.with_extension("gguf");
        let spec = Phi3Spec {
            shape,
            vocab,
            seed: a.seed,
            code_15: false,
            shard_bytes: a.shard_bytes,
        };
        write_phi3(&spec, &a.out, &gguf)?;
        eprintln!("wrote {} and {}", a.out.display(), gguf.display());
        return Ok(());
    }
    let weight_type = match a.ty.to_ascii_lowercase().as_str() {
        "i2_s" => GgmlType::I2_S,
        "tq2_0" => GgmlType::TQ2_0,
        "tq1_0" => GgmlType::TQ1_0,
        "q2_0" => GgmlType::Q2_0,
        "f32" => GgmlType::F32,
        "f16" => GgmlType::F16,
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        other => {
            bail!("unknown weight type '{other}' (i2_s, tq2_0, tq1_0, q2_0, f32, f16, q8_0, q4_0)")
        }
    };
    let vocab = match &a.vocab {
        Some(p) => Vocab::File {
            path: p,
            limit: a.vocab_limit,
        },
        None => Vocab::Bytes { n_vocab: 259 },
    };
    let spec = Spec {
        arch: &a.arch,
        shape,
        weight_type,
        vocab,
        seed: a.seed,
    };
    synth::write(&spec, &a.out)?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}
