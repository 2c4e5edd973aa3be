//! How a prompt is cut into forward passes. A step of one token runs with single-token
//! (decode) numerics and a longer one with batch (prefill) numerics, so a prompt is never
//! cut where a chunk of one token would remain: chunked prompts give the logits of one
//! whole batch.

/// Largest number of prompt tokens evaluated as one batch.
pub const PREFILL_CHUNK: usize = 512;

/// How many of the `left` prompt tokens to run next, at most `max_chunk` (what the backend
/// takes in one step) and at most `budget` (what the caller allows this step). Returns 0
/// when the budget is too small for a chunk that keeps the numerics (the next step gets
/// them); never leaves a single token behind and never runs one alone unless it is the
/// whole prompt. A backend that takes fewer than 3 tokens a step gets plain chunks.
pub fn next_chunk(left: usize, max_chunk: usize, budget: usize) -> usize {
    let n = left.min(max_chunk).min(budget);
    if n == left || max_chunk < 3 {
        return n;
    }
    if n >= 2 && left - n >= 2 {
        n
    } else if n >= 3 {
        n - 1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks of a prompt of `len` tokens with an unbounded budget.
    fn chunks(len: usize, max_chunk: usize) -> Vec<usize> {
        let (mut left, mut out) = (len, Vec::new());
        while left > 0 {
            let n = next_chunk(left, max_chunk, usize::MAX);
            assert!(n > 0, "stalled with {left} left");
            out.push(n);
            left -= n;
        }
        out
    }

    #[test]
    fn a_513_token_prompt_ends_in_two_tokens_not_one() {
        assert_eq!(chunks(513, PREFILL_CHUNK), [511, 2]);
        assert_eq!(chunks(512, PREFILL_CHUNK), [512]);
        assert_eq!(chunks(1025, PREFILL_CHUNK), [512, 511, 2]);
        assert_eq!(chunks(1, PREFILL_CHUNK), [1]);
    }

    #[test]
    fn no_chunk_of_one_token_for_any_length() {
        for max in [3, 4, 7, 256, 512] {
            for len in 2..1200 {
                let c = chunks(len, max);
                assert_eq!(c.iter().sum::<usize>(), len);
                assert!(c.iter().all(|&n| n >= 2 && n <= max), "{len}/{max}: {c:?}");
            }
        }
    }

    #[test]
    fn a_small_budget_waits_rather_than_leaving_one_token() {
        assert_eq!(next_chunk(10, 512, 1), 0);
        assert_eq!(next_chunk(3, 512, 2), 0);
        assert_eq!(next_chunk(10, 512, 9), 8);
        assert_eq!(next_chunk(10, 512, 2), 2);
        assert_eq!(next_chunk(1, 512, 1), 1);
    }

    #[test]
    fn tiny_backends_get_plain_chunks() {
        assert_eq!(chunks(5, 2), [2, 2, 1]);
        assert_eq!(chunks(3, 1), [1, 1, 1]);
    }
}
