//! Log-probabilities of a drawn token and of the row's most likely tokens: the
//! log-softmax of the logits row the sampler saw (before penalties, temperature and
//! truncation, as OpenAI reports them).

/// One drawn token's log-probability and the row's best alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The drawn token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, best first (ties to the lower
    /// id).
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax at `id` of `logits`, and its `top` best entries. NaN logits count as
/// impossible (-inf).
pub fn logprobs(logits: &[f32], id: u32, top: usize) -> TokenLogprobs {
    let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let max = logits
        .iter()
        .map(|&v| clean(v))
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&v| f64::from(clean(v) - max).exp())
        .sum();
    let log_z = f64::from(max) + sum.ln();
    let lp = |v: f32| (f64::from(clean(v)) - log_z) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &v) in logits.iter().enumerate() {
            let v = clean(v);
            if best.len() == top && best[top - 1].1 >= v {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (i as u32, v));
            best.truncate(top);
        }
    }
    TokenLogprobs {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&v| lp(v)),
        top: best.into_iter().map(|(i, v)| (i, lp(v))).collect(),
    }
}
