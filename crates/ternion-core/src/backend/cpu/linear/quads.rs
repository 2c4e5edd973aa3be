//! The product of a Q6_K matrix interleaved in quads ([`simd::q6_k_interleave`]; an LM head
//! requantized where AVX-512 runs) by Q8_K activation rows: four weight rows at a time,
//! each quad read front to back. Every output equals the scalar reference dot of its row
//! bit for bit, for any thread count.

use super::{pool, simd, SharedMut, ROWS_PER_TASK};
use crate::quant::act;

/// `out[t][j] = post · (row j · token t)` for the `m` rows of `k` in `data` (whole quads,
/// then the rows past the last quad as plain rows) and the Q8_K tokens `(q, d)`, in
/// parallel tasks of `task_rows` rows (a multiple of [`ROWS_PER_TASK`]).
pub(super) fn forward(
    data: &[u8],
    (k, m, task_rows): (usize, usize, usize),
    (q, d): (&[i8], &[f32]),
    post: f32,
    out: &mut [f32],
) {
    const QUAD: usize = simd::QUAD_ROWS;
    const _: () = assert!(ROWS_PER_TASK.is_multiple_of(QUAD));
    let nb = k / act::Q8K_BLOCK;
    let (rows, row_bytes) = (out.len() / m, data.len() / m);
    let level = simd::Level::detect();
    let ptr = SharedMut(out.as_mut_ptr());
    debug_assert!(task_rows.is_multiple_of(ROWS_PER_TASK));
    pool::global().run(m.div_ceil(task_rows), &|blk, _| {
        let ptr = &ptr;
        let end = ((blk + 1) * task_rows).min(m);
        for t in 0..rows {
            let (qt, dt) = (&q[t * k..(t + 1) * k], &d[t * nb..(t + 1) * nb]);
            let put = |j: usize, v: f32| {
                // SAFETY: t·m + j < rows·m = out.len(), and each (j, t) pair belongs to this
                // task alone (row j lies in one block of rows only): no aliasing.
                unsafe { *ptr.0.add(t * m + j) = v * post };
            };
            let mut j = blk * task_rows;
            while j + QUAD <= end {
                let quad = &data[j * row_bytes..(j + QUAD) * row_bytes];
                for (i, v) in simd::q6_k_dot4_q8k(level, quad, qt, dt)
                    .into_iter()
                    .enumerate()
                {
                    put(j + i, v);
                }
                j += QUAD;
            }
            for j in j..end {
                let row = &data[j * row_bytes..(j + 1) * row_bytes];
                put(j, simd::q6_k_dot_q8k(level, row, qt, dt));
            }
        }
    });
}
