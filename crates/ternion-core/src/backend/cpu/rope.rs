//! Rotary position embedding, in ggml's two pairings: NEOX (dimension i pairs with
//! i + n_rot/2) and NORM (dimension 2i pairs with 2i + 1).
//!
//! Angles follow ggml exactly: θ starts at the position and is multiplied by
//! `base^(-2/n_rot)` (an f32 product) for each successive pair; optional frequency factors
//! divide the angle of pair i (Llama-3 `rope_freqs`).

pub use crate::model::graph::RopeMode;

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
    rope(x, n_rows, pos0, head_dim, n_rot, base, RopeMode::Neox, None);
}

/// Rotates every head of every row in place, with the given pairing. `freqs`, when given,
/// holds n_rot/2 divisors of the pair angles. Otherwise as [`rope_neox`].
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &mut [f32],
    n_rows: usize,
    pos0: usize,
    head_dim: usize,
    n_rot: usize,
    base: f32,
    mode: RopeMode,
    freqs: Option<&[f32]>,
) {
    let half = n_rot / 2;
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut table = [(0f32, 0f32); MAX_ROT / 2];
    let cos_sin = &mut table[..half];
    let row_len = x.len() / n_rows.max(1);
    for (r, row) in x.chunks_exact_mut(row_len).enumerate() {
        let pos = pos0 + r;
        let mut theta = pos as f32;
        for (i, cs) in cos_sin.iter_mut().enumerate() {
            let t = match freqs {
                Some(f) => theta / f[i],
                None => theta,
            };
            *cs = (t.cos(), t.sin());
            theta *= theta_scale;
        }
        let (stride, step) = match mode {
            RopeMode::Neox => (half, 1),
            RopeMode::Norm => (1, 2),
        };
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cos_sin.iter().enumerate() {
                let j = i * step;
                let (x0, x1) = (head[j], head[j + stride]);
                head[j] = x0 * c - x1 * s;
                head[j + stride] = x0 * s + x1 * c;
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

    /// NORM pairing against a direct f64 evaluation of θ_i = pos·base^(−2i/n_rot) / f_i,
    /// rotating (2i, 2i+1); dimensions past n_rot stay put.
    #[test]
    fn norm_pairs_adjacent_dims_with_freq_factors() {
        let (hd, n_rot, base, pos0) = (8, 6, 10000.0f32, 3);
        let orig: Vec<f32> = (0..2 * 2 * hd).map(|i| (i as f32 * 0.71).cos()).collect();
        let freqs = [1.0f32, 2.0, 8.0];
        for f in [None, Some(&freqs[..])] {
            let mut x = orig.clone();
            rope(&mut x, 2, pos0, hd, n_rot, base, RopeMode::Norm, f);
            for r in 0..2 {
                let pos = (pos0 + r) as f64;
                for h in 0..2 {
                    let o = &orig[(r * 2 + h) * hd..][..hd];
                    let y = &x[(r * 2 + h) * hd..][..hd];
                    for i in 0..n_rot / 2 {
                        let fi = f.map_or(1.0, |f| f64::from(f[i]));
                        let th = pos * f64::from(base).powf(-2.0 * i as f64 / n_rot as f64) / fi;
                        let (x0, x1) = (f64::from(o[2 * i]), f64::from(o[2 * i + 1]));
                        let want0 = x0 * th.cos() - x1 * th.sin();
                        let want1 = x0 * th.sin() + x1 * th.cos();
                        assert!((f64::from(y[2 * i]) - want0).abs() < 1e-5, "r{r} h{h} i{i}");
                        assert!((f64::from(y[2 * i + 1]) - want1).abs() < 1e-5);
                    }
                    assert_eq!(&y[n_rot..], &o[n_rot..]);
                }
            }
        }
    }
}
