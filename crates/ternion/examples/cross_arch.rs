//! Holds one machine's CPU results to another's, end to end, on tiny models of every
//! weight format the CPU multiplies (golden models from `../shared`).
//!
//! `cross_arch write FILE` runs a fixed prompt and greedy steps on each model and writes
//! the greedy ids and each position's top logits; `cross_arch check FILE` runs the same
//! models teacher-forced with those ids and fails unless every listed logit is within
//! [`TOL`] and every clear top-1 agrees. scripts/test.sh writes the file on x86-64 and
//! checks it on aarch64 under qemu, so the NEON kernels meet the x86 ones.

use std::error::Error;
use std::fmt::Write as _;

use ternion::model::{self, Logits};
use ternion_testkit::shared;

/// The models (paths in `../shared`) and the formats they exercise.
const MODELS: [(&str, &str); 19] = [
    ("golden-bitnet/bitnet-b158-tiny-pub.gguf", "I2_S, F16 head"),
    ("golden/models/bitnet-l3-d256-tq1_0.gguf", "TQ1_0"),
    ("golden/models/bitnet-spm-d256-tq2_0.gguf", "TQ2_0"),
    ("golden/models/llama-spm-d32-q8_0.gguf", "Q8_0"),
    ("golden/models/llama-spm-d32-q4_0.gguf", "Q4_0"),
    ("golden2/models/llama-spm-d64-q5_0.gguf", "Q5_0"),
    ("golden2/models/llama-smollm-d64-q4_1.gguf", "Q4_1"),
    ("golden2/models/llama-spm-d64-q5_1.gguf", "Q5_1"),
    ("golden2/models/llama-spm-d64-iq4_nl.gguf", "IQ4_NL"),
    ("golden2/models/llama-spm-d256-q2_k.gguf", "Q2_K"),
    ("golden2-extra/models/llama-spm-d256-q3_k.gguf", "Q3_K"),
    ("golden/models/llama-spm-d256-q4_k.gguf", "Q4_K"),
    ("golden2-extra/models/llama-spm-d256-q5_k.gguf", "Q5_K"),
    ("golden/models/llama-spm-d256-q6_k.gguf", "Q6_K"),
    ("golden2-extra/models/llama-spm-d256-iq4_xs.gguf", "IQ4_XS"),
    ("golden2/models/llama-spm-b128-q1_0.gguf", "Q1_0"),
    ("golden2/models/llama-spm-t64-q2_0.gguf", "Q2_0"),
    ("golden/models/llama-spm-d32-f16.gguf", "F16"),
    ("golden/models/llama-spm-d32-f32.gguf", "F32"),
];
/// Prompt tokens (fixed ids below every vocabulary's size).
const PROMPT_LEN: usize = 12;
/// Greedy steps after the prompt.
const STEPS: usize = 8;
/// Logits recorded per position (the largest).
const TOP: usize = 8;
/// Largest |Δ logit| allowed: the machines differ only in float summation order (integer
/// dots are exact on both), and the logits are about ±15.
const TOL: f32 = 2e-3;

/// One model's run: the logits of every position (prompt, then one per greedy step) and
/// the greedy ids.
struct Run {
    rows: Vec<Vec<f32>>,
    ids: Vec<u32>,
}

/// Runs `path`: the prompt, then [`STEPS`] greedy steps, feeding `forced` ids if given.
fn run(path: &str, forced: Option<&[u32]>) -> Result<Run, Box<dyn Error>> {
    let (_file, m) = model::load(shared::shared_path(path))?;
    let mut st = m.cpu_state(PROMPT_LEN + STEPS + 1);
    let prompt: Vec<u32> = (0..PROMPT_LEN)
        .map(|i| (i * 37 + 11) as u32 % 200)
        .collect();
    let all = m.forward_cpu(&prompt, Logits::All, &mut st)?;
    let n_vocab = all.len() / PROMPT_LEN;
    let mut rows: Vec<Vec<f32>> = all.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect();
    let mut ids = Vec::with_capacity(STEPS);
    for s in 0..STEPS {
        let id = match forced {
            Some(f) => f[s],
            None => top(rows.last().expect("prompt rows"), 1)[0].0,
        };
        ids.push(id);
        rows.push(m.forward_cpu(&[id], Logits::Last, &mut st)?.to_vec());
    }
    Ok(Run { rows, ids })
}

/// The `n` largest logits of `row` as (id, value), largest first (ties: lowest id).
fn top(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, x))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

/// The text `check` reads: per model a `model`, an `ids` and one `top` line per position.
fn write(out: &str) -> Result<(), Box<dyn Error>> {
    let mut text = String::new();
    for (path, what) in MODELS {
        let r = run(path, None)?;
        writeln!(text, "model {path}")?;
        let ids: Vec<String> = r.ids.iter().map(u32::to_string).collect();
        writeln!(text, "ids {}", ids.join(" "))?;
        for row in &r.rows {
            let t: Vec<String> = top(row, TOP)
                .iter()
                .map(|(i, v)| format!("{i}:{v}"))
                .collect();
            writeln!(text, "top {}", t.join(" "))?;
        }
        println!("{what:>14}: {path}: greedy ids {}", ids.join(" "));
    }
    std::fs::write(out, text)?;
    Ok(())
}

/// One model's reference as `write` wrote it.
struct Reference {
    path: String,
    ids: Vec<u32>,
    tops: Vec<Vec<(u32, f32)>>,
}

fn parse(text: &str) -> Result<Vec<Reference>, Box<dyn Error>> {
    let mut refs: Vec<Reference> = Vec::new();
    for line in text.lines() {
        let (key, rest) = line
            .split_once(' ')
            .ok_or("reference: line without a key")?;
        match (key, refs.last_mut()) {
            ("model", _) => refs.push(Reference {
                path: rest.to_string(),
                ids: Vec::new(),
                tops: Vec::new(),
            }),
            ("ids", Some(r)) => {
                r.ids = rest.split(' ').map(str::parse).collect::<Result<_, _>>()?;
            }
            ("top", Some(r)) => r.tops.push(
                rest.split(' ')
                    .map(|e| {
                        let (i, v) = e.split_once(':').ok_or("reference: entry without ':'")?;
                        Ok((i.parse()?, v.parse()?))
                    })
                    .collect::<Result<_, Box<dyn Error>>>()?,
            ),
            _ => return Err(format!("reference: unexpected line {line:?}").into()),
        }
    }
    Ok(refs)
}

/// Compares this machine's runs with the reference; returns the failures.
fn check(reference: &str) -> Result<Vec<String>, Box<dyn Error>> {
    let refs = parse(&std::fs::read_to_string(reference)?)?;
    if refs.len() != MODELS.len() {
        return Err(format!(
            "reference holds {} models, expected {}",
            refs.len(),
            MODELS.len()
        )
        .into());
    }
    let mut failures = Vec::new();
    for (r, (path, what)) in refs.iter().zip(MODELS) {
        if r.path != path || r.ids.len() != STEPS || r.tops.len() != PROMPT_LEN + STEPS {
            return Err(format!("reference entry {:?} does not match {path}", r.path).into());
        }
        let got = run(path, Some(&r.ids))?;
        let mut worst = 0f32;
        for (p, (want, row)) in r.tops.iter().zip(&got.rows).enumerate() {
            for &(id, v) in want {
                worst = worst.max((row[id as usize] - v).abs());
            }
            let clear = want[0].1 - want[1].1 > 2.0 * TOL;
            let argmax = top(row, 1)[0].0;
            if clear && argmax != want[0].0 {
                failures.push(format!(
                    "{path}: position {p}: top-1 {argmax}, reference {}",
                    want[0].0
                ));
            }
        }
        if worst > TOL {
            failures.push(format!("{path}: max |Δ logit| {worst} > {TOL}"));
        }
        println!("{what:>14}: {path}: max |Δ logit| {worst:.2e}");
    }
    Ok(failures)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let level = ternion::backend::cpu::simd::Level::detect().name();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", out] => {
            println!("cross_arch: writing {out} ({level} kernels)");
            write(out)
        }
        ["check", reference] => {
            println!("cross_arch: checking against {reference} ({level} kernels)");
            let failures = check(reference)?;
            if failures.is_empty() {
                println!("cross_arch: all {} models agree", MODELS.len());
                Ok(())
            } else {
                Err(failures.join("\n").into())
            }
        }
        _ => Err("usage: cross_arch write FILE | cross_arch check FILE".into()),
    }
}
