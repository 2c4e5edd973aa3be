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
    let theta_scale = theta_scale(base, n_rot);
    let mut table = [0f32; MAX_ROT];
    let angles_row = &mut table[..n_rot];
    let row_len = x.len() / n_rows.max(1);
    for (r, row) in x.chunks_exact_mut(row_len).enumerate() {
        angles(angles_row, pos0 + r, theta_scale, freqs);
        rotate(row, angles_row, head_dim, mode);
    }
}

/// The RoPE angles of one forward pass's rows (the cosine and sine of every pair's angle
/// at every row's position), computed once for each RoPE base the pass uses and shared by
/// q and k of every layer: a 2B-4T decode token computed the same 64 pairs 60 times
/// (73 µs). Kept in a workspace between passes, so a pass allocates nothing once warm.
#[derive(Default)]
pub struct RopeAngles {
    /// Per RoPE base (its bits): `n_rot` floats a row, row after row: the n_rot/2 pairs'
    /// cosines, then their sines (so that rotating a row vectorizes).
    tables: Vec<(u32, Vec<f32>)>,
    /// Tables of the current pass (the rest are spare allocations).
    valid: usize,
}

impl RopeAngles {
    /// Forgets the tables (a new pass, new positions); keeps their allocations.
    pub fn clear(&mut self) {
        self.valid = 0;
    }

    /// The table of `base` for rows at `positions` (the same positions, `n_rot` and
    /// `freqs` for every call between two [`clear`](Self::clear)s), computed on first use.
    pub fn table(
        &mut self,
        base: f32,
        n_rot: usize,
        freqs: Option<&[f32]>,
        positions: impl Iterator<Item = usize>,
    ) -> &[f32] {
        let key = base.to_bits();
        let found = self.tables[..self.valid].iter().position(|t| t.0 == key);
        let i = found.unwrap_or_else(|| {
            if self.valid == self.tables.len() {
                self.tables.push((key, Vec::new()));
            }
            let (k, cs) = &mut self.tables[self.valid];
            *k = key;
            cs.clear();
            let scale = theta_scale(base, n_rot);
            for pos in positions {
                let start = cs.len();
                cs.resize(start + n_rot, 0.0);
                angles(&mut cs[start..], pos, scale, freqs);
            }
            self.valid += 1;
            self.valid - 1
        });
        &self.tables[i].1
    }
}

/// Rotates each row of `x` (rows of `width` values, whole heads) by its angles in `table`
/// (`n_rot` floats a row, as [`RopeAngles::table`] lays them out).
pub fn rotate_rows(
    x: &mut [f32],
    width: usize,
    table: &[f32],
    head_dim: usize,
    n_rot: usize,
    mode: RopeMode,
) {
    if n_rot == 0 || width == 0 {
        return;
    }
    for (row, angles) in x.chunks_exact_mut(width).zip(table.chunks_exact(n_rot)) {
        rotate(row, angles, head_dim, mode);
    }
}

/// The factor between successive pairs' angles, `base^(-2/n_rot)` in f32.
fn theta_scale(base: f32, n_rot: usize) -> f32 {
    base.powf(-2.0 / n_rot as f32)
}

/// The angles of one row at `pos` into `out` (`n_rot` floats: each pair's cosine, then
/// each pair's sine): θ starts at `pos` and is multiplied by `theta_scale` (an f32
/// product) for each successive pair; `freqs` divide the angles.
fn angles(out: &mut [f32], pos: usize, theta_scale: f32, freqs: Option<&[f32]>) {
    let (cos, sin) = out.split_at_mut(out.len() / 2);
    let mut theta = pos as f32;
    for (i, (c, s)) in cos.iter_mut().zip(sin).enumerate() {
        let t = match freqs {
            Some(f) => theta / f[i],
            None => theta,
        };
        (*c, *s) = (t.cos(), t.sin());
        theta *= theta_scale;
    }
}

/// Rotates every head of one row by its `angles` (cosines, then sines): element-wise
/// products in the same order as one pair at a time, which the compiler vectorizes.
fn rotate(row: &mut [f32], angles: &[f32], head_dim: usize, mode: RopeMode) {
    let (cos, sin) = angles.split_at(angles.len() / 2);
    let turn = |x0: &mut f32, x1: &mut f32, c: f32, s: f32| {
        let (a, b) = (*x0, *x1);
        *x0 = a * c - b * s;
        *x1 = a * s + b * c;
    };
    for head in row.chunks_exact_mut(head_dim) {
        let pairs = &mut head[..angles.len()];
        match mode {
            RopeMode::Neox => {
                let (lo, hi) = pairs.split_at_mut(cos.len());
                for (((x0, x1), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
                    turn(x0, x1, c, s);
                }
            }
            RopeMode::Norm => {
                for ((p, &c), &s) in pairs.chunks_exact_mut(2).zip(cos).zip(sin) {
                    let (x0, x1) = p.split_at_mut(1);
                    turn(&mut x0[0], &mut x1[0], c, s);
                }
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

    /// Rows rotated through a pass's shared table equal [`rope`] of each row at its own
    /// position bit for bit, for both pairings, with and without frequency factors, for
    /// rows of two sequences (positions not consecutive) and two RoPE bases in one pass,
    /// and after a clear the next pass's positions (not the first pass's tables).
    #[test]
    fn shared_angles_equal_rope_row_by_row() {
        let (hd, n_heads) = (16, 3);
        let w = hd * n_heads;
        let first = [7usize, 8, 9, 0, 1, 4096];
        let orig: Vec<f32> = (0..first.len() * w)
            .map(|i| (i as f32 * 0.37).sin() * 4.0)
            .collect();
        let freqs: Vec<f32> = (0..6).map(|i| 1.0 + i as f32 * 0.5).collect();
        for (mode, n_rot, f) in [
            (RopeMode::Neox, 16, None),
            (RopeMode::Norm, 12, Some(&freqs[..])),
            (RopeMode::Neox, 0, None),
        ] {
            let mut angles = RopeAngles::default();
            for pass in 0..2 {
                // The second pass's rows sit at other positions: its tables are new.
                let positions = first.map(|p| p + 3 * pass);
                angles.clear();
                for base in [10000.0f32, 1e6, 10000.0] {
                    let table = angles.table(base, n_rot, f, positions.iter().copied());
                    assert_eq!(table.len(), positions.len() * n_rot);
                    let mut x = orig.clone();
                    rotate_rows(&mut x, w, table, hd, n_rot, mode);
                    for (r, &pos) in positions.iter().enumerate() {
                        let mut want = orig[r * w..(r + 1) * w].to_vec();
                        rope(&mut want, 1, pos, hd, n_rot, base, mode, f);
                        let got = &x[r * w..(r + 1) * w];
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{mode:?} n_rot {n_rot} base {base} row {r} pass {pass}"
                        );
                    }
                }
                assert_eq!(angles.valid, 2, "one table per base");
            }
        }
    }
}
