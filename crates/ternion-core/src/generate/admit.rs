//! The one admission check of a forward step, shared by the CPU and the GPU backends:
//! tokens present and in the vocabulary, room in the sequence's context, positions within
//! the model's learned ones.

use crate::{Error, Result};

/// What a backend allows a sequence's step.
#[derive(Clone, Copy, Debug)]
pub struct StepLimits {
    /// Vocabulary size (token ids must be below it), when known.
    pub n_vocab: Option<usize>,
    /// Positions the sequence's context holds.
    pub n_ctx: usize,
    /// Learned positions of the model (absolute position embeddings), if bounded.
    pub max_pos: Option<usize>,
}

/// Fails unless `n` more positions fit after the `len` a context of `n_ctx` holds.
pub fn check_room(len: usize, n: usize, n_ctx: usize) -> Result<()> {
    if len + n > n_ctx {
        return Err(Error::ContextFull {
            used: len,
            new: n,
            n_ctx,
        });
    }
    Ok(())
}

/// Checks a step of `tokens` after the `len` positions a sequence holds.
pub fn check_step(len: usize, tokens: &[u32], limits: &StepLimits) -> Result<()> {
    let n = tokens.len();
    if n == 0 {
        return Err(Error::Request("no tokens to evaluate".into()));
    }
    if let Some(v) = limits.n_vocab {
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= v) {
            return Err(Error::Request(format!(
                "token id {id} is outside the vocabulary (size {v})"
            )));
        }
    }
    check_room(len, n, limits.n_ctx)?;
    if let Some(p) = limits.max_pos.filter(|&p| len + n > p) {
        return Err(Error::Request(format!(
            "position {} is past the model's {p} learned positions",
            len + n - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_is_a_request_or_context_error() {
        let l = StepLimits {
            n_vocab: Some(10),
            n_ctx: 8,
            max_pos: Some(6),
        };
        assert!(check_step(0, &[1, 2], &l).is_ok());
        for (len, tokens) in [
            (0, &[][..]),
            (0, &[10][..]),
            (7, &[1, 2][..]),
            (5, &[1, 2][..]),
        ] {
            let e = check_step(len, tokens, &l).unwrap_err();
            let context = len + tokens.len() > 8;
            assert!(
                matches!(
                    (context, &e),
                    (false, Error::Request(_)) | (true, Error::ContextFull { n_ctx: 8, .. })
                ),
                "{len} {tokens:?}: {e}"
            );
        }
        assert!(check_room(7, 1, 8).is_ok());
    }
}
