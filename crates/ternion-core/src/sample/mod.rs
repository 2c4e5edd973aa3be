//! Next-token sampling: penalties, truncation (top-k, top-p, min-p), temperature and a
//! seeded draw, in llama.cpp's default chain order.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::generate::{allows, Mask};
use crate::{Error, Result};

mod logprobs;
pub use logprobs::{logprobs, TokenLogprobs};

/// Sampling settings. Every stage can be switched off by its neutral value.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` selects greedy decoding (argmax after penalties).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` turns the stage off.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p`, in (0, 1];
    /// `1` turns the stage off.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the best one's, in [0, 1];
    /// `0` turns the stage off.
    pub min_p: f32,
    /// Repetition penalty (> 0): positive logits of recent tokens are divided by it,
    /// negative ones multiplied; `1` turns it off.
    pub repeat_penalty: f32,
    /// How many of the most recent history ids the three penalties look at; `0` turns all
    /// penalties off.
    pub repeat_last_n: usize,
    /// OpenAI-style presence penalty: subtracted once from every recent token's logit.
    pub presence_penalty: f32,
    /// OpenAI-style frequency penalty: subtracted once per occurrence of a recent token.
    pub frequency_penalty: f32,
    /// Seed of the random generator. Fixed rather than random by default, so that runs are
    /// reproducible unless the caller asks otherwise.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no
    /// penalties over a 64-token window), with seed 0.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: always the most likely token, with every other stage off.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }

    /// Checks every field; the error names the offending field and its value.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, value: f32, want: &str| {
            Err(Error::Request(format!(
                "sampler: {field} must be {want}, got {value}"
            )))
        };
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", self.temperature, "finite and >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "in [0, 1]");
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return bad("repeat_penalty", self.repeat_penalty, "finite and > 0");
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", self.presence_penalty, "finite");
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", self.frequency_penalty, "finite");
        }
        Ok(())
    }

    /// True when a repetition, presence or frequency penalty changes the logits.
    pub fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// One candidate token: its id and current (penalised, possibly scaled) logit.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Descending by logit, ties broken by ascending id: a total, deterministic order.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A stateful sampler: owns the random generator and scratch buffers, so that after the
/// first call [`Sampler::sample`] does not allocate.
#[derive(Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
    candidates: Vec<Candidate>,
    window: Vec<u32>,
}

impl Sampler {
    /// Validates `cfg` and seeds the generator with `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Result<Sampler> {
        cfg.validate()?;
        Ok(Sampler {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            candidates: Vec::new(),
            window: Vec::new(),
        })
    }

    /// The settings this sampler runs with.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// True when [`Sampler::sample_top`] over the `k` best logits of a row draws exactly as
    /// [`Sampler::sample`] over the whole row: no penalties (they would reorder the
    /// logits), and greedy or a top-k of at most `k`.
    pub fn needs_only_top(&self, k: usize) -> bool {
        !self.cfg.penalties_active()
            && (self.cfg.temperature <= 0.0 || (1..=k).contains(&self.cfg.top_k))
    }

    /// Picks the next token id from the best `(id, logit)` pairs of a logits row, best
    /// first with ties to the lower id (a GPU top-k): the same draw as [`Sampler::sample`]
    /// over the whole row when [`Sampler::needs_only_top`] holds for `top.len()`. Pairs
    /// with id `u32::MAX` (missing candidates) are skipped; with none left the id is 0.
    pub fn sample_top(&mut self, top: &[(u32, f32)]) -> u32 {
        self.candidates.clear();
        self.candidates
            .extend(
                top.iter()
                    .filter(|c| c.0 != u32::MAX)
                    .map(|&(id, logit)| Candidate {
                        id,
                        logit: if logit.is_nan() {
                            f32::NEG_INFINITY
                        } else {
                            logit
                        },
                    }),
            );
        let Some(first) = self.candidates.first() else {
            return 0;
        };
        if self.cfg.temperature <= 0.0 {
            return first.id;
        }
        self.top_k();
        self.top_p();
        self.min_p();
        self.draw()
    }

    /// Picks the next token id from `logits` (one per vocabulary entry). `history` is the
    /// prompt plus the ids generated so far; penalties look at its last `repeat_last_n`
    /// ids. NaN logits are never chosen. Panics if `logits` is empty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "Sampler::sample: empty logits");
        if self.cfg.temperature <= 0.0 && !self.cfg.penalties_active() {
            return argmax(logits);
        }
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(id, &logit)| Candidate {
                id: id as u32,
                logit: if logit.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    logit
                },
            }));
        self.finish_draw(history)
    }

    /// [`Sampler::sample`] among the tokens `mask` allows (see [`allows`]): the others
    /// weigh nothing. With no token allowed the draw is the lowest id. Panics if `logits`
    /// is empty.
    pub fn sample_masked(&mut self, logits: &[f32], history: &[u32], mask: &Mask) -> u32 {
        assert!(!logits.is_empty(), "Sampler::sample_masked: empty logits");
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(id, &logit)| Candidate {
                id: id as u32,
                logit: if logit.is_nan() || !allows(mask, id as u32) {
                    f32::NEG_INFINITY
                } else {
                    logit
                },
            }));
        self.finish_draw(history)
    }

    /// Penalties, truncation and the draw over the candidates of a whole row.
    fn finish_draw(&mut self, history: &[u32]) -> u32 {
        self.apply_penalties(history);
        if self.cfg.temperature <= 0.0 {
            return best(&self.candidates);
        }
        self.top_k();
        self.top_p();
        self.min_p();
        self.draw()
    }

    /// Repetition, presence and frequency penalties over the recent window of `history`.
    /// Relies on `candidates[id].id == id` (no reordering yet).
    fn apply_penalties(&mut self, history: &[u32]) {
        if !self.cfg.penalties_active() {
            return;
        }
        let start = history.len().saturating_sub(self.cfg.repeat_last_n);
        self.window.clear();
        self.window.extend_from_slice(&history[start..]);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            let Some(c) = self.candidates.get_mut(run[0] as usize) else {
                continue;
            };
            if c.logit > 0.0 {
                c.logit /= self.cfg.repeat_penalty;
            } else {
                c.logit *= self.cfg.repeat_penalty;
            }
            c.logit -= run.len() as f32 * self.cfg.frequency_penalty + self.cfg.presence_penalty;
        }
    }

    /// Keeps the `top_k` best candidates, sorted best first. With top-k off, sorts all
    /// candidates only when top-p needs the order.
    fn top_k(&mut self) {
        let k = self.cfg.top_k;
        if k > 0 && k < self.candidates.len() {
            self.candidates.select_nth_unstable_by(k - 1, by_logit_desc);
            self.candidates.truncate(k);
            self.candidates.sort_unstable_by(by_logit_desc);
        } else if k > 0 || self.cfg.top_p < 1.0 {
            self.candidates.sort_unstable_by(by_logit_desc);
        }
    }

    /// Keeps the shortest best-first prefix whose softmax mass reaches `top_p` (at least
    /// one). Expects the candidates sorted best first.
    fn top_p(&mut self) {
        if self.cfg.top_p >= 1.0 {
            return;
        }
        let max = self.candidates[0].logit;
        let total: f64 = self
            .candidates
            .iter()
            .map(|c| f64::from(c.logit - max).exp())
            .sum();
        let target = f64::from(self.cfg.top_p) * total;
        let mut mass = 0.0;
        let mut keep = self.candidates.len();
        for (i, c) in self.candidates.iter().enumerate() {
            mass += f64::from(c.logit - max).exp();
            if mass >= target {
                keep = i + 1;
                break;
            }
        }
        self.candidates.truncate(keep);
    }

    /// Drops candidates with probability below `min_p` times the best one's.
    fn min_p(&mut self) {
        if self.cfg.min_p <= 0.0 {
            return;
        }
        let max = self
            .candidates
            .iter()
            .map(|c| c.logit)
            .fold(f32::NEG_INFINITY, f32::max);
        // The best candidate always passes: ln(min_p) <= 0.
        let threshold = max + self.cfg.min_p.ln();
        self.candidates.retain(|c| c.logit >= threshold);
    }

    /// Applies the temperature, then draws from the softmax of the remaining candidates.
    fn draw(&mut self) -> u32 {
        let max = self
            .candidates
            .iter()
            .map(|c| c.logit)
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            // All -inf (nothing to weigh) or a +inf logit (certain): take the best.
            return best(&self.candidates);
        }
        let inv_t = 1.0 / f64::from(self.cfg.temperature);
        let weight = |c: &Candidate| (f64::from(c.logit - max) * inv_t).exp();
        let total: f64 = self.candidates.iter().map(weight).sum();
        let mut r = self.rng.random::<f64>() * total;
        for c in &self.candidates {
            let w = weight(c);
            if r < w {
                return c.id;
            }
            r -= w;
        }
        // Rounding left a sliver of mass: fall back to the last candidate with weight.
        self.candidates
            .iter()
            .rev()
            .find(|c| weight(c) > 0.0)
            .map_or_else(|| best(&self.candidates), |c| c.id)
    }
}

/// The best candidate: highest logit, lowest id among ties.
fn best(candidates: &[Candidate]) -> u32 {
    candidates
        .iter()
        .min_by(|a, b| by_logit_desc(a, b))
        .map_or(0, |c| c.id)
}

/// Index of the largest logit: ties go to the lowest id and NaN never wins (all NaN gives
/// 0). Panics if `logits` is empty.
pub fn argmax(logits: &[f32]) -> u32 {
    assert!(!logits.is_empty(), "argmax: empty logits");
    // Two passes the compiler vectorizes (2B-4T's 128,256 logits after a decode step:
    // 32–34 µs where the one-pass branchy loop took 74–108): the largest value in
    // independent lanes (comparisons with NaN are false, so NaNs never win; the maximum is
    // exact, so the lanes' order does not matter; −0 and +0 compare equal below), then the
    // first block holding it and the first index in that block.
    let mut lanes = [f32::NEG_INFINITY; ARGMAX_LANES];
    let mut blocks = logits.chunks_exact(ARGMAX_LANES);
    for block in &mut blocks {
        for (m, &v) in lanes.iter_mut().zip(block) {
            *m = if v > *m { v } else { *m };
        }
    }
    let best = blocks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    logits
        .chunks(ARGMAX_LANES)
        .enumerate()
        .find(|(_, b)| b.iter().fold(false, |hit, &v| hit | (v == best)))
        .and_then(|(i, b)| Some(i * ARGMAX_LANES + b.iter().position(|&v| v == best)?))
        .unwrap_or(0) as u32
}

/// Independent lanes of [`argmax`]'s first pass (four AVX-512 registers).
const ARGMAX_LANES: usize = 64;

#[cfg(test)]
mod tests;
