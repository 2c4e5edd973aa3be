//! NEOX-style rotary position embedding: dimension i pairs with i + n_rot/2.
//!
//! Angles follow ggml exactly: θ starts at the position and is multiplied by
//! `base^(-2/n_rot)` (an f32 product) for each successive pair.

/// Most rotated dimensions per head supported (the angle table lives on the stack).
pub const MAX_ROT: usize = 512;

/// Rotates every head of every row in place. `x` holds `n_rows` rows of
/// `n_heads · head_dim` values at positions `pos0, pos0 + 1, …`; only the first `n_rot`
/// dimensions of a head rotate (`n_rot ≤ MAX_ROT`).
pub fn rope_neox(
    x: &mut [f32],
    n_rows: usize,
    pos0: usize,
    head_dim: usize,
    n_rot: usize,
    base: f32,
) {
    let half = n_rot / 2;
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut table = [(0f32, 0f32); MAX_ROT / 2];
    let cos_sin = &mut table[..half];
    let row_len = x.len() / n_rows.max(1);
    for (r, row) in x.chunks_exact_mut(row_len).enumerate() {
        let pos = pos0 + r;
        let mut theta = pos as f32;
        for cs in cos_sin.iter_mut() {
            *cs = (theta.cos(), theta.sin());
            theta *= theta_scale;
        }
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cos_sin.iter().enumerate() {
                let (x0, x1) = (head[i], head[i + half]);
                head[i] = x0 * c - x1 * s;
                head[i + half] = x0 * s + x1 * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let orig: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut x = orig.clone();
        rope_neox(&mut x, 1, 0, 8, 8, 10000.0);
        assert_eq!(x, orig);
        let mut y = orig.clone();
        rope_neox(&mut y, 1, 5, 8, 8, 10000.0);
        for h in 0..2 {
            for i in 0..4 {
                let a = orig[h * 8 + i].hypot(orig[h * 8 + i + 4]);
                let b = y[h * 8 + i].hypot(y[h * 8 + i + 4]);
                assert!((a - b).abs() < 1e-5);
            }
        }
        // First pair rotates by exactly `pos` radians.
        let (c, s) = (5f32.cos(), 5f32.sin());
        assert!((y[0] - (orig[0] * c - orig[4] * s)).abs() < 1e-6);
    }
}
