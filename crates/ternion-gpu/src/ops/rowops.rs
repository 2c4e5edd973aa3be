//! Row and element-wise ops of the GPT-2 / Phi-3 / Llama graphs (`rowops.wgsl`): LayerNorm
//! with bias, bias add, GELU, learned position embeddings, column slices, row selection.

use super::{uniform, Dispatch, StepUniform, WG};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::pipelines::{Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// The entry points of `rowops.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowOpKind {
    /// LayerNorm with weight and bias.
    LayerNorm,
    /// `x[t] += b`.
    AddBias,
    /// GELU (tanh form) in place.
    Gelu,
    /// `x[t] += table[pos + t]`.
    AddPos,
    /// Column slice.
    Slice,
    /// Row `n_tokens − 1` of `x`.
    SelectLast,
    /// Rows of `x` listed in an index buffer.
    Gather,
}

impl RowOpKind {
    pub(crate) fn entry_point(self) -> &'static str {
        match self {
            RowOpKind::LayerNorm => "layernorm",
            RowOpKind::AddBias => "add_bias",
            RowOpKind::Gelu => "gelu",
            RowOpKind::AddPos => "add_pos",
            RowOpKind::Slice => "slice",
            RowOpKind::SelectLast => "select_last",
            RowOpKind::Gather => "gather",
        }
    }
}

/// The table of an [`RowOp::add_pos`]: f32 or F16 rows, as stored in the file.
#[derive(Clone, Copy)]
pub enum PosTable<'a> {
    /// `n_pos × n` f32.
    F32(&'a GpuBuffer),
    /// `n_pos × n` F16 (n even).
    F16(&'a GpuBuffer),
}

/// One row op, built once and recorded per step. Dispatch shapes per op are in
/// `rowops.wgsl`; `record` takes the step's token count.
pub struct RowOp {
    dispatch: Dispatch,
    /// One workgroup per row (LayerNorm) instead of ceil(width/256) × rows.
    per_row: bool,
    /// Only one output row (SelectLast).
    single: bool,
    _params: GpuBuffer,
}

impl RowOp {
    fn build(
        ctx: &GpuContext,
        op: RowOpKind,
        words: [u32; 4],
        groups_x: u32,
        bindings: &[(u32, wgpu::BufferBinding<'_>)],
    ) -> Result<RowOp> {
        let params = uniform(ctx, "rowops.params", &words)?;
        let mut all = vec![(0, params.binding())];
        all.extend(bindings.iter().cloned());
        let key = PipelineKey {
            kernel: Kernel::RowOp { op },
            variant: Variant::default(),
        };
        let dispatch = Dispatch::new(ctx, key, op.entry_point(), &all, groups_x)?;
        Ok(RowOp {
            dispatch,
            per_row: op == RowOpKind::LayerNorm,
            single: op == RowOpKind::SelectLast,
            _params: params,
        })
    }

    /// `out = (x − mean)/√(var + eps) · w + b` per row of `n` (`x`, `out`: f32 rows; `w`,
    /// `b`: `n` f32). `out` may not be `x`.
    pub fn layer_norm(
        ctx: &GpuContext,
        x: &GpuBuffer,
        w: &GpuBuffer,
        b: &GpuBuffer,
        n: usize,
        eps: f32,
        out: &GpuBuffer,
    ) -> Result<RowOp> {
        Self::build(
            ctx,
            RowOpKind::LayerNorm,
            [n as u32, 0, 0, eps.to_bits()],
            0,
            &[
                (2, x.binding()),
                (3, w.binding()),
                (4, b.binding()),
                (5, out.binding()),
            ],
        )
    }

    /// `x[t] += b` for rows of `n` (`b`: `n` f32).
    pub fn add_bias(ctx: &GpuContext, x: &GpuBuffer, b: &GpuBuffer, n: usize) -> Result<RowOp> {
        Self::build(
            ctx,
            RowOpKind::AddBias,
            [n as u32, 0, 0, 0],
            (n as u32).div_ceil(WG),
            &[(2, x.binding()), (3, b.binding())],
        )
    }

    /// GELU (tanh form, ggml's F16 rounding of input and output) of rows of `n`, in place.
    pub fn gelu(ctx: &GpuContext, x: &GpuBuffer, n: usize) -> Result<RowOp> {
        Self::build(
            ctx,
            RowOpKind::Gelu,
            [n as u32, 0, 0, 0],
            (n as u32).div_ceil(WG),
            &[(2, x.binding())],
        )
    }

    /// `x[t] += table[pos_t]` for rows of `n`, at the tokens' positions (`toks`: the
    /// (position, slot) pairs of [`KvIndex`](super::KvIndex)); `n_pos` rows in the table.
    /// Rows whose position is ≥ `n_pos` are left unchanged: the caller checks positions
    /// before the step.
    #[allow(clippy::too_many_arguments)] // each is a distinct, named part of the op
    pub fn add_pos(
        ctx: &GpuContext,
        step: &StepUniform,
        toks: &GpuBuffer,
        x: &GpuBuffer,
        table: PosTable<'_>,
        n: usize,
        n_pos: usize,
    ) -> Result<RowOp> {
        let (buf, f16) = match table {
            PosTable::F32(b) => (b, 0),
            PosTable::F16(b) => (b, 1),
        };
        if f16 == 1 && !n.is_multiple_of(2) {
            return Err(Error::KernelArgs(format!(
                "add_pos: F16 table rows of odd width {n}"
            )));
        }
        Self::build(
            ctx,
            RowOpKind::AddPos,
            [n as u32, n_pos as u32, f16, 0],
            (n as u32).div_ceil(WG),
            &[
                (1, step.buf.binding()),
                (2, x.binding()),
                (3, buf.binding()),
                (6, toks.binding()),
            ],
        )
    }

    /// `out[t] = x[t][start .. start + m]` for rows of `n` in `x`.
    pub fn slice(
        ctx: &GpuContext,
        x: &GpuBuffer,
        n: usize,
        start: usize,
        m: usize,
        out: &GpuBuffer,
    ) -> Result<RowOp> {
        if start + m > n {
            return Err(Error::KernelArgs(format!(
                "slice: columns {start}..{} of rows of {n}",
                start + m
            )));
        }
        Self::build(
            ctx,
            RowOpKind::Slice,
            [n as u32, m as u32, start as u32, 0],
            (m as u32).div_ceil(WG),
            &[(2, x.binding()), (5, out.binding())],
        )
    }

    /// `out[0] = x[n_tokens − 1]` for rows of `n` (the step's last row; SelectRows when
    /// only the last logits are asked for).
    pub fn select_last(
        ctx: &GpuContext,
        step: &StepUniform,
        x: &GpuBuffer,
        n: usize,
        out: &GpuBuffer,
    ) -> Result<RowOp> {
        Self::build(
            ctx,
            RowOpKind::SelectLast,
            [n as u32, 0, 0, 0],
            (n as u32).div_ceil(WG),
            &[
                (1, step.buf.binding()),
                (2, x.binding()),
                (5, out.binding()),
            ],
        )
    }

    /// `out[r] = x[picks[r]]` for rows of `n` (`picks`: u32 row indices in the low 31 bits;
    /// `record` takes the number of rows to gather). With `round_flagged`, a row whose pick
    /// has the top bit set is rounded to F16 on the way.
    pub fn gather(
        ctx: &GpuContext,
        x: &GpuBuffer,
        n: usize,
        picks: &GpuBuffer,
        out: &GpuBuffer,
        round_flagged: bool,
    ) -> Result<RowOp> {
        Self::build(
            ctx,
            RowOpKind::Gather,
            [n as u32, u32::from(round_flagged), 0, 0],
            (n as u32).div_ceil(WG),
            &[(2, x.binding()), (5, out.binding()), (7, picks.binding())],
        )
    }

    /// Records the op over `n_tokens` rows (the step uniform, where the op reads one,
    /// must hold the same count).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let d = &self.dispatch;
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind_group, &[]);
        if self.per_row {
            pass.dispatch_workgroups(n_tokens, 1, 1);
        } else if self.single {
            pass.dispatch_workgroups(d.groups_x, 1, 1);
        } else {
            pass.dispatch_workgroups(d.groups_x, n_tokens, 1);
        }
    }
}
