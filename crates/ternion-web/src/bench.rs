//! Prompt (prefill) and decode speed of a loaded model, timed as `ternion bench` times the
//! native backends (`crates/ternion-cli/src/bench.rs`), so the browser engine and native
//! wgpu can be compared on the same GPU and file: the same random prompt (seed 7), then
//! on the GPU a warm-up of at least `warmup_ms` (the prompt and 16 greedy tokens, over
//! and over: GPUs idle at low clocks), one timed prefill whose logits come back for the
//! argmax, and the greedy decode with the argmax on the GPU, the ids coming back a few
//! steps at a time; on the CPU a 4-token warm-up, then the same prefill and one decode
//! step per token.

use rand::{Rng, SeedableRng};
use ternion::model::Logits;
use ternion::sample::argmax;
use ternion::{Error, Result};

use crate::engine::{Backend, Engine, Host};

/// The seed of `ternion bench`'s random prompt.
const PROMPT_SEED: u64 = 7;

/// Greedy tokens per warm-up round (after the prompt), as `ternion bench`.
const WARMUP_TOKENS: usize = 16;

/// What [`Engine::bench`] measured.
#[derive(Clone, Debug)]
pub struct Bench {
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Decoded tokens.
    pub n_gen: usize,
    /// Milliseconds of the prefill (up to the first token's id).
    pub prefill_ms: f64,
    /// Milliseconds of the `n_gen` decode steps.
    pub decode_ms: f64,
    /// Milliseconds spent warming up.
    pub warmup_ms: f64,
    /// Warm-up rounds run.
    pub warmup_rounds: usize,
    /// The greedy ids: the prefill's, then one per decode step.
    pub ids: Vec<u32>,
}

impl Bench {
    /// Prompt tokens per second.
    pub fn prefill_tok_s(&self) -> f64 {
        self.n_prompt as f64 * 1e3 / self.prefill_ms.max(1e-6)
    }

    /// Decoded tokens per second.
    pub fn decode_tok_s(&self) -> f64 {
        self.n_gen as f64 * 1e3 / self.decode_ms.max(1e-6)
    }
}

/// `ternion bench`'s prompt: `n` ids drawn uniformly below `n_vocab` from seed 7.
pub fn bench_prompt(n_vocab: usize, n: usize) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(PROMPT_SEED);
    (0..n)
        .map(|_| rng.random_range(0..n_vocab as u32))
        .collect()
}

impl Engine {
    /// Times a prefill of `n_prompt` random tokens and `n_gen` greedy decode steps (see
    /// the module docs). Starts and ends with an empty sequence ([`Engine::reset`]).
    pub async fn bench<H: Host>(
        &mut self,
        host: &H,
        n_prompt: usize,
        n_gen: usize,
        warmup_ms: f64,
    ) -> Result<Bench> {
        let n_ctx = self.backend().n_ctx();
        if n_prompt == 0 || n_prompt + n_gen >= n_ctx {
            return Err(Error::Request(format!(
                "bench: {n_prompt} prompt tokens (at least 1) + {n_gen} decoded must stay \
                 below the context of {n_ctx} (load with a larger nCtx)"
            )));
        }
        if !(warmup_ms >= 0.0 && warmup_ms.is_finite()) {
            return Err(Error::Request(format!(
                "bench: the warm-up must be a finite number of milliseconds ≥ 0, got {warmup_ms}"
            )));
        }
        let prompt = bench_prompt(self.backend().n_vocab(), n_prompt);
        self.reset();
        let timed = match self.backend_mut() {
            Backend::Gpu(g) => {
                let start = host.now_ms();
                let mut rounds = 0;
                while rounds == 0 || host.now_ms() - start < warmup_ms {
                    g.truncate(0);
                    g.forward_async(&prompt, Logits::Last).await?;
                    g.greedy_async(0, n_gen.min(WARMUP_TOKENS), |_| true)
                        .await?;
                    rounds += 1;
                }
                let warm = host.now_ms() - start;
                g.truncate(0);
                let t = host.now_ms();
                let first = argmax(&g.forward_async(&prompt, Logits::Last).await?);
                let prefill_ms = host.now_ms() - t;
                let t = host.now_ms();
                let rest = g.greedy_async(first, n_gen, |_| true).await?;
                let decode_ms = host.now_ms() - t;
                (prefill_ms, decode_ms, warm, rounds, first, rest)
            }
            Backend::Cpu(c) => {
                let start = host.now_ms();
                let head = &prompt[..prompt.len().min(4)];
                c.model.forward_cpu(head, Logits::Last, &mut c.state)?;
                c.state.truncate(0);
                let warm = host.now_ms() - start;
                let t = host.now_ms();
                let first = argmax(c.model.forward_cpu(&prompt, Logits::Last, &mut c.state)?);
                let prefill_ms = host.now_ms() - t;
                let t = host.now_ms();
                let mut rest = Vec::with_capacity(n_gen);
                let mut next = first;
                for _ in 0..n_gen {
                    next = argmax(c.model.forward_cpu(&[next], Logits::Last, &mut c.state)?);
                    rest.push(next);
                }
                let decode_ms = host.now_ms() - t;
                (prefill_ms, decode_ms, warm, 1, first, rest)
            }
        };
        self.reset();
        let (prefill_ms, decode_ms, warmup_ms, warmup_rounds, first, rest) = timed;
        Ok(Bench {
            n_prompt,
            n_gen,
            prefill_ms,
            decode_ms,
            warmup_ms,
            warmup_rounds,
            ids: std::iter::once(first).chain(rest).collect(),
        })
    }
}
