//! Matrix multiplication of a stored weight (still quantized) by a batch of activation rows.
//!
//! Each weight format multiplies against the activation format its reference engine uses:
//! the variant of its registry reference dot ([`quant::format`], [`RefDot`]) names it, and
//! the match in [`Linear::forward`] has one arm per activation format (no wildcard). Formats
//! with a SIMD kernel use it; the others run their scalar reference dot. Layouts and
//! pairings: docs/FORMATS.md.
//!
//! Rows of the output are computed in parallel blocks; every output element depends only on
//! its weight row and token row, so results are identical for any thread count.

use std::sync::{Arc, OnceLock};

use super::huge::HugeBuf;
use super::pool::{self, SharedMut};
use super::simd;
use super::ternary::{PackInput, Product, TernaryPack};
use super::QuantInput;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{self, act, GgmlType, RefDot};
use crate::{Error, FormatError, Result};

mod quads;

/// Weight rows handled by one parallel task at least (see [`rows_per_task`]).
const ROWS_PER_TASK: usize = 16;

/// Weight bytes one parallel task of a row-parallel product reads at least, where the
/// product has rows enough ([`rows_per_task`]).
const TASK_BYTES: usize = 256 << 10;

/// Tasks each thread gets at least, so that the threads' shares stay even.
const TASKS_PER_THREAD: usize = 8;

/// Rows of one parallel task of a product of `m` rows of `row_bytes` on `threads`: enough
/// for [`TASK_BYTES`] of weights (64 rows of a 2B-4T F16 head, 128 of its Q6_K one) but
/// no more than leave every thread [`TASKS_PER_THREAD`] tasks, a whole number of
/// [`ROWS_PER_TASK`] and at least one. Against tasks of 16 rows, a 2B-4T decode step read
/// 0.0–0.7 points more of the probe with the threads on one L3 and 0.8–3.3 on separate
/// L3s, F16 and Q6_K heads, alternated step by step (BENCHMARKS.md, session 36).
fn rows_per_task(m: usize, row_bytes: usize, threads: usize) -> usize {
    let most = m / (TASKS_PER_THREAD * threads.max(1));
    TASK_BYTES
        .div_ceil(row_bytes.max(1))
        .min(most)
        .max(1)
        .next_multiple_of(ROWS_PER_TASK)
}

/// Where a [`Linear`]'s rows are read from.
enum Rows {
    /// The file (mapped, or in memory).
    File,
    /// The file's rows copied byte for byte onto huge pages ([`Linear::resident`]).
    Copy(HugeBuf<u8>),
    /// The rows requantized to the matrix's `ty` ([`Linear::requantized`]).
    Requantized(HugeBuf<u8>),
}

/// A weight matrix `[out_features × in_features]` left in its file format (or, on request,
/// requantized once at load, e.g. an F16 LM head to Q8_0).
pub struct Linear {
    file: Arc<GgufFile>,
    info: TensorInfo,
    /// Storage format of the rows used (the file's, unless requantized).
    ty: GgmlType,
    /// Where the rows used are read from.
    rows: Rows,
    in_features: usize,
    out_features: usize,
    row_bytes: usize,
    /// I2_S per-tensor scale (1 for other formats).
    tensor_scale: f32,
    /// Extra scale multiplied into the output (1bitLLM `.scale` tensors).
    post_scale: f32,
    /// Ternary weights repacked for the AVX-512 kernels (used instead of the rows), built
    /// by the first CPU product (sessions on other backends never pay for it).
    pack: OnceLock<Option<TernaryPack>>,
    /// The requantized rows are Q6_K interleaved in quads ([`simd::q6_k_interleave`]; a head
    /// requantized where AVX-512 runs).
    quads: bool,
}

impl Linear {
    /// The named 2-D tensor of `file` as a linear layer; errors if absent or of a format
    /// without a matmul kernel.
    pub fn load(file: &Arc<GgufFile>, name: &str) -> Result<Linear> {
        let info = file
            .tensor(name)
            .ok_or_else(|| Error::Model(format!("tensor '{name}' is missing")))?
            .clone();
        if info.shape.len() != 2 {
            return Err(Error::Model(format!(
                "tensor '{name}': expected 2 dimensions, found {:?}",
                info.shape
            )));
        }
        if quant::format(info.ty).is_none() {
            return Err(FormatError::UnsupportedType {
                tensor: name.into(),
                type_id: info.ty.id(),
                type_name: format!(
                    "{} (no matmul kernel for it yet; this build's formats: {})",
                    info.ty,
                    quant::supported()
                        .map(|f| f.ty.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
            .into());
        }
        let (k, m) = (info.shape[0] as usize, info.shape[1] as usize);
        let row_bytes = info.ty.row_bytes(k as u64).expect("checked by the reader") as usize;
        let tensor_scale = match info.ty {
            GgmlType::I2_S => quant::i2s::tensor_scale(file.tensor_data(&info), k * m),
            _ => 1.0,
        };
        Ok(Linear {
            file: file.clone(),
            ty: info.ty,
            rows: Rows::File,
            info,
            in_features: k,
            out_features: m,
            row_bytes,
            tensor_scale,
            post_scale: 1.0,
            pack: OnceLock::new(),
            quads: false,
        })
    }

    /// The bytes of these weights requantized to `ty` ([`Linear::requantized`]), or why
    /// they cannot be (an output scale folded in, repacked rows, rows not of whole blocks).
    pub fn requantizable(&self, ty: GgmlType) -> Result<u64> {
        let k = self.in_features;
        if self.tensor_scale != 1.0 || self.quads {
            return Err(Error::Model(format!(
                "tensor '{}': cannot requantize {} rows of {k} to {ty}",
                self.info.name, self.ty
            )));
        }
        let row_bytes = requantized_row_bytes(&self.info.name, k, ty)?;
        Ok((row_bytes * self.out_features) as u64)
    }

    /// The same weights requantized to Q8_0 or Q6_K ([`requantize_rows`]), held in memory;
    /// used for the opt-in quantized LM heads.
    pub fn requantized(&self, ty: GgmlType) -> Result<Linear> {
        let (k, m) = (self.in_features, self.out_features);
        let row_bytes = (self.requantizable(ty)? / m as u64) as usize;
        let mut out = HugeBuf::filled(m * row_bytes, 0u8);
        requantize_rows((self.ty, &self.info.name), self.data(), k, ty, &mut out)?;
        let quads = ty == GgmlType::Q6_K && simd::Level::detect() == simd::Level::Avx512;
        if quads {
            // Whole quads: chunks of 64 rows.
            pool::global().for_each_chunk_mut(&mut out, row_bytes * 64, |_, dst, _| {
                simd::q6_k_interleave(dst, row_bytes);
            });
        }
        if matches!(self.rows, Rows::File) {
            // The mapped rows were all read once; the few an embedding lookup reads again
            // come back from the file.
            self.file.release(&self.info);
        }
        Ok(Linear {
            file: self.file.clone(),
            info: self.info.clone(),
            ty,
            rows: Rows::Requantized(out),
            in_features: k,
            out_features: m,
            row_bytes,
            tensor_scale: 1.0,
            post_scale: self.post_scale,
            pack: OnceLock::from(None),
            quads,
        })
    }

    /// The stored rows copied into memory on huge pages ([`HugeBuf`]), the file's pages
    /// released: for a matrix streamed as stored (not repacked, not requantized) every
    /// product, such as an exact LM head. None for the others. Same rows, same products.
    pub fn resident(&self) -> Option<Linear> {
        if !matches!(self.rows, Rows::File) || self.pack().is_some() {
            return None;
        }
        let data = self.data();
        let mut copy = HugeBuf::filled(data.len(), 0u8);
        // 16 MiB at a time, each part's mapped pages released once copied: the file's
        // pages and the copy are never both resident whole.
        const PART: usize = 16 << 20;
        for (i, (dst, src)) in copy.chunks_mut(PART).zip(data.chunks(PART)).enumerate() {
            dst.copy_from_slice(src);
            self.file.release_part(&self.info, i * PART..(i + 1) * PART);
        }
        Some(Linear {
            file: self.file.clone(),
            info: self.info.clone(),
            ty: self.ty,
            rows: Rows::Copy(copy),
            in_features: self.in_features,
            out_features: self.out_features,
            row_bytes: self.row_bytes,
            tensor_scale: self.tensor_scale,
            post_scale: self.post_scale,
            pack: OnceLock::from(None),
            quads: false,
        })
    }

    /// Row `r` of the matrix as stored in the file, as f32 (embedding lookups): read from
    /// the resident copy where this is one (whose file pages were released: reading them
    /// would fault a page in again), else from the file.
    pub fn dequantize_row(&self, r: usize, dst: &mut [f32]) -> Result<()> {
        let data = match &self.rows {
            Rows::Copy(copy) => copy,
            Rows::File | Rows::Requantized(_) => self.file.tensor_data(&self.info),
        };
        Ok(quant::dequantize_row(
            self.info.ty,
            &self.info.name,
            data,
            self.in_features,
            r,
            dst,
        )?)
    }

    /// The bytes of the rows used.
    fn data(&self) -> &[u8] {
        match &self.rows {
            Rows::Copy(v) | Rows::Requantized(v) => v,
            Rows::File => self.file.tensor_data(&self.info),
        }
    }

    /// Sets the scale multiplied into every output (1bitLLM's per-projection `.scale`).
    pub fn with_post_scale(mut self, s: f32) -> Linear {
        self.post_scale = s;
        self
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Bytes of weights read by one product.
    pub fn weight_bytes(&self) -> u64 {
        match self.pack.get() {
            Some(Some(p)) => p.bytes(),
            _ => self.data().len() as u64,
        }
    }

    /// The repacked weights (ternary, Q8_0, Q4_0), built on first use where the AVX-512
    /// kernels run (the 2-bit formats also where AVX2 does: [`simd::Tiles`]). The
    /// copy replaces the mapped rows, released part by part as packed: one copy stays
    /// resident.
    fn pack(&self) -> Option<&TernaryPack> {
        self.pack
            .get_or_init(|| {
                let data = self.file.tensor_data(&self.info);
                let (k, m) = (self.in_features, self.out_features);
                let release = |part| self.file.release_part(&self.info, part);
                TernaryPack::new(simd::Tiles::get()?, self.ty, data, (k, m), &release)
            })
            .as_ref()
    }

    /// The repacked weights, the activation form they multiply and the scale multiplied
    /// into their outputs, where they are repacked.
    fn packed(&self) -> Option<(&TernaryPack, PackForm, f32)> {
        let p = self.pack()?;
        match quant::format(self.ty)?.dot {
            RefDot::PerToken(_) => Some((
                p,
                PackForm::PerToken(p.token_tile()),
                self.tensor_scale * self.post_scale,
            )),
            RefDot::Q8K(_) => Some((p, PackForm::Q8K(p.token_tile()), self.post_scale)),
            RefDot::Q8_0(_) => Some((p, PackForm::Q8_0(p.token_tile()), self.post_scale)),
            _ => None,
        }
    }

    /// The products of several matrices with the same input rows `x` (the Q, K and V
    /// projections; gate and up), as one parallel op when all are repacked ternary weights
    /// of one activation form and width (one synchronisation point instead of N), else one
    /// after the other. Each output equals its own [`Linear::forward`] bit for bit.
    pub fn forward_fused<const N: usize>(
        x: &[f32],
        qi: &mut QuantInput,
        products: [(&Linear, &mut [f32]); N],
    ) {
        let Some((l0, _)) = products.first() else {
            return;
        };
        let k = l0.in_features;
        let form = l0.packed().map(|(_, f, _)| f);
        let fused = products
            .iter()
            .all(|(l, _)| l.in_features == k && l.packed().map(|(_, f, _)| f) == form);
        match form {
            Some(form) if fused => {
                let input = pack_input(form, x, k, qi);
                let products = products.map(|(l, out)| {
                    let (pack, _, post) = l.packed().expect("checked above");
                    Product { pack, post, out }
                });
                TernaryPack::forward_fused(input, products);
            }
            _ => products
                .into_iter()
                .for_each(|(l, out)| l.forward(x, qi, out)),
        }
    }

    fn row<'a>(&self, data: &'a [u8], j: usize) -> &'a [u8] {
        let start = j * self.row_bytes;
        &data[start..start + self.row_bytes]
    }

    /// `out[t][j] = Σ_i W[j][i] · x[t][i]` for every input row `t` of `x`. `qi` caches the
    /// quantized forms of `x`; it must have been reset for this `x`.
    pub fn forward(&self, x: &[f32], qi: &mut QuantInput, out: &mut [f32]) {
        let (k, m) = (self.in_features, self.out_features);
        let rows = x.len() / k;
        debug_assert_eq!(out.len(), rows * m);
        let data = self.data();
        let post = self.tensor_scale * self.post_scale;
        if let Some((p, form, post)) = self.packed() {
            p.forward(pack_input(form, x, k, qi), post, out);
            return;
        }
        let task_rows = rows_per_task(m, self.row_bytes, pool::global().n_threads());
        if self.quads {
            qi.ensure_q8k(x, k);
            quads::forward(
                data,
                (k, m, task_rows),
                (&qi.q8k, &qi.q8k_d),
                self.post_scale,
                out,
            );
            return;
        }
        let level = simd::Level::detect();
        let fmt = quant::format(self.ty).expect("format checked in Linear::load");
        let post_scale = self.post_scale;
        match fmt.dot {
            RefDot::PerToken(_) => {
                qi.ensure_per_token(x, k);
                let (q, s, sums) = (&qi.q, &qi.token_scale, &qi.token_sum);
                let qrow = |t: usize| &q[t * k..(t + 1) * k];
                par_rows(out, (m, task_rows), |j, t0, n| {
                    let w = self.row(data, j);
                    let d = if n == 4 {
                        let ts: [usize; 4] = std::array::from_fn(|i| t0 + i);
                        simd::i2s_dot4(level, w, ts.map(qrow), ts.map(|t| sums[t]))
                    } else {
                        std::array::from_fn(|i| {
                            if i < n {
                                simd::i2s_dot(level, w, qrow(t0 + i), sums[t0 + i])
                            } else {
                                0
                            }
                        })
                    };
                    std::array::from_fn(|i| (d[i] as f32 / s[(t0 + i).min(rows - 1)]) * post)
                });
            }
            RefDot::Q8K(reference) => {
                qi.ensure_q8k(x, k);
                let (q, d, bs) = (&qi.q8k, &qi.q8k_d, &qi.q8k_bsum);
                let nb = k / act::Q8K_BLOCK;
                let fast = simd_q8k(self.ty);
                par_rows_each(out, (m, task_rows), |j, t| {
                    let (qt, dt) = (&q[t * k..(t + 1) * k], &d[t * nb..(t + 1) * nb]);
                    let w = self.row(data, j);
                    let y = match fast {
                        Some(f) => f(level, w, qt, dt, &bs[t * nb..(t + 1) * nb]),
                        None => reference(w, qt, dt),
                    };
                    y * post_scale
                });
            }
            RefDot::Q8_0(_) if matches!(self.ty, GgmlType::Q1_0 | GgmlType::Q2_0) => {
                let xr = qi.ensure_q8_0_rows(x, k);
                let nb = k / act::Q8_0_BLOCK;
                let token = |t: usize| simd::Q80Rows {
                    q: &xr.q[t * k..(t + 1) * k],
                    d: &xr.d[t * nb..(t + 1) * nb],
                    sum: &xr.sum[t * nb..(t + 1) * nb],
                };
                let (dot1, dot4): (BitsDots<1>, BitsDots<4>) = match self.ty {
                    GgmlType::Q1_0 => (simd::q1_0_dots, simd::q1_0_dots),
                    _ => (simd::q2_0_dots, simd::q2_0_dots),
                };
                par_rows(out, (m, task_rows), |j, t0, n| {
                    let w = self.row(data, j);
                    let y = if n == 4 {
                        dot4(level, w, std::array::from_fn(|i| token(t0 + i)))
                    } else {
                        std::array::from_fn(|i| {
                            if i < n {
                                dot1(level, w, [token(t0 + i)])[0]
                            } else {
                                0.0
                            }
                        })
                    };
                    y.map(|v| v * post_scale)
                });
            }
            RefDot::Q8_0(reference) => {
                qi.ensure_q8_0(x, k);
                let (q, d) = (&qi.q80, &qi.q80_d);
                let nb = k / act::Q8_0_BLOCK;
                let qt = |t: usize| &q[t * k..(t + 1) * k];
                let dt = |t: usize| &d[t * nb..(t + 1) * nb];
                let four = self.ty == GgmlType::Q8_0;
                let fast = simd_q8_0(self.ty);
                par_rows(out, (m, task_rows), |j, t0, n| {
                    let w = self.row(data, j);
                    let y = if four && n == 4 {
                        let ts: [usize; 4] = std::array::from_fn(|i| t0 + i);
                        simd::q8_0_dot4(level, w, ts.map(qt), ts.map(dt))
                    } else {
                        std::array::from_fn(|i| match (i < n, fast) {
                            (false, _) => 0.0,
                            (true, Some(f)) => f(level, w, qt(t0 + i), dt(t0 + i)),
                            (true, None) => reference(w, qt(t0 + i), dt(t0 + i)),
                        })
                    };
                    y.map(|v| v * post_scale)
                });
            }
            RefDot::Q8_1(reference) => {
                qi.ensure_q8_1(x, k);
                let (q, d, s) = (&qi.q81, &qi.q81_d, &qi.q81_s);
                let nb = k / act::Q8_0_BLOCK;
                let fast = simd_q8_1(self.ty);
                par_rows_each(out, (m, task_rows), |j, t| {
                    let (w, qt) = (self.row(data, j), &q[t * k..(t + 1) * k]);
                    let bt = t * nb..(t + 1) * nb;
                    let (dt, st) = (&d[bt.clone()], &s[bt]);
                    let y = match fast {
                        Some(f) => f(level, w, qt, dt, st),
                        None => reference(w, qt, dt, st),
                    };
                    y * post_scale
                });
            }
            RefDot::BF16(_) => {
                qi.ensure_bf16(x);
                let xs = &qi.xbf;
                par_rows_each(out, (m, task_rows), |j, t| {
                    simd::bf16_dot(level, self.row(data, j), &xs[t * k..(t + 1) * k]) * post_scale
                });
            }
            RefDot::F16(_) => {
                let xs: &[f32] = if qi.round_f16.iter().any(|&r| r) {
                    qi.ensure_f16(x, k);
                    &qi.x16
                } else {
                    x
                };
                let xt = |t: usize| &xs[t * k..(t + 1) * k];
                par_rows(out, (m, task_rows), |j, t0, n| {
                    let w = self.row(data, j);
                    let y = if n == 4 {
                        simd::f16_dot4(level, w, std::array::from_fn(|i| xt(t0 + i)))
                    } else {
                        std::array::from_fn(|i| {
                            if i < n {
                                simd::f16_dot(level, w, xt(t0 + i))
                            } else {
                                0.0
                            }
                        })
                    };
                    y.map(|v| v * post_scale)
                });
            }
            RefDot::F32(_) => par_rows_each(out, (m, task_rows), |j, t| {
                simd::f32_dot(level, self.row(data, j), &x[t * k..(t + 1) * k]) * post_scale
            }),
        }
    }
}

/// The activation form a repacked matrix multiplies, with its token tile.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PackForm {
    PerToken(usize),
    Q8K(usize),
    Q8_0(usize),
}

/// `x` (rows of `k`) quantized into `qi` in `form`.
fn pack_input<'q>(form: PackForm, x: &[f32], k: usize, qi: &'q mut QuantInput) -> PackInput<'q> {
    match form {
        PackForm::PerToken(tile) => {
            let (q, scale, sum) = qi.per_token_tiles(x, k, tile);
            PackInput::PerToken { q, scale, sum }
        }
        PackForm::Q8K(tile) => PackInput::Q8K(qi.q8k_tiles(x, k, tile)),
        PackForm::Q8_0(tile) => PackInput::Q8_0(qi.q8_0_tiles(x, k, tile)),
    }
}

/// A SIMD dot against Q8_K activations: `(level, row, q, d, block sums)`.
type Q8kKernel = fn(simd::Level, &[u8], &[i8], &[f32], &[i32]) -> f32;
/// A Q1_0 / Q2_0 dot against T token rows of Q8_0 activations.
type BitsDots<const T: usize> = fn(simd::Level, &[u8], [simd::Q80Rows<'_>; T]) -> [f32; T];
/// A SIMD dot against Q8_0 activations: `(level, row, q, d)`.
type Q8_0Kernel = fn(simd::Level, &[u8], &[i8], &[f32]) -> f32;
/// A SIMD dot against Q8_1 activations: `(level, row, q, d, s)`.
type Q8_1Kernel = fn(simd::Level, &[u8], &[i8], &[f32], &[f32]) -> f32;

/// The SIMD kernel of a Q8_K-paired format, where one exists; the others run their
/// registry reference dot (same integer sums, correct, just slower).
pub(super) fn simd_q8k(ty: GgmlType) -> Option<Q8kKernel> {
    match ty {
        GgmlType::TQ2_0 => Some(simd::tq2_dot_q8k),
        GgmlType::TQ1_0 => Some(simd::tq1_dot_q8k),
        GgmlType::Q4_K => Some(|l, w, q, d, _| simd::q4_k_dot_q8k(l, w, q, d)),
        GgmlType::Q6_K => Some(|l, w, q, d, _| simd::q6_k_dot_q8k(l, w, q, d)),
        GgmlType::Q2_K => Some(|l, w, q, d, _| simd::q2_k_dot_q8k(l, w, q, d)),
        GgmlType::Q3_K => Some(|l, w, q, d, _| simd::q3_k_dot_q8k(l, w, q, d)),
        GgmlType::Q5_K => Some(|l, w, q, d, _| simd::q5_k_dot_q8k(l, w, q, d)),
        GgmlType::IQ4_XS => Some(|l, w, q, d, _| simd::iq4_xs_dot_q8k(l, w, q, d)),
        _ => None,
    }
}

/// The SIMD kernel of a Q8_0-paired format, where one exists (else its reference dot).
pub(super) fn simd_q8_0(ty: GgmlType) -> Option<Q8_0Kernel> {
    match ty {
        GgmlType::Q8_0 => Some(simd::q8_0_dot),
        GgmlType::Q4_0 => Some(simd::q4_0_dot),
        GgmlType::Q5_0 => Some(simd::q5_0_dot),
        GgmlType::IQ4_NL => Some(simd::iq4_nl_dot),
        _ => None,
    }
}

/// The SIMD kernel of a Q8_1-paired format, where one exists (else its reference dot).
pub(super) fn simd_q8_1(ty: GgmlType) -> Option<Q8_1Kernel> {
    match ty {
        GgmlType::Q4_1 => Some(simd::q4_1_dot),
        GgmlType::Q5_1 => Some(simd::q5_1_dot),
        _ => None,
    }
}

/// Fills `out` (`rows × m`, row-major) in parallel over blocks of weight rows: each weight
/// row is read once for all tokens. `f(j, t0, n)` returns output column `j` for the `n ≤ 4`
/// input rows starting at `t0` (entries past `n` are ignored).
fn par_rows(
    out: &mut [f32],
    (m, task_rows): (usize, usize),
    f: impl Fn(usize, usize, usize) -> [f32; 4] + Sync,
) {
    let rows = out.len() / m;
    let ptr = SharedMut(out.as_mut_ptr());
    pool::global().run(m.div_ceil(task_rows), &|blk, _| {
        let ptr = &ptr;
        let j0 = blk * task_rows;
        for j in j0..(j0 + task_rows).min(m) {
            for t0 in (0..rows).step_by(4) {
                let n = (rows - t0).min(4);
                let v = f(j, t0, n);
                for (i, &val) in v.iter().enumerate().take(n) {
                    // SAFETY: index (t0+i)·m + j < rows·m = out.len(), and each (j, t) pair
                    // belongs to exactly one chunk (j is in one block only): no aliasing.
                    unsafe { *ptr.0.add((t0 + i) * m + j) = val };
                }
            }
        }
    });
}

/// [`par_rows`] for kernels that take one input row at a time: `f(j, t)`.
fn par_rows_each(
    out: &mut [f32],
    (m, task_rows): (usize, usize),
    f: impl Fn(usize, usize) -> f32 + Sync,
) {
    par_rows(out, (m, task_rows), |j, t0, n| {
        std::array::from_fn(|i| if i < n { f(j, t0 + i) } else { 0.0 })
    });
}

/// Bytes of one row of `k` elements requantized to `to` (Q8_0 or Q6_K, whole blocks), or
/// the error naming what [`requantize_rows`] takes.
pub fn requantized_row_bytes(name: &str, k: usize, to: GgmlType) -> Result<usize> {
    requantizer(name, k, to).map(|(_, bytes)| bytes)
}

/// The registry's quantizer of an opt-in head format and its bytes a row of `k`.
fn requantizer(name: &str, k: usize, to: GgmlType) -> Result<(quant::format::Quantizer, usize)> {
    let fmt = match to {
        GgmlType::Q8_0 | GgmlType::Q6_K => quant::format(to),
        _ => None,
    };
    let Some((fmt, quantize)) = fmt.and_then(|f| f.quantize.map(|q| (f, q))) else {
        return Err(Error::unsupported(
            format!("tensor '{name}': requantizing to"),
            to,
            [GgmlType::Q8_0, GgmlType::Q6_K],
            "",
        ));
    };
    if !k.is_multiple_of(fmt.block_elems) {
        return Err(Error::Model(format!(
            "tensor '{name}': cannot requantize rows of {k} to {to} (blocks of {})",
            fmt.block_elems
        )));
    }
    Ok((quantize, k / fmt.block_elems * fmt.block_bytes))
}

/// The rows of `data` (`ty` rows of `k`, tensor `name`) requantized to `to` (Q8_0 or Q6_K)
/// into `out` (whole rows of [`requantized_row_bytes`]): each row dequantized to f32 and
/// quantized as ggml's reference quantizers do, rows in parallel. The CPU's and the GPU's
/// quantized LM heads are these bytes.
pub fn requantize_rows(
    (ty, name): (GgmlType, &str),
    data: &[u8],
    k: usize,
    to: GgmlType,
    out: &mut [u8],
) -> Result<()> {
    let (quantize, row_bytes) = requantizer(name, k, to)?;
    let failed = std::sync::atomic::AtomicBool::new(false);
    pool::global().for_each_chunk_mut(out, row_bytes * 64, |c, dst, _| {
        let mut row = vec![0f32; k];
        for (i, d) in dst.chunks_exact_mut(row_bytes).enumerate() {
            if quant::dequantize_row(ty, name, data, k, c * 64 + i, &mut row).is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
            quantize(&row, d);
        }
    });
    if failed.into_inner() {
        return Err(Error::Model(format!(
            "tensor '{name}': rows could not be dequantized"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
