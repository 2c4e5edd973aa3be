//! The builders of one matrix product (`Op::Linear`, and each product of the fused
//! projection ops): I2_S matvecs over int8 activations, the F16 LM head in its row modes,
//! and the GGUF-format matvecs (with their activation quantization).

use super::build::{quant_weight, unsupported, Compiler};
use super::launch::{Head, Launch, QHead};
use super::TPR;
use crate::buffers::{GpuBuffer, Sharded};
use crate::context::GpuContext;
use crate::model::graph::{ActId, InNorm, Op, WeightId};
use crate::ops::{
    ActQuant, Elementwise, F16Matvec, MatIn, NormIn, NormMatvec, NormMatvecKind, NormOut,
    NormQuant, OwnTiles, QAct, QMatvec, QMatvecOpts, QWeights, QuantAct, QuantizeAct, RmsNorm,
    RowOp, TernaryLinear, TernaryWeights,
};
use crate::pipelines::Epilogue;
use crate::upload::GpuWeight;
use crate::Result;

/// The int8 activations I2_S matvecs read.
#[derive(Clone)]
pub(super) struct Int8In {
    /// The quantized rows and their per-token scales.
    pub(super) q: QuantAct,
    /// Under the fast numerics, the norm the single-token launches recompute in their
    /// prologue (the norm launch itself runs only for steps of several tokens).
    pub(super) norm: Option<NormIn>,
}

/// A head matvec's input: the Q8 activations `q` where the format reads them, else the
/// f32 `rows` themselves.
fn head_in<'a>(q: &'a Option<QAct>, rows: &'a GpuBuffer) -> MatIn<'a> {
    match q {
        Some(q) => MatIn::Quant(q),
        None => MatIn::F32(rows),
    }
}

/// The compact copy of the picked rows of an act of `width` (the head's input).
fn picked_rows(ctx: &GpuContext, width: usize, rows: usize) -> Result<GpuBuffer> {
    GpuBuffer::zeroed(ctx, "picked", (rows * width * 4) as u64)
}

/// The I2_S weights of `w`, if it has that format.
pub(super) fn ternary(weights: &[GpuWeight], w: WeightId) -> Option<&TernaryWeights> {
    match &weights[w.0] {
        GpuWeight::Ternary(t) => Some(t),
        _ => None,
    }
}

impl Compiler<'_> {
    /// The input norm of a fused projection op: as int8 activations of its scratch when
    /// every product reads them (`int8`: all I2_S), else f32 rows in the scratch.
    pub(super) fn in_norm(&mut self, x: ActId, norm: InNorm, int8: bool) -> Result<Option<Int8In>> {
        if int8 {
            return self.norm_i8(x, norm).map(Some);
        }
        self.rms_norm(x, norm.w, norm.scratch)?;
        Ok(None)
    }

    /// `rmsnorm(x) · norm.w` as the int8 activations of the norm's scratch.
    pub(super) fn norm_i8(&mut self, x: ActId, norm: InNorm) -> Result<Int8In> {
        let (xb, wb) = (self.acts.f32(x)?, self.vector(norm.w)?);
        if self.acts.is_selected(x) {
            self.acts.selected.push(norm.scratch);
        }
        let (k, eps) = (self.width(x), self.graph.rms_eps);
        let q = self.acts.quant(norm.scratch)?;
        if self.fast && NormIn::fits(k) {
            let norm = NormIn {
                x: xb,
                w: wb,
                k,
                eps,
            };
            let nq = NormQuant::new(self.g, &norm, &q)?;
            self.push(Launch::BatchOnly(Box::new(Launch::NormQuant(nq))))?;
            return Ok(Int8In {
                q,
                norm: Some(norm),
            });
        }
        let v = self.norm_variant;
        let n = RmsNorm::new(self.g, v, &xb, &wb, k, eps, NormOut::Quant(&q))?;
        self.push(Launch::Norm(n))?;
        Ok(Int8In { q, norm: None })
    }

    /// `Op::Linear`.
    pub(super) fn linear(
        &mut self,
        op: &Op,
        w: WeightId,
        x: ActId,
        out: ActId,
        add: bool,
    ) -> Result<()> {
        self.product(op, (w, x, out, add), &mut None)
    }

    /// `out (+)= W · x` for a matrix of any format. An I2_S matrix reads the int8
    /// activations of `x` in `int8`, quantizing `x` first (and keeping the result there)
    /// when there are none.
    pub(super) fn product(
        &mut self,
        op: &Op,
        (w, x, out, add): (WeightId, ActId, ActId, bool),
        int8: &mut Option<Int8In>,
    ) -> Result<()> {
        let epilogue = if add { Epilogue::Add } else { Epilogue::Store };
        let weights = self.weights;
        match (&weights[w.0], quant_weight(weights, w)) {
            (GpuWeight::Ternary(tw), _) => {
                let input = match int8 {
                    Some(i) => i.clone(),
                    None => int8.insert(self.quantize_i8(x)?).clone(),
                };
                self.ternary_one(&input, tw, out, epilogue)
            }
            (GpuWeight::F16Rows(m), _) if self.acts.is_selected(x) && !add => {
                self.f16_head(m, x, out)
            }
            (_, Some((qw, post_scale))) => {
                let opts = |round_x| QMatvecOpts {
                    epilogue,
                    round_x,
                    post_scale,
                };
                if self.acts.is_selected(x) {
                    self.q_head(qw, opts, x, out)
                } else {
                    let ob = self.acts.f32(out)?;
                    let mv = match qw.fmt.act() {
                        Some(k) => {
                            let q = self.acts.qact(x, k, &mut self.launches)?;
                            self.qmatvec(qw, MatIn::Quant(&q), &ob, opts(true), false)?
                        }
                        None => {
                            let xb = self.acts.f32(x)?;
                            self.qmatvec(qw, MatIn::F32(&xb), &ob, opts(true), false)?
                        }
                    };
                    self.push(Launch::QLinear(mv))
                }
            }
            _ => Err(unsupported(op)),
        }
    }

    /// The int8 activations of `x`, quantized by their own launch.
    fn quantize_i8(&mut self, x: ActId) -> Result<Int8In> {
        let (xb, q) = (self.acts.f32(x)?, self.acts.quant(x)?);
        self.push(Launch::Elem(Elementwise::quant_i8(self.g, &xb, &q)?))?;
        Ok(Int8In { q, norm: None })
    }

    /// Under the fast numerics, the single-token launch of I2_S matvecs `kind` with the
    /// norm of `input` in its prologue.
    pub(super) fn single(
        &self,
        input: &Int8In,
        kind: NormMatvecKind<'_>,
    ) -> Result<Option<NormMatvec>> {
        let norm = input.norm.as_ref();
        norm.map(|n| NormMatvec::new(self.g, n, kind)).transpose()
    }

    /// One I2_S matvec; under the fast numerics single-token steps run it with the norm in
    /// its prologue.
    fn ternary_one(
        &mut self,
        input: &Int8In,
        tw: &TernaryWeights,
        out: ActId,
        epilogue: Epilogue,
    ) -> Result<()> {
        let (g, s) = (self.g, self.steps);
        let ob = self.acts.f32(out)?;
        let kind = NormMatvecKind::One {
            w: tw,
            out: &ob,
            epilogue,
        };
        let single = self.single(input, kind)?;
        let scratch = self.acts.split_scratch(tw.rows, tw.k)?;
        let own = OwnTiles {
            narrow: true,
            wide: true,
            split: scratch.as_ref(),
        };
        let mv = TernaryLinear::new(
            g,
            self.variant,
            TPR,
            tw,
            &input.q,
            &ob,
            (epilogue, own),
            &s.step,
        )?;
        self.push(Launch::decode(single, Launch::Ternary(mv)))
    }

    /// The F16 LM head over the selected rows of `x`, in every row mode (the picked rows
    /// of a step of decode rows — sequences decoded together — on cooperative matrices
    /// where the adapter has them).
    fn f16_head(&mut self, m: &Sharded, x: ActId, out: ActId) -> Result<()> {
        let (g, v, s) = (self.g, self.variant, self.steps);
        let ob = self.acts.f32(out)?;
        let xb = self.acts.f32(x)?;
        let pb = picked_rows(g, self.width(x), self.acts.max_batch)?;
        let head = Head {
            decode: F16Matvec::one_token(g, v, TPR, m, &xb, &ob, true)?,
            last: F16Matvec::last_row(g, v, TPR, m, &xb, &ob, false, &s.step)?,
            all: F16Matvec::rows8(g, v, TPR, m, &xb, &ob, &s.step)?,
            gather: RowOp::gather(g, &xb, self.width(x), &s.picks, &pb, true)?,
            picked: F16Matvec::rows8(g, v, TPR, m, &pb, &ob, &s.pick_step)?,
            // The rows32 kernel rounds its input to F16, as the gather does for decode rows.
            picked_decode: F16Matvec::rows32(g, m, &pb, &ob, &s.pick_step)?,
        };
        self.acts.keep.push(pb);
        self.push(Launch::Head(Box::new(head)))
    }

    /// A GGUF-format matvec into `ob`, over the step's rows or (`picked`) the picked ones.
    fn qmatvec(
        &self,
        qw: &QWeights,
        input: MatIn<'_>,
        ob: &GpuBuffer,
        opts: QMatvecOpts,
        picked: bool,
    ) -> Result<QMatvec> {
        let s = self.steps;
        let step = if picked { &s.pick_step } else { &s.step };
        QMatvec::new(self.g, self.variant, TPR, qw, input, ob, opts, Some(step))
    }

    /// A new `kind` quantization of `rows` rows of `width`, kept with the plan.
    fn new_qact(&mut self, kind: ActQuant, width: usize, rows: usize) -> Result<QAct> {
        let q = QAct::new(self.g, kind, width, rows)?;
        self.acts.qact_bufs.push(q.clone());
        Ok(q)
    }

    /// A GGUF-format matvec over the rows of `src` (`width` each; `picked`: the picked
    /// ones), quantized first by their own launch when the format reads Q8 activations;
    /// `opts` for Q8 and for f32 inputs.
    fn q_rows(
        &mut self,
        qw: &QWeights,
        (src, width): (&GpuBuffer, usize),
        ob: &GpuBuffer,
        (opts_q8, opts_f32): (QMatvecOpts, QMatvecOpts),
        picked: bool,
    ) -> Result<(Option<QuantizeAct>, QMatvec)> {
        let Some(kind) = qw.fmt.act() else {
            let mv = self.qmatvec(qw, MatIn::F32(src), ob, opts_f32, picked)?;
            return Ok((None, mv));
        };
        let q = self.new_qact(kind, width, self.acts.max_batch)?;
        let quantize = QuantizeAct::new(self.g, src, &q)?;
        let mv = self.qmatvec(qw, MatIn::Quant(&q), ob, opts_q8, picked)?;
        Ok((Some(quantize), mv))
    }

    /// The Q8 activations of `rows` rows of `src` (`width` each) for a head format that
    /// reads them (`kind`), with the launch that quantizes them; none for f32 inputs.
    fn head_input(
        &mut self,
        kind: Option<ActQuant>,
        src: &GpuBuffer,
        width: usize,
        rows: usize,
    ) -> Result<(Option<QuantizeAct>, Option<QAct>)> {
        match kind {
            Some(k) => {
                let q = self.new_qact(k, width, rows)?;
                Ok((Some(QuantizeAct::new(self.g, src, &q)?), Some(q)))
            }
            None => Ok((None, None)),
        }
    }

    /// A GGUF-format LM head over the selected rows of `x`: the last-row mode copies the
    /// step's last row out first, then quantizes it when the format asks; a single-token
    /// step's row is the first of `x`, read (and quantized) where it is.
    fn q_head(
        &mut self,
        qw: &QWeights,
        opts: impl Fn(bool) -> QMatvecOpts,
        x: ActId,
        out: ActId,
    ) -> Result<()> {
        let (g, s, width) = (self.g, self.steps, self.width(x));
        let max_batch = self.acts.max_batch;
        let ob = self.acts.f32(out)?;
        let kind = qw.fmt.act();
        let sel = GpuBuffer::zeroed(g, "selected", (width * 4) as u64)?;
        let select = RowOp::select_last(g, &s.step, &self.acts.f32(x)?, width, &sel)?;
        let (quant_one, one) = self.head_input(kind, &sel, width, 1)?;
        let last = self.qmatvec(qw, head_in(&one, &sel), &ob, opts(false), false)?;
        let xb = self.acts.f32(x)?;
        let (quant_all, all_q) = self.head_input(kind, &xb, width, max_batch)?;
        let decode = self.qmatvec(qw, head_in(&all_q, &xb), &ob, opts(true), false)?;
        // F32 rows of a batch round like the per-token matvec (round_x); Q8 rows are
        // quantized unrounded.
        let all_opts = if kind.is_some() {
            opts(false)
        } else {
            opts(true)
        };
        let all = self.qmatvec(qw, head_in(&all_q, &xb), &ob, all_opts, false)?;
        let pb = picked_rows(g, width, max_batch)?;
        // F32-input formats round a decode row's input like `decode` (round_x); Q8 inputs
        // are quantized unrounded.
        let gather = RowOp::gather(g, &xb, width, &s.picks, &pb, kind.is_none())?;
        let (quant_picked, picked) =
            self.q_rows(qw, (&pb, width), &ob, (opts(false), opts(false)), true)?;
        self.acts.keep.push(pb);
        self.push(Launch::QHead(Box::new(QHead {
            select,
            quant_one,
            decode,
            last,
            quant_all,
            all,
            gather,
            quant_picked,
            picked,
        })))
    }
}
