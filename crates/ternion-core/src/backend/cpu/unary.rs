//! Element-wise kernels: GELU, and row-broadcast adds (bias, position embeddings).

use half::f16;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044_715;

/// GELU, tanh approximation, in f32: `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))`.
pub fn gelu_tanh_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// GELU as ggml's CPU kernel computes it: 0 at or below −10, `x` at or above 10, and in
/// between the F16-rounded value of [`gelu_tanh_f32`] at the F16-rounded input (ggml reads
/// it from a 65536-entry table built that way; computing the entry is the same number).
pub fn gelu_ggml(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let h = f16::from_f32(x).to_bits();
        f16::from_bits(gelu_table()[usize::from(h)]).to_f32()
    }
}

/// GELU of every F16 value, as F16 bits (built once, like ggml's table).
fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16::from_f32(gelu_tanh_f32(f16::from_bits(b).to_f32())).to_bits())
            .collect()
    })
}

/// `x[t] += b` for every row of `x` (`b.len()` values each).
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(v, &c)| *v += c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_erf_free_reference() {
        for i in -300..300 {
            let x = i as f32 * 0.05;
            let xd = f64::from(x);
            let want = 0.5
                * xd
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            assert!((f64::from(gelu_tanh_f32(x)) - want).abs() < 1e-6, "x {x}");
            // The table form: F16 rounding of input and output only.
            assert!(
                (f64::from(gelu_ggml(x)) - want).abs() < 1e-2 * (1.0 + xd.abs()),
                "x {x}"
            );
        }
        assert_eq!(gelu_ggml(-12.0), 0.0);
        assert_eq!(gelu_ggml(11.5), 11.5);
        assert_eq!(gelu_ggml(0.0), 0.0);
    }

    #[test]
    fn add_rows_broadcasts() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        add_rows(&mut x, &[10.0, 20.0, 30.0]);
        assert_eq!(x, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    }
}
