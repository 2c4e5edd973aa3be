//! `ternion validate` for the multi-family golden set (`../shared/golden/manifest.json`):
//! `models` and `cases`, each case with llama.cpp's run A (the shipped GGUF; top-20 logits
//! at every prompt position and the top-5 at each of 32 greedy steps) and, for non-F32
//! models, run B (the same weights dequantized to F32), plus some full-vocab rows.
//!
//! Run A quantizes activations (Q8_0, Q8_K, F16) with chaotic rounding, and used an F32 KV
//! cache where ours is F16 unless `--kv-type f32` asks for the same, so the checks are the
//! loose ones the set's README suggests:
//! 1. tokens: ours equal the golden `tokens`;
//! 2. prompt logits (one batch) against A's top-20 at every position: max |diff| below the
//!    case's tolerance and top-1 agreement ≥ 65 % of positions; where B exists, max |diff|
//!    below the larger of 1.5 × the tolerance (ours within it of A, A within half of it of
//!    B) and 2.0 against it too. The tolerance is the case's `tolerance` when it has one
//!    (for cases whose B is A, such as F32 files), else 2 × its `top20_max_abs_diff_A_vs_B`
//!    (llama.cpp's own A-vs-B difference, golden2 and later) when the case has that field,
//!    else the first set's flat 2.0; the greedy top-5 use the same tolerance;
//! 3. full-vocab rows (A or B, as stored): RMS < 0.15 (cosine reported);
//! 4. greedy: the golden tokens teacher-forced, our top-1 must equal the golden id at
//!    every step whose golden margin (top-1 − top-2) exceeds [`GREEDY_MARGIN`], and the
//!    free-running prefix (steps equal before the first difference) must reach the first
//!    near-tie, the first step whose golden margin is below the case's tolerance.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use ternion::sample::argmax;
use ternion::tokenizer::{Tokenizer, TokenizerOptions};

use crate::common::{self, BackendArgs};
use crate::validate::{ids, read_f32, Load};

/// Largest |ours − golden| over the top-20 ids (A or B) for cases without their own figure.
const TOP20_MAX_ABS: f32 = 2.0;
/// A case's tolerance is this many times its `top20_max_abs_diff_A_vs_B`.
const A_VS_B_FACTOR: f32 = 2.0;
/// Largest RMS difference over a stored full-vocab row.
const ROW_RMS: f64 = 0.15;
/// Smallest share of prompt positions whose top-1 equals A's.
const TOP1_MIN: f64 = 0.65;
/// Greedy steps whose golden margin exceeds this must agree (teacher-forced).
const GREEDY_MARGIN: f32 = 0.5;

/// One row of top-k ids and logits per position.
struct TopK {
    ids: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
}

fn topk(v: &Value, what: &str) -> Result<TopK> {
    let rows = |k: &str| -> Result<&Vec<Value>> {
        v[k].as_array()
            .with_context(|| format!("{what}: '{k}' is not a list"))
    };
    let ids = rows("ids")?
        .iter()
        .map(|r| ids(r, what))
        .collect::<Result<Vec<_>>>()?;
    let logits = rows("logits")?
        .iter()
        .map(|r| {
            r.as_array()
                .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
                .with_context(|| format!("{what}: logits row"))
        })
        .collect::<Result<Vec<Vec<f32>>>>()?;
    if ids.len() != logits.len() {
        bail!(
            "{what}: {} id rows but {} logit rows",
            ids.len(),
            logits.len()
        );
    }
    Ok(TopK { ids, logits })
}

/// Max |ours − golden| over the golden top-k ids of each row; `ours` is rows × n_vocab.
fn topk_max_abs(ours: &[f32], n_vocab: usize, g: &TopK) -> f32 {
    let mut worst = 0f32;
    for (r, (ids, ls)) in g.ids.iter().zip(&g.logits).enumerate() {
        let row = &ours[r * n_vocab..][..n_vocab];
        for (&i, &l) in ids.iter().zip(ls) {
            let d = (row[i as usize] - l).abs();
            worst = if d.is_nan() {
                f32::INFINITY
            } else {
                worst.max(d)
            };
        }
    }
    worst
}

/// (max |diff|, RMS, cosine) of two equal-length rows.
fn row_stats(a: &[f32], b: &[f32]) -> (f32, f64, f64) {
    let (mut max_abs, mut sq, mut dot, mut na, mut nb) = (0f32, 0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        max_abs = max_abs.max((x - y).abs());
        let (x, y) = (f64::from(x), f64::from(y));
        sq += (x - y) * (x - y);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    (
        max_abs,
        (sq / a.len().max(1) as f64).sqrt(),
        dot / (na.sqrt() * nb.sqrt()).max(1e-30),
    )
}

/// A case's logit tolerance: its `tolerance` field as given (for cases whose run B is run A,
/// such as F32 files), else [`A_VS_B_FACTOR`] × its `top20_max_abs_diff_A_vs_B`, else
/// [`TOP20_MAX_ABS`].
fn case_tolerance(c: &Value) -> Result<f32> {
    let positive = |key: &str, f: f64| -> Result<f32> {
        if f.is_finite() && f > 0.0 {
            Ok(f as f32)
        } else {
            bail!("{key} {f} is not positive")
        }
    };
    if let Some(f) = c["tolerance"].as_f64() {
        return positive("tolerance", f);
    }
    match c["top20_max_abs_diff_A_vs_B"].as_f64() {
        Some(f) => Ok(A_VS_B_FACTOR * positive("top20_max_abs_diff_A_vs_B", f)?),
        None => Ok(TOP20_MAX_ABS),
    }
}

/// Positions a case runs: its prompt (`n_tokens`, else the `tokens` given in the manifest)
/// and its greedy steps.
fn case_positions(c: &Value) -> usize {
    let len = |k: &str| c[k].as_array().map_or(0, Vec::len);
    let prompt = c["n_tokens"]
        .as_u64()
        .map_or_else(|| len("tokens"), |n| n as usize);
    prompt + len("greedy_ids") + 1
}

/// What one model's cases amounted to.
#[derive(Default)]
struct Summary {
    cases: usize,
    max_a: f32,
    max_b: Option<f32>,
    top1: (usize, usize),
    greedy_prefix: Vec<usize>,
    failures: usize,
}

/// Runs every case of a multi-family golden manifest (only those of models whose file
/// name contains one of `only`, when it is not empty).
pub fn validate(
    m: &Value,
    dir: &Path,
    load: &Load,
    backend: &BackendArgs,
    only: &[String],
) -> Result<()> {
    let all = m["cases"].as_array().context("manifest: cases")?;
    let wanted = |c: &&Value| {
        only.is_empty()
            || c["model"]
                .as_str()
                .is_some_and(|f| only.iter().any(|o| f.contains(o.as_str())))
    };
    let cases: Vec<&Value> = all.iter().filter(wanted).collect();
    if cases.is_empty() {
        bail!("no case of the manifest matches --only {}", only.join(","));
    }
    let mut by_model: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    let mut order = Vec::new();
    for &c in &cases {
        let f = c["model"].as_str().context("case: model")?.to_string();
        if !by_model.contains_key(&f) {
            order.push(f.clone());
        }
        by_model.entry(f).or_default().push(c);
    }
    let mut summaries = Vec::new();
    let mut failures = 0;
    for file_name in &order {
        let path = dir.join(file_name);
        let (file, model) = load.load(&path)?;
        let tok = Tokenizer::from_gguf(&file, &TokenizerOptions::default())?;
        let cfg = model.config();
        // The GPU's context holds the longest case: its prompt and greedy steps.
        let need = by_model[file_name].iter().map(|c| case_positions(c)).max();
        let n_ctx = need.unwrap_or(0).max(512).min(cfg.n_ctx_train);
        let mut gpu = backend.gpu(&model, n_ctx)?;
        let n_vocab = cfg.n_vocab;
        let short = Path::new(file_name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(file_name)
            .to_string();
        println!(
            "model {short} ({}, {} layers, vocab {n_vocab})",
            cfg.arch_name, cfg.n_layer
        );
        let mut sum = Summary::default();
        for c in &by_model[file_name] {
            let mut fails = Vec::new();
            let pid = c["prompt_id"].as_str().unwrap_or("?");
            let case: Value = {
                let p = dir.join(c["topk_file"].as_str().context("case: topk_file")?);
                let t = std::fs::read_to_string(&p)
                    .with_context(|| format!("reading {}", p.display()))?;
                serde_json::from_str(&t).with_context(|| format!("parsing {}", p.display()))?
            };
            let tokens = ids(&case["tokens"], "tokens")?;
            let n = tokens.len();
            let tol = case_tolerance(c).with_context(|| format!("case {pid}"))?;

            // 1. Tokenization.
            if let Some(text) = c["prompt_text"].as_str() {
                let add_bos = c["add_bos"].as_bool().unwrap_or(true);
                let ours = tok.encode(text, add_bos, true)?;
                if ours != tokens {
                    fails.push(format!("tokens: ours {ours:?} golden {tokens:?}"));
                }
            }

            // 2. Prompt logits against A's (and B's) top-20.
            let n_ctx = (n + 40).min(cfg.n_ctx_train);
            let mut s = common::session(&model, &mut gpu, n_ctx);
            let ours = s.logits_all(&tokens)?;
            let a = topk(&case["model_run"]["prompt_top20"], "model_run.prompt_top20")?;
            if a.ids.len() != n {
                bail!("{pid}: {} top-20 rows for {n} tokens", a.ids.len());
            }
            let max_a = topk_max_abs(&ours, n_vocab, &a);
            let agree = (0..n)
                .filter(|&r| argmax(&ours[r * n_vocab..][..n_vocab]) == a.ids[r][0])
                .count();
            if max_a >= tol {
                fails.push(format!("A top-20 max|diff| {max_a:.4} ≥ {tol:.4}"));
            }
            if (agree as f64) < TOP1_MIN * n as f64 {
                fails.push(format!("top-1 agreement {agree}/{n} < {TOP1_MIN}"));
            }
            let mut line =
                format!("  {pid}: A top-20 max|d| {max_a:.4} (tol {tol:.3})  top-1 {agree}/{n}");
            sum.max_a = sum.max_a.max(max_a);
            sum.top1.0 += agree;
            sum.top1.1 += n;
            let b_run = &case["ref_dequant_f32"];
            if b_run.is_object() {
                let b = topk(&b_run["prompt_top20"], "ref_dequant_f32.prompt_top20")?;
                let max_b = topk_max_abs(&ours, n_vocab, &b);
                line += &format!("  B top-20 max|d| {max_b:.4}");
                sum.max_b = Some(sum.max_b.unwrap_or(0.0).max(max_b));
                // Ours is within `tol` of A, and A within `tol / A_VS_B_FACTOR` of B.
                let tol_b = (tol * (1.0 + 1.0 / A_VS_B_FACTOR)).max(TOP20_MAX_ABS);
                if max_b >= tol_b {
                    fails.push(format!("B top-20 max|diff| {max_b:.3} ≥ {tol_b:.3}"));
                }
            }

            // 3. Full-vocab rows.
            for key in ["logits", "logits_model"] {
                let l = &c[key];
                let Some(f) = l["file"].as_str() else {
                    continue;
                };
                let pos = ids(&l["positions"], "logits.positions")?;
                let src = if l["source"].as_str() == Some("model") {
                    "A"
                } else {
                    "B"
                };
                let rows = read_f32(&dir.join(f), pos.len() * n_vocab)?;
                let (mut mx, mut sq, mut cos) = (0f32, 0f64, 1f64);
                for (i, &p) in pos.iter().enumerate() {
                    let (m_, rms, c_) = row_stats(
                        &ours[p as usize * n_vocab..][..n_vocab],
                        &rows[i * n_vocab..][..n_vocab],
                    );
                    mx = mx.max(m_);
                    sq += rms * rms;
                    cos = cos.min(c_);
                }
                let rms = (sq / pos.len().max(1) as f64).sqrt();
                line += &format!(
                    "  rows({src}, {}): max|d| {mx:.4} rms {rms:.4} cos {cos:.6}",
                    pos.len()
                );
                if rms >= ROW_RMS {
                    fails.push(format!("full rows ({src}) RMS {rms:.3} ≥ {ROW_RMS}"));
                }
            }

            drop(s);

            // 4. Greedy steps, teacher-forced.
            let greedy = ids(&case["model_run"]["greedy_ids"], "greedy_ids")?;
            let top5 = topk(&case["model_run"]["greedy_top5"], "greedy_top5")?;
            let n_ctx = (n + greedy.len() + 1).min(cfg.n_ctx_train);
            let mut s = common::session(&model, &mut gpu, n_ctx);
            let mut row = s.prefill(&tokens)?.to_vec();
            let (mut prefix, mut diverged, mut bad, mut confident, mut max5) =
                (0, false, Vec::new(), 0, 0f32);
            let (mut near_tie, mut split_margin) = (None, None);
            for (k, &g) in greedy.iter().enumerate() {
                let ours_id = argmax(&row);
                let gl = &top5.logits[k];
                let margin = gl[0] - gl.get(1).copied().unwrap_or(f32::NEG_INFINITY);
                if margin < tol && near_tie.is_none() {
                    near_tie = Some(k);
                }
                for (&i, &l) in top5.ids[k].iter().zip(gl) {
                    max5 = max5.max((row[i as usize] - l).abs());
                }
                if ours_id == g && !diverged {
                    prefix += 1;
                } else if !diverged {
                    diverged = true;
                    split_margin = Some(margin);
                }
                if margin > GREEDY_MARGIN {
                    confident += 1;
                    if ours_id != g {
                        bad.push(k);
                    }
                }
                if k + 1 < greedy.len() {
                    row = s.decode(g)?.to_vec();
                }
            }
            // Free-running ids equal until the first near-tie (golden margin < tol).
            let tie = near_tie.unwrap_or(greedy.len());
            let split =
                split_margin.map_or(String::new(), |m| format!(", golden margin there {m:.3}"));
            line += &format!(
                "  greedy: prefix {prefix}/{}{split} (first near-tie {tie})  confident steps {}/{confident} equal  top-5 max|d| {max5:.4}",
                greedy.len(),
                confident - bad.len()
            );
            sum.greedy_prefix.push(prefix);
            if prefix < tie {
                fails.push(format!(
                    "greedy ids differ at step {prefix}, before the first near-tie (step {tie}, \
                     golden margin < {tol:.3})"
                ));
            }
            if !bad.is_empty() {
                fails.push(format!(
                    "greedy top-1 differs at steps {bad:?} (golden margin > {GREEDY_MARGIN})"
                ));
            }
            if max5 >= tol {
                fails.push(format!("greedy top-5 max|diff| {max5:.4} ≥ {tol:.4}"));
            }
            println!("{line}");
            for f in &fails {
                println!("    FAIL {f}");
            }
            sum.cases += 1;
            sum.failures += fails.len();
            failures += fails.len();
        }
        summaries.push((short, sum));
    }
    println!("\nsummary (max over cases; top-1 over all prompt positions):");
    for (name, s) in &summaries {
        println!(
            "  {name:<28} A max|d| {:.3}  B max|d| {}  top-1 {}/{} ({:.0}%)  greedy prefixes {:?}  {}",
            s.max_a,
            s.max_b.map_or("-".into(), |b| format!("{b:.3}")),
            s.top1.0,
            s.top1.1,
            100.0 * s.top1.0 as f64 / s.top1.1.max(1) as f64,
            s.greedy_prefix,
            if s.failures == 0 {
                format!("ok ({} cases)", s.cases)
            } else {
                format!("{} FAILED checks", s.failures)
            }
        );
    }
    if failures > 0 {
        bail!("{failures} check(s) failed");
    }
    println!("all {} cases pass", cases.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tolerance_field_wins_then_twice_a_vs_b_then_flat() {
        let both = json!({"tolerance": 0.01, "top20_max_abs_diff_A_vs_B": 0.3});
        assert_eq!(case_tolerance(&both).unwrap(), 0.01);
        let a_vs_b = json!({"top20_max_abs_diff_A_vs_B": 0.3});
        assert!((case_tolerance(&a_vs_b).unwrap() - 0.6).abs() < 1e-6);
        assert_eq!(case_tolerance(&json!({})).unwrap(), TOP20_MAX_ABS);
    }

    #[test]
    fn tolerance_that_is_not_positive_is_an_error() {
        for bad in [
            json!({"tolerance": 0.0}),
            json!({"tolerance": -1.0}),
            json!({"top20_max_abs_diff_A_vs_B": 0.0}),
        ] {
            let e = case_tolerance(&bad).unwrap_err().to_string();
            assert!(e.contains("is not positive"), "{e}");
        }
    }
}
