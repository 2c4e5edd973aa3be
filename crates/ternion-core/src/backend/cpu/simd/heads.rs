//! Attention kernels for several query heads that read the same F16 keys and values
//! (grouped-query attention): each key and value row is converted once for all of them,
//! and every result equals the one-query kernel's ([`f16_scores`], [`f16_weighted_sum`])
//! bit for bit.

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::avx512_attn;
use super::{f16_scores, f16_weighted_sum, Level};

/// The most query heads one call takes.
pub const MAX_HEADS: usize = 4;

/// [`f16_scores`] of each query row of `q` (1 to [`MAX_HEADS`] rows of `hd`) against the
/// same `n` key rows `keys[i·stride..][..hd]`: query g's scores go to
/// `out[g·out_stride..][..n]`.
///
/// # Panics
/// If `q` is not 1 to [`MAX_HEADS`] rows of `hd`, `n > out_stride`, or `keys` / `out` are
/// too short.
pub fn f16_scores_heads(
    level: Level,
    (q, hd): (&[f32], usize),
    (keys, stride, n): (&[f16], usize, usize),
    out: &mut [f32],
    out_stride: usize,
) {
    let g = heads(q.len(), hd, "f16_scores_heads: queries");
    check_rows(out.len(), (g, out_stride, n), "f16_scores_heads: scores");
    check_rows(keys.len(), (n, stride, hd), "f16_scores_heads: keys");
    if n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && hd.is_multiple_of(32) {
        let (q, rows, o) = (q.as_ptr(), (keys.as_ptr(), stride, n), out.as_mut_ptr());
        // SAFETY: the level proves AVX-512 F; `q` holds g·hd floats, every key row lies
        // inside `keys` and every written score inside `out` (asserted).
        unsafe {
            match g {
                4 => avx512_attn::f16_scores_heads::<4>(q, hd, rows, o, out_stride),
                3 => avx512_attn::f16_scores_heads::<3>(q, hd, rows, o, out_stride),
                2 => avx512_attn::f16_scores_heads::<2>(q, hd, rows, o, out_stride),
                _ => avx512_attn::f16_scores_heads::<1>(q, hd, rows, o, out_stride),
            }
        }
        return;
    }
    for (qg, og) in q.chunks_exact(hd).zip(out.chunks_mut(out_stride)) {
        f16_scores(level, qg, keys, stride, &mut og[..n]);
    }
}

/// [`f16_weighted_sum`] for each row `out_g` of `out` (1 to [`MAX_HEADS`] rows of `hd`)
/// over the same `n` value rows `values[i·stride..][..hd]`, with weights
/// `w[g·w_stride..][..n]`.
///
/// # Panics
/// If `out` is not 1 to [`MAX_HEADS`] rows of `hd`, `n > w_stride`, or `w` / `values` are
/// too short.
pub fn f16_weighted_sum_heads(
    level: Level,
    (w, w_stride): (&[f32], usize),
    (values, stride, n): (&[f16], usize, usize),
    out: &mut [f32],
    hd: usize,
) {
    let g = heads(out.len(), hd, "f16_weighted_sum_heads: outputs");
    check_rows(w.len(), (g, w_stride, n), "f16_weighted_sum_heads: weights");
    check_rows(
        values.len(),
        (n, stride, hd),
        "f16_weighted_sum_heads: values",
    );
    if n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx512 && hd.is_multiple_of(16) {
        let (w, rows, o) = (
            (w.as_ptr(), w_stride),
            (values.as_ptr(), stride, n),
            out.as_mut_ptr(),
        );
        // SAFETY: the level proves AVX-512 F; every read weight lies inside `w`, every
        // value row inside `values`, and `out` holds g·hd floats (asserted).
        unsafe {
            match g {
                4 => avx512_attn::f16_weighted_sum_heads::<4>(w, rows, o, hd),
                3 => avx512_attn::f16_weighted_sum_heads::<3>(w, rows, o, hd),
                2 => avx512_attn::f16_weighted_sum_heads::<2>(w, rows, o, hd),
                _ => avx512_attn::f16_weighted_sum_heads::<1>(w, rows, o, hd),
            }
        }
        return;
    }
    for (g, og) in out.chunks_exact_mut(hd).enumerate() {
        f16_weighted_sum(level, &w[g * w_stride..][..n], values, stride, og);
    }
}

/// The rows of `hd` values in `len` values, which must be 1 to [`MAX_HEADS`] whole rows.
fn heads(len: usize, hd: usize, what: &str) -> usize {
    let g = len / hd.max(1);
    assert!(
        hd > 0 && len == g * hd && (1..=MAX_HEADS).contains(&g),
        "{what}: not 1 to {MAX_HEADS} rows of {hd}"
    );
    g
}

/// Asserts that `rows` rows of `width` values, `stride` apart (`width ≤ stride` when
/// there are several), lie inside `len` values.
fn check_rows(len: usize, (rows, stride, width): (usize, usize, usize), what: &str) {
    let fits = match rows {
        0 => true,
        1 => width <= len,
        _ => width <= stride && (rows - 1) * stride + width <= len,
    };
    assert!(fits, "{what}: too short or overlapping");
}
