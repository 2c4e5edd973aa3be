//! `ternion embed`: text embeddings on the CPU or the GPU (`--backend`, as `run`); see
//! `ternion::embed` for the pooling and normalisation rules, the same on both.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use ternion::backend::gpu::GpuModelOptions;
use ternion::embed::{Embedder, Pooling};
use ternion::model;
use ternion::tokenizer::Tokenizer;

use crate::common::{self, BackendArgs};

/// Arguments of `ternion embed`.
#[derive(Args)]
pub struct EmbedArgs {
    /// GGUF model file.
    #[arg(long, short = 'm')]
    model: PathBuf,
    /// Text to embed (repeat for several inputs).
    #[arg(long, short = 'p')]
    prompt: Vec<String>,
    /// File whose non-empty lines are embedded, one input each.
    #[arg(long, short = 'f')]
    file: Option<PathBuf>,
    /// Pooling (none, mean, cls, last); default: the file's `pooling_type`, else mean.
    #[arg(long, value_parser = parse_pooling)]
    pooling: Option<Pooling>,
    /// Keep the vectors as computed instead of scaling them to unit length.
    #[arg(long)]
    no_normalize: bool,
    /// Print every vector as JSON (`{"model", "data": [{"index", "embedding"}], "usage"}`)
    /// instead of one summary line per input.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    #[command(flatten)]
    backend: BackendArgs,
}

fn parse_pooling(name: &str) -> std::result::Result<Pooling, String> {
    Pooling::parse(name).map_err(|e| e.to_string())
}

/// The inputs: every `-p`, then every non-empty line of `--file`.
fn inputs(a: &EmbedArgs) -> Result<Vec<String>> {
    let mut all = a.prompt.clone();
    if let Some(f) = &a.file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        all.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if all.is_empty() {
        bail!("give the text to embed with --prompt TEXT (repeatable) or --file LINES");
    }
    Ok(all)
}

/// Runs `ternion embed`.
pub fn run(a: EmbedArgs) -> Result<()> {
    common::init_threads(a.threads)?;
    let texts = inputs(&a)?;
    let (file, model) =
        model::load(&a.model).with_context(|| format!("loading {}", a.model.display()))?;
    let model = model.with_kv_type(a.backend.kv_type);
    let tok = Tokenizer::from_gguf(&file, &common::tokenizer_options(None))
        .with_context(|| format!("reading the tokenizer of {}", a.model.display()))?;
    let cpu = Embedder::new(&model, a.pooling, !a.no_normalize)?;
    let inputs = texts
        .iter()
        .map(|t| cpu.tokenize(&tok, t))
        .collect::<ternion::Result<Vec<_>>>()?;
    // The GPU's context and steps hold the longest input (one longer than the model's
    // context fails below as on the CPU); a non-causal model runs each input as one step.
    let longest = inputs.iter().map(Vec::len).max().unwrap_or(1);
    let n_ctx = longest.clamp(1, model.config().n_ctx_train);
    let defaults = GpuModelOptions::default();
    let one_step = !model.graph().attn.causal;
    let gopts = GpuModelOptions {
        n_ctx,
        max_batch: if one_step {
            defaults.max_batch.max(n_ctx)
        } else {
            defaults.max_batch
        },
        ..defaults
    };
    let mut gpu = a.backend.gpu_with(&model, gopts)?;
    let mut emb = match gpu.as_mut() {
        Some(g) => Embedder::with_backend(&model, Box::new(g), a.pooling, !a.no_normalize)?,
        None => cpu,
    };
    let mut data = Vec::new();
    let mut n_tokens = 0;
    for (i, ids) in inputs.iter().enumerate() {
        n_tokens += ids.len();
        let vectors = emb
            .embed(ids)
            .with_context(|| format!("embedding input {i}"))?;
        if !a.json {
            for v in &vectors {
                println!("{}", summary(i, ids.len(), v));
            }
        }
        data.extend(vectors.into_iter().map(|v| (i, v)));
    }
    if a.json {
        let out = json!({
            "object": "list",
            "model": a.model.display().to_string(),
            "pooling": format!("{:?}", emb.pooling()).to_lowercase(),
            "data": data.iter().map(|(i, v)| json!({
                "object": "embedding",
                "index": i,
                "embedding": v,
            })).collect::<Vec<_>>(),
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        });
        println!("{out}");
    } else {
        eprintln!(
            "{} vector(s) of {} values, pooling {:?}, {} tokens",
            data.len(),
            emb.dim(),
            emb.pooling(),
            n_tokens
        );
    }
    Ok(())
}

/// One line: input index, tokens, length, and the first values.
fn summary(i: usize, n_tokens: usize, v: &[f32]) -> String {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.5}")).collect();
    format!(
        "[{i}] {n_tokens} tokens  dim {}  |v| {norm:.4}  [{}, …]",
        v.len(),
        head.join(", ")
    )
}
