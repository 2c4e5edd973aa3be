//! What several commands share: model loading, backend and thread settings, file
//! checksums.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ternion::backend::gpu::{
    GpuContext, GpuModel, GpuModelOptions, GpuOptions, Numerics, PrefillKernel,
};
use ternion::gguf::GgufFile;
use ternion::kv::KvType;
use ternion::model::{self, Config, LmHead, LoadOptions, Model};
use ternion::session::{GpuEngine, Session};
use ternion::tokenizer::{PreTokenizer, Tokenizer, TokenizerOptions};

use crate::{check, cores, hub};

/// Compute backend choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// SIMD, multi-threaded CPU.
    Cpu,
    /// WebGPU (wgpu: Vulkan, Metal, DX12) with WGSL kernels.
    Gpu,
    /// The GPU when one is found, else the CPU.
    Auto,
}

/// Backend flags shared by every command that runs a model.
#[derive(Args, Clone)]
pub struct BackendArgs {
    /// Compute backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: Backend,
    /// GPU adapter index (see the adapters listed by `--backend gpu` errors or logs).
    #[arg(long)]
    pub device: Option<usize>,
    /// GPU kernel for the ternary linears of prompt batches (default: the best available).
    #[arg(long, value_enum)]
    pub gpu_prefill: Option<GpuPrefill>,
    /// GPU numerics: fast kernels, or the CPU reference's arithmetic bit for bit
    /// (docs/ARCHITECTURE.md, "Numerics").
    #[arg(long, value_enum, default_value = "fast")]
    pub gpu_numerics: GpuNumerics,
    /// GPU: keep the SHADER_F16 kernel variants off (f32 only), to measure what they give.
    #[arg(long)]
    pub gpu_no_f16: bool,
    /// GPU: keep the subgroup kernel variants off (reductions in workgroup memory).
    #[arg(long)]
    pub gpu_no_subgroups: bool,
    /// KV cache element type, CPU and GPU: f16 (default) or f32 (twice the memory; the
    /// cache of llama.cpp's runs, for comparing logits tightly).
    #[arg(long, default_value = "f16", value_parser = parse_kv_type)]
    pub kv_type: KvType,
}

/// Parses `--kv-type`.
fn parse_kv_type(name: &str) -> std::result::Result<KvType, String> {
    KvType::parse(name).map_err(|e| e.to_string())
}

/// `--gpu-numerics` choices (see `ternion::backend::gpu::Numerics`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuNumerics {
    /// Fused one-pass norms and one-launch decode attention (within the golden tolerances).
    Fast,
    /// Bit-exact with the CPU where the kernels can be (slower; for validation).
    Exact,
}

/// `--gpu-prefill` choices (see `ternion::backend::gpu::PrefillKernel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GpuPrefill {
    /// 4 tokens per workgroup (the weights read per 4 tokens).
    Batch4,
    /// 64 × 64 tiles, dot4I8Packed (any adapter).
    Tiled,
    /// 128 × 64 (128 × 128 above 64 tokens) tiles on f16 cooperative matrices.
    Coop,
}

impl BackendArgs {
    /// The GPU model for `model` when the choice asks for one (`None` for the CPU); `auto`
    /// falls back to the CPU when no adapter is found.
    pub fn gpu(&self, model: &Model, n_ctx: usize) -> Result<Option<GpuModel>> {
        let opts = GpuModelOptions {
            n_ctx,
            ..GpuModelOptions::default()
        };
        self.gpu_with(model, opts)
    }

    /// The adapter to open: `None` for the CPU backend, `Some(index)` for a GPU (`None`
    /// inside: wgpu's best). `auto` without `--device` never takes a CPU-type adapter
    /// (llvmpipe, lavapipe, SwiftShader: slower than the CPU backend) and says why it
    /// falls back to the CPU; `--backend gpu` takes whatever is there.
    pub fn adapter(&self) -> Option<Option<usize>> {
        match (self.backend, self.device) {
            (Backend::Cpu, _) => None,
            (Backend::Gpu, d) | (Backend::Auto, d @ Some(_)) => Some(d),
            (Backend::Auto, None) => match cores::best_hardware_adapter() {
                Ok(i) => Some(Some(i)),
                Err(why) => {
                    eprintln!("{why}; using the CPU backend (--backend gpu would take it)");
                    None
                }
            },
        }
    }

    /// [`BackendArgs::gpu`] with every GPU model option given.
    pub fn gpu_with(&self, model: &Model, mut gopts: GpuModelOptions) -> Result<Option<GpuModel>> {
        let Some(device_index) = self.adapter() else {
            return Ok(None);
        };
        gopts.numerics = match self.gpu_numerics {
            GpuNumerics::Fast => Numerics::Fast,
            GpuNumerics::Exact => Numerics::Exact,
        };
        let opts = GpuOptions {
            device_index,
            prefill: self.gpu_prefill.map(|p| match p {
                GpuPrefill::Batch4 => PrefillKernel::Batch4,
                GpuPrefill::Tiled => PrefillKernel::Tiled,
                GpuPrefill::Coop => PrefillKernel::Coop,
            }),
            disable_f16: self.gpu_no_f16,
            disable_subgroups: self.gpu_no_subgroups,
            ..GpuOptions::default()
        };
        let ctx = match GpuContext::new(&opts) {
            Ok(c) => Arc::new(c),
            Err(e) if self.backend == Backend::Auto => {
                eprintln!("no GPU ({e}); using the CPU backend");
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let caps = ctx.caps();
        eprintln!(
            "GPU: {} ({}), f16 {}, subgroups {}, prefill {:?}, SMs {}",
            caps.name,
            caps.backend,
            caps.f16,
            caps.subgroups,
            caps.prefill,
            caps.sms.map_or("unknown".to_string(), |n| n.to_string())
        );
        Ok(Some(GpuModel::from_model(ctx, model, gopts)?))
    }
}

/// Parses `--pre-tokenizer`: any `tokenizer.ggml.pre` name llama.cpp maps to a regex this
/// build has (`llama3`, `qwen2`, `smollm`, `falcon_e`, `gpt2`, `default`, ...).
pub fn parse_pre(name: &str) -> std::result::Result<PreTokenizer, String> {
    PreTokenizer::parse(name).map_err(|e| e.to_string())
}

/// LM head storage choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LmHeadArg {
    /// As stored in the file (exact reference numerics).
    Stored,
    /// Requantized to Q8_0 at load: fewer bytes per token, approximate logits.
    #[value(name = "q8_0")]
    Q8_0,
    /// Requantized to Q6_K at load: fewer bytes still, approximate logits.
    #[value(name = "q6_k")]
    Q6K,
}

impl LmHeadArg {
    /// Load options for this choice.
    pub fn load_options(self) -> LoadOptions {
        LoadOptions {
            lm_head: match self {
                LmHeadArg::Stored => LmHead::AsStored,
                LmHeadArg::Q8_0 => LmHead::Q8_0,
                LmHeadArg::Q6K => LmHead::Q6K,
            },
        }
    }
}

/// Model selection and engine settings shared by the generating commands.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// GGUF model file or MLC `q4f16_1` directory (default for run/chat: BitNet b1.58 2B-4T
    /// from Hugging Face).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Worker threads (default: the cores this process may use, physical cores where
    /// known).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, at most 4096; for `perplexity` the
    /// chunk size, 512).
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Pre-tokenizer, by its `tokenizer.ggml.pre` name, used whatever the file says.
    /// Without it: the file's own, or llama3 (Hugging Face's for BitNet 2B-4T) when the file
    /// names none; `default` matches bitnet.cpp there.
    #[arg(long, value_parser = parse_pre)]
    pub pre_tokenizer: Option<PreTokenizer>,
    /// LM head storage: as stored (exact) or requantized to Q8_0 (faster, approximate).
    #[arg(long, value_enum, default_value = "stored")]
    pub lm_head: LmHeadArg,
    /// Expected SHA-256 of the model file (hex); loading fails on a mismatch.
    #[arg(long)]
    pub sha256: Option<String>,
}

/// A loaded model with its tokenizer, its GPU plan when the GPU runs it, and how long
/// loading took.
pub struct Loaded {
    pub file: Arc<GgufFile>,
    pub model: Model,
    pub gpu: Option<GpuModel>,
    pub tokenizer: Tokenizer,
    pub load_time: Duration,
    pub n_ctx: usize,
}

/// A new sequence on the GPU plan when there is one, else on the CPU (a function of the
/// parts, so the caller keeps using the tokenizer while the session lives).
pub fn session<'a>(model: &'a Model, gpu: &'a mut Option<GpuModel>, n_ctx: usize) -> Session<'a> {
    match gpu {
        Some(g) => Session::with_engine(Box::new(GpuEngine::new(g))),
        None => Session::new(model, n_ctx),
    }
}

/// Sets the size of the worker pool (once, before any parallel work): `threads`, or the
/// cores this process may use; more threads than that is allowed with a warning.
pub fn init_threads(threads: Option<usize>) -> Result<usize> {
    let cores = cores::usable();
    let n = threads.unwrap_or(cores);
    if n == 0 {
        bail!("--threads must be at least 1");
    }
    if n > cores {
        eprintln!(
            "warning: -t {n} is more threads than the {cores} cores this process may use; \
             the threads will take turns on the cores (slower, not faster)"
        );
    }
    if !ternion::backend::cpu::pool::init(n) {
        bail!("the worker pool was already started with another thread count");
    }
    Ok(n)
}

/// Tokenizer options for `--pre-tokenizer`: the choice overrides the file's; without one the
/// file's own is used, and Llama-3's when the file names none (BitNet's files).
pub fn tokenizer_options(pre: Option<PreTokenizer>) -> TokenizerOptions {
    TokenizerOptions {
        pre,
        pre_when_absent: pre.unwrap_or(PreTokenizer::Llama3),
    }
}

/// Opens the model named by `args` (or, when `default_model`, BitNet 2B-4T from the
/// Hugging Face cache, downloading it on first use), with `--ctx` or the model's context
/// (at most 4096).
pub fn load(args: &ModelArgs, default_model: bool) -> Result<Loaded> {
    load_with_ctx(args, default_model, |cfg| {
        Ok(args.ctx.unwrap_or(cfg.n_ctx_train.min(4096)))
    })
}

/// [`load`] with the context size chosen by `n_ctx` from the model's configuration (its
/// error stops the load before any GPU memory is taken).
pub fn load_with_ctx(
    args: &ModelArgs,
    default_model: bool,
    n_ctx: impl FnOnce(&Config) -> Result<usize>,
) -> Result<Loaded> {
    init_threads(args.threads)?;
    let path = match (&args.model, default_model) {
        (Some(p), _) => hub::resolve(p)?,
        (None, true) => hub::default_model()?,
        (None, false) => bail!("give the model file with --model FILE"),
    };
    if let Some(want) = &args.sha256 {
        if path.is_dir() {
            bail!(
                "--sha256 checks one file; {} is a directory",
                path.display()
            );
        }
        verify_sha256(&path, want)?;
    }
    let t0 = Instant::now();
    let (file, model) = model::load_with(&path, &args.lm_head.load_options())
        .with_context(|| format!("loading {}", path.display()))?;
    let model = model.with_kv_type(args.backend.kv_type);
    check::special_tokens(&file, model.config().n_vocab)
        .with_context(|| format!("loading {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&file, &tokenizer_options(args.pre_tokenizer))
        .with_context(|| format!("reading the tokenizer of {}", path.display()))?;
    let n_ctx = n_ctx(model.config())?;
    if n_ctx == 0 {
        bail!("--ctx must be at least 1");
    }
    file.advise_will_need();
    let gpu = args.backend.gpu(&model, n_ctx)?;
    Ok(Loaded {
        file,
        model,
        gpu,
        tokenizer,
        load_time: t0.elapsed(),
        n_ctx,
    })
}

/// Checks a file's SHA-256 against `want` (64 hex digits, case-insensitive); a malformed
/// `want` is an error before the file is read.
pub fn verify_sha256(path: &Path, want: &str) -> Result<()> {
    let want = want.trim().to_ascii_lowercase();
    if !is_sha256_hex(&want) {
        bail!("--sha256 must be 64 hexadecimal digits, got '{want}'");
    }
    let got = file_sha256(path)?;
    if got != want {
        bail!("{}: SHA-256 is {got}, expected {want}", path.display());
    }
    Ok(())
}

/// Whether `s` is a SHA-256 digest in lowercase hex.
fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The SHA-256 of a file in lowercase hex, read in 1 MiB pieces (never whole).
pub fn file_sha256(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The SHA-256 the Hub reported for a file of the Hugging Face cache. hf-hub stores each
/// download as `blobs/<etag>` (the snapshot path links to it), taking the etag from the
/// `x-linked-etag` header, which for files kept in Git LFS (model weights) is the
/// content's SHA-256. `None` when the blob is not named by a SHA-256 (a small file's etag
/// is a git SHA-1; without symlinks hf-hub moves the blob to the snapshot path).
pub fn hub_sha256(path: &Path) -> Option<String> {
    let blob = std::fs::canonicalize(path).ok()?;
    let name = blob.file_name()?.to_str()?;
    is_sha256_hex(name).then(|| name.to_owned())
}
