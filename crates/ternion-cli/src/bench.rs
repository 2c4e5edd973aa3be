//! `ternion bench`: prompt (prefill) and decode speed on a model or a synthetic one.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::json;
use ternion::backend::cpu::pool::{self, PoolStats};
use ternion::backend::cpu::{handoff_ns, op_profile, ReadProbe};
use ternion::backend::gpu::{
    measure_dispatch_latency, measure_read_bandwidth, GpuModel, GpuModelOptions, GpuSeq,
    GpuSeqStep, KernelTime,
};
use ternion::generate::{BatchBackend, BatchStep, CpuBatch};
use ternion::kv::KvSeq;
use ternion::model::{self, Logits, Model, Op};
use ternion::quant::GgmlType;
use ternion::sample::argmax;
use ternion::session::Session;
use ternion_testkit::synth::{self, Shape, Spec, Vocab};

use crate::common::{self, BackendArgs, LmHeadArg};

/// Arguments of `ternion bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// GGUF model file.
    #[arg(long, short = 'm', conflicts_with = "synthetic")]
    model: Option<PathBuf>,
    /// A synthetic model `SHAPE-TYPE` (e.g. `2b-4t-i2_s`, `tiny-tq2_0`), written to the
    /// cache folder on first use.
    #[arg(long)]
    synthetic: Option<String>,
    #[command(flatten)]
    backend: BackendArgs,
    /// Worker threads (default: the cores this process may use).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    /// Prompt tokens (random ids; `-p` is prompt text in `run`, never a count).
    #[arg(
        short = 'P',
        long = "prompt-tokens",
        alias = "n-prompt",
        default_value_t = 128
    )]
    n_prompt: usize,
    /// Tokens to generate (decode), as `-n` in `run`.
    #[arg(short = 'n', long = "n-predict", alias = "n-gen", default_value_t = 32)]
    n_gen: usize,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// LM head storage: as stored (exact) or requantized to Q8_0.
    #[arg(long, value_enum, default_value = "stored")]
    lm_head: LmHeadArg,
    /// Time the decode steps part by part and print the breakdown: on the GPU every kernel
    /// launch (timestamp queries, adding a little time per launch to the figures above
    /// it); on the CPU every op of the forward pass, wall clock, with the weights it reads
    /// per token and their rate (one run, single sequence).
    #[arg(long)]
    profile: bool,
    /// GPU: tokens per prefill step (the prompt runs in steps of at most this many; as
    /// llama-bench's default n_ubatch).
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// Sequences run together (CPU): their prompts are prefilled in one pass, then every
    /// decode step is one batched pass over all of them; tok/s are totals over the batch.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Timed runs of the prompt and the decode (as llama-bench's `-r`): the figures are
    /// their mean ± standard deviation. One with `--profile`.
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
}

/// Peak resident memory of this process in bytes (Linux), if known.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the peak resident set size to the current one (Linux's `clear_refs` 5): the
/// bandwidth probe's buffer before the runs is not the model's memory. False where that
/// fails (then the peak would count the probe).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The file of synthetic model `SHAPE-TYPE` in the cache folder, written on first use.
pub(crate) fn synthetic_path(name: &str) -> Result<PathBuf> {
    let (shape_name, ty) = name
        .rsplit_once('-')
        .with_context(|| format!("--synthetic '{name}': expected SHAPE-TYPE, e.g. 2b-4t-i2_s"))?;
    let Some(shape) = Shape::named(shape_name) else {
        bail!(
            "unknown shape '{shape_name}' (known: {})",
            Shape::NAMES.join(", ")
        );
    };
    let weight_type = match ty {
        "i2_s" => GgmlType::I2_S,
        "tq2_0" => GgmlType::TQ2_0,
        "tq1_0" => GgmlType::TQ1_0,
        _ => bail!("unknown ternary type '{ty}' (i2_s, tq2_0, tq1_0)"),
    };
    let dir = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("ternion");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("synth-{name}.gguf"));
    if !path.exists() {
        eprintln!("writing synthetic model {} ...", path.display());
        let n_vocab = if shape_name == "2b-4t" {
            128_256
        } else {
            32_000
        };
        let tmp = path.with_extension("part");
        synth::write(
            &Spec {
                arch: "bitnet-b1.58",
                shape,
                weight_type,
                vocab: Vocab::Bytes { n_vocab },
                seed: 1,
            },
            &tmp,
        )?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path)
}

/// CPU time (user + system) this process has used so far, in seconds: on a shared machine
/// the CPU time of a phase varies far less with the neighbours' load than its wall time.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(u.ru_utime) + s(u.ru_stime)
}

/// Prefill and decode seconds on the CPU, after a warm-up (`warm`: the first repetition)
/// as llama-bench's: the same
/// prompt once in a session of the same size, which touches every weight page, starts the
/// worker pool and leaves the buffers that the timed session then reuses (so that the
/// timed prompt, like llama-bench's repetitions, pays no first touch of fresh pages).
fn time_cpu(
    model: &Model,
    prompt: &[u32],
    (n_gen, n_ctx): (usize, usize),
    warm: bool,
    profile: bool,
) -> Result<Timings> {
    if warm {
        Session::new(model, n_ctx).prefill(prompt)?;
    }
    let mut s = Session::new(model, n_ctx);
    let t = Instant::now();
    let mut next = argmax(s.prefill(prompt)?);
    let prefill_s = t.elapsed().as_secs_f64();
    if profile {
        op_profile::start();
        pool::global().stats_start();
    }
    let (t, cpu) = (Instant::now(), cpu_seconds());
    for _ in 0..n_gen {
        next = argmax(s.decode(next)?);
    }
    Ok(Timings {
        prefill_s,
        decode_s: t.elapsed().as_secs_f64(),
        decode_cpu_s: Some(cpu_seconds() - cpu),
        cpu_ops: profile.then(|| (op_profile::stop(), pool::global().stats_stop())),
    })
}

/// What the CPU bench says of its threads' placement, from the handoff times measured
/// before and after the runs (`None` where neither was measured).
fn handoff_line(before: Option<f64>, after: Option<f64>) -> Option<String> {
    let ns = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.0} ns"));
    (before.is_some() || after.is_some()).then(|| {
        format!(
            "the threads hand a cache line to each other in {} before the runs, {} after (tens of ns: one shared L3; 100+ ns: separate L3s, e.g. two CCDs, whose separate memory paths read more while every handoff of a step costs more)",
            ns(before),
            ns(after)
        )
    })
}

/// Where a decode step's threads ran, from the handoff times ([`handoff_ns`]) measured
/// beside it.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Placement {
    /// Both handoffs under [`SEPARATE_L3_NS`].
    SharedL3,
    /// Both at or over it.
    SeparateL3,
    /// One each side, or not measured.
    Unknown,
}

/// Handoff time from which two threads count as on separate L3s: 31–34 ns within one
/// Zen 4 CCD, 155–162 ns across two (BENCHMARKS.md, session 35).
const SEPARATE_L3_NS: f64 = 80.0;

/// The placement of one handoff measurement.
fn placement_of(ns: Option<f64>) -> Placement {
    match ns {
        Some(ns) if ns < SEPARATE_L3_NS => Placement::SharedL3,
        Some(_) => Placement::SeparateL3,
        None => Placement::Unknown,
    }
}

/// The placement of a step between handoff measurements `a` and `b`: theirs where they
/// agree.
fn placement(a: Option<f64>, b: Option<f64>) -> Placement {
    match (placement_of(a), placement_of(b)) {
        (pa, pb) if pa == pb => pa,
        _ => Placement::Unknown,
    }
}

/// Whether the threads ran on one L3 at one measurement and on separate L3s at the other.
fn moved_between_l3s(a: Option<f64>, b: Option<f64>) -> bool {
    let (pa, pb) = (placement_of(a), placement_of(b));
    pa != pb && pa != Placement::Unknown && pb != Placement::Unknown
}

/// Decode's share of the read bandwidth step by step, on the CPU: one probe pass
/// ([`ReadProbe::pass`]) and one handoff measurement before the first step and after every
/// step, each step's read rate (`weight_bytes` plus the KV cache it reads,
/// [`Model::kv_bytes_read`]) divided by the higher of the two passes
/// beside it, with its [`placement`]; sorted by share. A shared host's bandwidth changes
/// within seconds (BENCHMARKS.md, session 26): passes a few milliseconds from a step
/// measure what that step had.
fn paired_shares(
    model: &Model,
    probe: &ReadProbe,
    prompt: &[u32],
    (n_gen, n_ctx): (usize, usize),
    weight_bytes: u64,
) -> Result<Vec<(f64, Placement)>> {
    let mut s = Session::new(model, n_ctx);
    let mut next = argmax(s.prefill(prompt)?);
    let mut before = (probe.pass(), handoff_ns());
    let mut shares = Vec::with_capacity(n_gen);
    for i in 0..n_gen {
        let bytes = weight_bytes + model.kv_bytes_read(prompt.len() + i + 1);
        let t = Instant::now();
        next = argmax(s.decode(next)?);
        let rate = bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
        let after = (probe.pass(), handoff_ns());
        shares.push((rate / before.0.max(after.0), placement(before.1, after.1)));
        before = after;
    }
    shares.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(shares)
}

/// Quartiles (in %) of the sorted shares of the steps `keep` selects, if any.
fn share_quartiles(
    shares: &[(f64, Placement)],
    keep: impl Fn(Placement) -> bool,
) -> Option<([f64; 3], usize)> {
    let xs: Vec<f64> = shares.iter().filter(|s| keep(s.1)).map(|s| s.0).collect();
    (!xs.is_empty()).then(|| {
        (
            [0.25, 0.5, 0.75].map(|q| 100.0 * quantile(&xs, q)),
            xs.len(),
        )
    })
}

/// The `q` quantile (0..=1) of sorted, non-empty `xs` (the nearest rank).
fn quantile(xs: &[f64], q: f64) -> f64 {
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// Wall seconds of the prefill and the decode steps, and (CPU) the decode's CPU seconds.
struct Timings {
    prefill_s: f64,
    decode_s: f64,
    decode_cpu_s: Option<f64>,
    /// CPU `--profile`: per graph op, the calls and seconds of the decode steps.
    cpu_ops: Option<(Vec<(u64, f64)>, PoolStats)>,
}

/// Prefill and decode seconds of `prompts.len()` sequences run together on the CPU: one
/// pass prefills every prompt, then each decode step is one pass over all sequences.
fn time_cpu_batched(
    model: &Model,
    prompts: &[Vec<u32>],
    n_gen: usize,
    n_ctx: usize,
    warm: bool,
) -> Result<Timings> {
    if warm {
        Session::new(model, 8).prefill(&prompts[0][..prompts[0].len().min(4)])?;
    }
    let mut backend = CpuBatch::new(model, model.kv_pool(n_ctx, prompts.len()));
    let mut kvs: Vec<KvSeq> = prompts
        .iter()
        .map(|_| backend.new_seq(n_ctx))
        .collect::<ternion::Result<_>>()?;
    let mut next = vec![0u32; prompts.len()];
    let mut pass = |inputs: &[&[u32]], next: &mut [u32]| -> Result<()> {
        let mut steps: Vec<BatchStep<'_, KvSeq>> = kvs
            .iter_mut()
            .zip(inputs)
            .map(|(seq, &tokens)| BatchStep {
                seq,
                tokens,
                mask: None,
            })
            .collect();
        let rows = backend.forward(&mut steps, false)?;
        for (i, n) in next.iter_mut().enumerate() {
            *n = rows.get(i).best();
        }
        Ok(())
    };
    let t = Instant::now();
    let inputs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    pass(&inputs, &mut next)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let (t, cpu) = (Instant::now(), cpu_seconds());
    for _ in 0..n_gen {
        let last = next.clone();
        let inputs: Vec<&[u32]> = last.iter().map(std::slice::from_ref).collect();
        pass(&inputs, &mut next)?;
    }
    Ok(Timings {
        prefill_s,
        decode_s: t.elapsed().as_secs_f64(),
        decode_cpu_s: Some(cpu_seconds() - cpu),
        cpu_ops: None,
    })
}

/// Prefill and decode seconds on the GPU: decode steps end in the GPU argmax, so only the
/// token id comes back. At least a second of warm-up first where `warm` (GPUs idle at low
/// clocks).
fn time_gpu(g: &mut GpuModel, prompt: &[u32], n_gen: usize, warm: bool) -> Result<Timings> {
    let start = Instant::now();
    while warm && start.elapsed().as_secs_f64() < 1.5 {
        g.truncate(0);
        g.forward(prompt, Logits::Last)?;
        g.greedy(0, n_gen.min(16), |_| true)?;
    }
    g.truncate(0);
    g.reset_profile();
    let t = Instant::now();
    let mut next = argmax(&g.forward(prompt, Logits::Last)?);
    let prefill_s = t.elapsed().as_secs_f64();
    if let Some(p) = g.profile() {
        print_profile(
            &format!("prefill profile (GPU timestamps, {} tokens)", prompt.len()),
            &p,
            1,
        );
    }
    g.reset_profile();
    let t = Instant::now();
    if g.profile().is_some() {
        // Timestamps are collected per step: one step at a time.
        for _ in 0..n_gen {
            next = g.argmax_step(next)?;
        }
    } else {
        g.greedy(next, n_gen, |_| true)?;
    }
    Ok(Timings {
        prefill_s,
        decode_s: t.elapsed().as_secs_f64(),
        decode_cpu_s: None,
        cpu_ops: None,
    })
}

/// Prefill and decode seconds of `prompts.len()` sequences on the GPU: each prompt is
/// prefilled alone, then each decode step is one multi-sequence pass ending in a per-row
/// GPU argmax. Warm-up first where `warm`, as [`time_gpu`].
fn time_gpu_batched(
    g: &mut GpuModel,
    prompts: &[Vec<u32>],
    n_gen: usize,
    warm: bool,
) -> Result<Timings> {
    let seqs: Vec<GpuSeq> = prompts
        .iter()
        .map(|_| g.new_seq())
        .collect::<ternion::Result<_>>()?;
    let run = |g: &mut GpuModel, steps: usize, profile: bool| -> Result<(f64, f64)> {
        for s in &seqs {
            s.truncate(0);
        }
        let t = Instant::now();
        let mut next = Vec::with_capacity(seqs.len());
        for (s, p) in seqs.iter().zip(prompts) {
            let best = g.forward_seqs_topk(&[GpuSeqStep { seq: s, tokens: p }])?;
            next.push(best[0][0].0);
        }
        let prefill_s = t.elapsed().as_secs_f64();
        if profile {
            g.reset_profile();
        }
        let t = Instant::now();
        for _ in 0..steps {
            let steps: Vec<GpuSeqStep<'_>> = seqs
                .iter()
                .zip(&next)
                .map(|(seq, t)| GpuSeqStep {
                    seq,
                    tokens: std::slice::from_ref(t),
                })
                .collect();
            let best = g.forward_seqs_topk(&steps)?;
            next = best.iter().map(|b| b[0].0).collect();
        }
        Ok((prefill_s, t.elapsed().as_secs_f64()))
    };
    let start = Instant::now();
    while warm && start.elapsed().as_secs_f64() < 1.5 {
        run(g, n_gen.min(16), false)?;
    }
    let (prefill_s, decode_s) = run(g, n_gen, true)?;
    Ok(Timings {
        prefill_s,
        decode_s,
        decode_cpu_s: None,
        cpu_ops: None,
    })
}

/// Mean and (sample) standard deviation of `xs` (0 for one value).
fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// " ± sd" with `digits` decimals after a mean of several repetitions, else nothing.
fn spread(reps: usize, sd: f64, digits: usize) -> String {
    if reps > 1 {
        format!(" ± {sd:.digits$}")
    } else {
        String::new()
    }
}

/// Prints a per-kernel breakdown over `n_gen` steps, largest first.
fn print_profile(title: &str, p: &[KernelTime], n_gen: usize) {
    let per_tok = |ns: f64| ns / 1e3 / n_gen.max(1) as f64;
    let total: f64 = p.iter().map(|k| k.total_ns).sum();
    let mut rows: Vec<&KernelTime> = p.iter().collect();
    rows.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
    println!("{title}: {:.0} µs in kernels", per_tok(total));
    for k in rows {
        println!(
            "  {:<10} {:>5} launches {:>9.1} µs  {:>5.1}%",
            k.label,
            k.count / n_gen.max(1) as u64,
            per_tok(k.total_ns),
            100.0 * k.total_ns / total.max(1.0)
        );
    }
}

/// Prints the CPU decode profile: the graph's ops grouped by
/// [`ternion::model::Op::label`] (every layer's instance together), per token, largest
/// first, with the bytes each reads (weights; attention: its KV cache, the mean over the
/// steps after an `n_prompt`-token prompt) and their rate, after the time the steps spent
/// outside the ops (sampling, the step's set-up).
fn print_cpu_profile(
    model: &Model,
    ops: &[(u64, f64)],
    (n_prompt, n_gen): (usize, usize),
    decode_s: f64,
) {
    let graph = model.graph();
    let per_tok = n_gen.max(1) as f64;
    // label → (instances a step, seconds, weight bytes a step)
    let mut rows: Vec<(String, u64, f64, u64)> = Vec::new();
    for (op, &(calls, secs)) in graph.ops.iter().zip(ops) {
        let label = match op.products().iter().any(|&(_, out)| out == graph.logits) {
            true => format!("LM head: {}", op.label(&graph.weights)),
            false => op.label(&graph.weights),
        };
        let bytes = match op {
            Op::SelfAttention { layer, .. } => mean_over_steps(n_prompt, n_gen, |positions| {
                model.layer_kv_bytes_read(*layer, positions)
            }),
            _ => model.op_weight_bytes(op),
        };
        match rows.iter_mut().find(|r| r.0 == label) {
            Some(r) => (r.1, r.2, r.3) = (r.1 + calls, r.2 + secs, r.3 + bytes),
            None => rows.push((label, calls, secs, bytes)),
        }
    }
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let in_ops: f64 = rows.iter().map(|r| r.2).sum();
    println!(
        "decode profile (CPU, wall clock per token): {:.2} ms in the graph's ops, {:.2} ms outside them",
        1e3 * in_ops / per_tok,
        1e3 * (decode_s - in_ops).max(0.0) / per_tok,
    );
    for (label, calls, secs, bytes) in rows {
        let rate = match bytes {
            0 => String::new(),
            b => format!(
                "  {:>6.1} MB {:>6.1} GB/s",
                b as f64 / 1e6,
                b as f64 * per_tok / secs.max(1e-12) / 1e9
            ),
        };
        println!(
            "  {label:<44} {:>4}× {:>8.3} ms {:>5.1}%{rate}",
            calls / n_gen.max(1) as u64,
            1e3 * secs / per_tok,
            100.0 * secs / decode_s.max(1e-12),
        );
    }
}

/// The CPU pool's share of the decode steps ([`PoolStats`]): its parallel ops, the
/// threads' idle time inside them, and the time between them, when the caller works alone
/// and the memory bus idles.
fn print_pool_stats(s: &PoolStats, n_gen: usize, decode_s: f64) {
    let per_tok = n_gen.max(1) as f64;
    let between = (decode_s - s.parallel_s).max(0.0);
    println!(
        "CPU pool: {:.0} parallel ops a token, {:.2} ms, the threads idle {:.1}% of it (waiting for the last chunk); between them the caller alone: {:.2} ms ({:.1}% of the token; {:.0} single-task ops of {:.2} ms among it)",
        s.parallel_ops as f64 / per_tok,
        1e3 * s.parallel_s / per_tok,
        100.0 * s.idle_share(),
        1e3 * between / per_tok,
        100.0 * between / decode_s.max(1e-12),
        s.inline_ops as f64 / per_tok,
        1e3 * s.inline_s / per_tok,
    );
}

/// The mean of `bytes(positions)` over `n_gen` decode steps after an `n_prompt`-token
/// prompt (step i attends `n_prompt + i + 1` positions); 0 without steps.
fn mean_over_steps(n_prompt: usize, n_gen: usize, bytes: impl Fn(usize) -> u64) -> u64 {
    let total: u64 = (0..n_gen).map(|i| bytes(n_prompt + i + 1)).sum();
    total / n_gen.max(1) as u64
}

/// Runs `ternion bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    let threads = common::init_threads(a.threads)?;
    let path = match (&a.model, &a.synthetic) {
        (Some(p), _) => p.clone(),
        (None, Some(name)) => synthetic_path(name)?,
        (None, None) => bail!("give --model FILE or --synthetic NAME"),
    };
    if a.n_prompt == 0 {
        bail!("-p must be at least 1");
    }
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if a.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    let t0 = Instant::now();
    let (_file, model) = model::load_with(&path, &a.lm_head.load_options())
        .with_context(|| format!("loading {}", path.display()))?;
    let model = model.with_kv_type(a.backend.kv_type);
    let load_s = t0.elapsed().as_secs_f64();
    let cfg = model.config();
    let n_ctx = a.n_prompt + a.n_gen + 1;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let prompts: Vec<Vec<u32>> = (0..a.batch)
        .map(|_| {
            (0..a.n_prompt)
                .map(|_| rng.random_range(0..cfg.n_vocab as u32))
                .collect()
        })
        .collect();
    let prompt = &prompts[0];

    let gopts = GpuModelOptions {
        n_ctx,
        max_batch: a.ubatch.max(a.batch),
        max_seqs: if a.batch > 1 { a.batch } else { 0 },
        top_k: 1,
        profile: a.profile,
        ..GpuModelOptions::default()
    };
    let mut gpu = a.backend.gpu_with(&model, gopts)?;
    if a.profile && gpu.is_none() && a.batch > 1 {
        bail!("--profile on the CPU times single-sequence decode: leave out --batch");
    }
    let backend = if gpu.is_some() { "gpu" } else { "cpu" };
    // The profile times one run's steps.
    let reps = if a.profile { 1 } else { a.repetitions };
    // The CPU's bandwidth is measured before the runs as well as after: a shared host's
    // can change within seconds (BENCHMARKS.md, session 26), and decode is compared with
    // the higher of the two.
    let read_bw_before = gpu
        .is_none()
        .then(ternion::backend::cpu::measure_read_bandwidth);
    // How far apart the threads run, beside each bandwidth measurement: the placement
    // that explains a shared host's two bandwidth levels (BENCHMARKS.md, session 35).
    let handoff_before = gpu.is_none().then(handoff_ns).flatten();
    let peak_counts_runs = read_bw_before.is_none() || reset_peak_rss();
    let mut runs = Vec::with_capacity(reps);
    for r in 0..reps {
        let warm = r == 0;
        runs.push(match &mut gpu {
            Some(g) if a.batch > 1 => time_gpu_batched(g, &prompts, a.n_gen, warm)?,
            Some(g) => time_gpu(g, prompt, a.n_gen, warm)?,
            None if a.batch > 1 => time_cpu_batched(&model, &prompts, a.n_gen, n_ctx, warm)?,
            None => time_cpu(&model, prompt, (a.n_gen, n_ctx), warm, a.profile)?,
        });
    }
    let prefill_reps: Vec<f64> = runs
        .iter()
        .map(|t| (a.batch * a.n_prompt) as f64 / t.prefill_s)
        .collect();
    let decode_reps: Vec<f64> = runs
        .iter()
        .map(|t| (a.batch * a.n_gen) as f64 / t.decode_s.max(1e-9))
        .collect();
    let (prefill_tok_s, prefill_sd) = mean_sd(&prefill_reps);
    let (decode_tok_s, decode_sd) = mean_sd(&decode_reps);
    let decode_cpu_s = runs
        .iter()
        .map(|t| t.decode_cpu_s)
        .sum::<Option<f64>>()
        .map(|c| c / reps as f64);
    // For a batch: the step time shared out over its sequences (1000 / decode tok/s).
    let ms_per_token = 1e3 / decode_tok_s.max(1e-9);
    let bytes = model.weight_bytes_per_token();
    // Weights are read once per step, whatever the batch; each sequence reads its own KV
    // cache (1 % of a 2B-4T step's bytes at 128 positions, 7 % at 1,024).
    let kv_bytes = a.batch as u64
        * mean_over_steps(a.n_prompt, a.n_gen, |positions| {
            model.kv_bytes_read(positions)
        });
    let gb_s = (bytes + kv_bytes) as f64 * (decode_tok_s / a.batch as f64) / 1e9;
    let rss = peak_rss().filter(|_| peak_counts_runs);
    println!(
        "{}: {} layers, width {}, vocab {}",
        path.display(),
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_vocab
    );
    let dispatches = gpu.as_ref().map(|g| g.dispatches_per_token());
    println!(
        "{backend}, {threads} threads, batch {} | load {load_s:.2} s | pp{}: {prefill_tok_s:.1}{} tok/s | tg{}: {decode_tok_s:.2}{} tok/s, {ms_per_token:.1} ms/token | a step reads {:.0} MB of weights + {:.1} MB of KV cache (mean), {gb_s:.1} GB/s | peak RSS {}",
        a.batch,
        a.n_prompt,
        spread(reps, prefill_sd, 1),
        a.n_gen,
        spread(reps, decode_sd, 2),
        bytes as f64 / 1e6,
        kv_bytes as f64 / 1e6,
        rss.map_or("?".into(), |r| format!("{:.0} MB", r as f64 / 1e6)),
    );
    // On the CPU one probe buffer serves the bandwidth after the runs and the step-by-step
    // shares below.
    let cpu_probe = gpu.is_none().then(ReadProbe::new);
    let (read_bw, launch_us) = match (&gpu, &cpu_probe) {
        (Some(g), _) => (
            measure_read_bandwidth(g.context())?,
            Some(measure_dispatch_latency(g.context())?),
        ),
        (None, probe) => (probe.as_ref().map_or(0.0, ReadProbe::best), None),
    };
    let handoff_after = gpu.is_none().then(handoff_ns).flatten();
    match launch_us {
        Some(us) => println!(
            "measured read bandwidth {read_bw:.0} GB/s: decode reaches {:.1}% of it; one dependent launch {us:.2} µs ({} per token: {:.2} ms)",
            100.0 * gb_s / read_bw,
            dispatches.unwrap_or(0),
            us * dispatches.unwrap_or(0) as f64 / 1e3,
        ),
        None => {
            let before = read_bw_before.unwrap_or(read_bw);
            let high = before.max(read_bw);
            println!(
                "measured read bandwidth {before:.1} GB/s before the runs, {read_bw:.1} GB/s after ({threads} threads, {}-byte loads): decode reaches {:.1}% of the higher",
                cpu_probe.as_ref().map_or(0, ReadProbe::load_bytes),
                100.0 * gb_s / high,
            );
            if high > 1.15 * before.min(read_bw) || gb_s > high {
                let cause = match moved_between_l3s(handoff_before, handoff_after) {
                    true => "the threads moved between L3s, below",
                    false => "a neighbour's load?",
                };
                println!(
                    "the machine's bandwidth moved during the runs (the two probes differ by more than 15%, or decode read faster than both; {cause}): the ratio is uncertain"
                );
            }
        }
    }
    if let Some(line) = handoff_line(handoff_before, handoff_after) {
        println!("{line}");
    }
    let paired = match (&cpu_probe, a.batch, a.n_gen) {
        (Some(probe), 1, 1..) => Some(paired_shares(
            &model,
            probe,
            prompt,
            (a.n_gen, n_ctx),
            bytes,
        )?),
        _ => None,
    };
    let cpu_probe_load_bytes = cpu_probe.as_ref().map(ReadProbe::load_bytes);
    drop(cpu_probe);
    let paired_q = paired
        .as_ref()
        .and_then(|p| share_quartiles(p, |_| true))
        .map(|q| q.0);
    if let Some([q1, median, q3]) = paired_q {
        println!(
            "step by step, each decode step beside a probe pass: decode reaches {median:.1}% of the higher pass beside it (quartiles {q1:.1}–{q3:.1}%, {} steps)",
            a.n_gen
        );
    }
    let by_place = paired.as_ref().map(|p| {
        [Placement::SharedL3, Placement::SeparateL3].map(|w| share_quartiles(p, |pl| pl == w))
    });
    if let Some([shared, separate]) = by_place {
        let part = |name: &str, q: Option<([f64; 3], usize)>| {
            q.map(|([q1, m, q3], n)| format!("{name} {m:.1}% ({q1:.1}–{q3:.1}%, {n} steps)"))
        };
        let parts: Vec<String> = [part("on one L3", shared), part("on separate L3s", separate)]
            .into_iter()
            .flatten()
            .collect();
        if !parts.is_empty() {
            println!(
                "  by the threads' placement beside the step: {}",
                parts.join("; ")
            );
        }
    }
    if let Some(t) = runs.last() {
        if let Some((ops, pool)) = &t.cpu_ops {
            print_pool_stats(pool, a.n_gen, t.decode_s);
            print_cpu_profile(&model, ops, (a.n_prompt, a.n_gen), t.decode_s);
        }
    }
    let profile = gpu.as_ref().and_then(|g| g.profile());
    if let Some(p) = &profile {
        let title = if a.batch > 1 {
            format!(
                "decode profile (GPU timestamps, per step of {} sequences)",
                a.batch
            )
        } else {
            "decode profile (GPU timestamps, per token)".to_string()
        };
        print_profile(&title, p, a.n_gen);
    }
    if a.json {
        let v = json!({
            "model": path.display().to_string(),
            "backend": backend,
            "kernels": gpu.as_ref().map(|g| {
                let c = g.context().caps();
                json!({
                    "adapter": c.name,
                    "f16": c.f16,
                    "subgroups": c.subgroups,
                    "subgroup_min_size": c.subgroup_min_size,
                    "prefill": format!("{:?}", c.prefill).to_lowercase(),
                    "sms": c.sms,
                })
            }),
            "dispatches_per_token": dispatches,
            "threads": threads,
            "simd": ternion::backend::cpu::simd::Level::detect().name(),
            "ternary_tiles": ternion::backend::cpu::simd::Tiles::get().map(|t| t.name()),
            "lm_head": format!("{:?}", a.lm_head),
            "n_prompt": a.n_prompt,
            "n_gen": a.n_gen,
            "batch": a.batch,
            "repetitions": reps,
            "prefill_tok_s": prefill_tok_s,
            "prefill_tok_s_sd": prefill_sd,
            "prefill_tok_s_reps": prefill_reps,
            "decode_tok_s": decode_tok_s,
            "decode_tok_s_sd": decode_sd,
            "decode_tok_s_reps": decode_reps,
            "ms_per_token": ms_per_token,
            "decode_cpu_s": decode_cpu_s,
            "decode_tok_per_cpu_s": decode_cpu_s.map(|c| (a.batch * a.n_gen) as f64 / c),
            "weight_bytes_per_token": bytes,
            "kv_bytes_per_step": kv_bytes,
            "achieved_gb_s": gb_s,
            "read_bandwidth_gb_s": read_bw,
            "read_bandwidth_before_gb_s": read_bw_before,
            "read_probe_load_bytes": cpu_probe_load_bytes,
            "thread_handoff_ns_before": handoff_before,
            "thread_handoff_ns_after": handoff_after,
            "decode_share_per_step_pct": paired_q.map(|[q1, median, q3]| json!({
                "q1": q1, "median": median, "q3": q3,
            })),
            "decode_share_per_step_pct_by_placement": by_place.map(|qs| {
                let j = |q: Option<([f64; 3], usize)>| q.map(|([q1, median, q3], n)| json!({
                    "q1": q1, "median": median, "q3": q3, "steps": n,
                }));
                json!({ "shared_l3": j(qs[0]), "separate_l3": j(qs[1]) })
            }),
            "dependent_launch_us": launch_us,
            "profile": profile.as_ref().map(|p| p.iter().map(|k| json!({
                "kernel": k.label,
                "launches_per_token": k.count as f64 / a.n_gen.max(1) as f64,
                "us_per_token": k.total_ns / 1e3 / a.n_gen.max(1) as f64,
            })).collect::<Vec<_>>()),
            "load_s": load_s,
            "peak_rss_bytes": rss,
            "file_bytes": std::fs::metadata(&path).map(|m| m.len()).ok(),
        });
        println!("{v}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest rank: quartiles of five values are the 2nd, 3rd and 4th; one value is
    /// every quantile.
    #[test]
    fn quantiles_take_the_nearest_rank() {
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!([0.25, 0.5, 0.75].map(|q| quantile(&xs, q)), [2.0, 3.0, 4.0]);
        assert_eq!((quantile(&xs, 0.0), quantile(&xs, 1.0)), (1.0, 5.0));
        assert_eq!(quantile(&[7.0], 0.75), 7.0);
    }

    /// The placement line names both measurements, a missing one as "?", and is left out
    /// when neither was made (one thread, or a GPU run).
    #[test]
    fn handoff_line_names_both_measurements() {
        let line = handoff_line(Some(34.2), Some(161.6)).unwrap();
        assert!(
            line.contains("in 34 ns before the runs, 162 ns after"),
            "{line}"
        );
        let line = handoff_line(None, Some(40.0)).unwrap();
        assert!(line.contains("in ? before the runs, 40 ns after"), "{line}");
        assert_eq!(handoff_line(None, None), None);
    }

    /// A step counts as on one L3 or on separate ones only when both handoffs beside it
    /// agree; the quartiles of each class are those of its steps alone.
    #[test]
    fn steps_split_by_placement() {
        assert_eq!(placement(Some(34.0), Some(40.0)), Placement::SharedL3);
        assert_eq!(placement(Some(160.0), Some(80.0)), Placement::SeparateL3);
        assert_eq!(placement(Some(34.0), Some(160.0)), Placement::Unknown);
        assert_eq!(placement(None, Some(34.0)), Placement::Unknown);
        assert_eq!(placement(None, None), Placement::Unknown);
        // The "bandwidth moved" message names a move only across the same threshold.
        assert!(moved_between_l3s(Some(34.0), Some(160.0)));
        assert!(moved_between_l3s(Some(160.0), Some(79.0)));
        assert!(!moved_between_l3s(Some(90.0), Some(190.0)));
        assert!(!moved_between_l3s(Some(30.0), Some(70.0)));
        assert!(!moved_between_l3s(None, Some(160.0)));
        let shares = [
            (0.70, Placement::SeparateL3),
            (0.80, Placement::SeparateL3),
            (0.90, Placement::Unknown),
            (0.94, Placement::SharedL3),
            (0.96, Placement::SharedL3),
            (0.98, Placement::SharedL3),
        ];
        let shared = share_quartiles(&shares, |p| p == Placement::SharedL3).unwrap();
        assert_eq!(shared.1, 3);
        assert!((shared.0[1] - 96.0).abs() < 1e-9, "{shared:?}");
        let separate = share_quartiles(&shares, |p| p == Placement::SeparateL3).unwrap();
        assert_eq!(separate.1, 2);
        let all = share_quartiles(&shares, |_| true).unwrap();
        assert_eq!(all.1, 6);
        assert_eq!(
            share_quartiles(&shares[..2], |p| p == Placement::SharedL3),
            None
        );
    }
}
