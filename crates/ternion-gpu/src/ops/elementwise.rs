//! Per-head and element-wise ops of the Qwen3 / Gemma 3 graphs (`elementwise.wgsl`):
//! per-head RMSNorm, scale, residual add; and the int8 quantization of an I2_S matmul's
//! input that no RMSNorm feeds.

use super::{uniform, Dispatch, QuantAct, WG};
use crate::buffers::GpuBuffer;
use crate::context::GpuContext;
use crate::model::graph::GluAct;
use crate::pipelines::{GluAct as KernelGlu, Kernel, PipelineKey, Variant};
use crate::{Error, Result};

/// The entry points of `elementwise.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemKind {
    /// `out = rmsnorm(x) · w` per head.
    HeadRmsNorm,
    /// `x *= s`.
    Scale,
    /// `x += y`.
    Add,
    /// `x = tanh(x / cap) · cap` (logit soft-capping).
    SoftCap,
    /// Per-token int8 absmax quantization.
    QuantI8,
}

impl ElemKind {
    pub(crate) fn entry_point(self) -> &'static str {
        match self {
            ElemKind::HeadRmsNorm => "head_rmsnorm",
            ElemKind::Scale => "scale",
            ElemKind::Add => "add",
            ElemKind::SoftCap => "softcap",
            ElemKind::QuantI8 => "quant_i8",
        }
    }
}

/// One op of `elementwise.wgsl`, built once and recorded per step over the step's rows.
pub struct Elementwise {
    dispatch: Dispatch,
    _params: GpuBuffer,
}

impl Elementwise {
    fn build(
        ctx: &GpuContext,
        op: ElemKind,
        words: [u32; 4],
        groups_x: u32,
        bindings: &[(u32, wgpu::BufferBinding<'_>)],
    ) -> Result<Elementwise> {
        let params = uniform(ctx, "elementwise.params", &words)?;
        let mut all = vec![(0, params.binding())];
        all.extend(bindings.iter().cloned());
        let key = PipelineKey {
            kernel: Kernel::Elementwise { op },
            variant: Variant::default(),
        };
        let dispatch = Dispatch::new(ctx, key, op.entry_point(), &all, groups_x)?;
        Ok(Elementwise {
            dispatch,
            _params: params,
        })
    }

    /// `out = rmsnorm(x) · w` over each head of `hd` values of rows of `n` (`w`: `hd` f32).
    /// `out` may not be `x`.
    pub fn head_rms_norm(
        ctx: &GpuContext,
        x: &GpuBuffer,
        w: &GpuBuffer,
        n: usize,
        hd: usize,
        eps: f32,
        out: &GpuBuffer,
    ) -> Result<Elementwise> {
        if hd == 0 || !n.is_multiple_of(hd) {
            return Err(Error::KernelArgs(format!(
                "head_rmsnorm: row width {n} is not a multiple of the head width {hd}"
            )));
        }
        Self::build(
            ctx,
            ElemKind::HeadRmsNorm,
            [n as u32, hd as u32, 0, eps.to_bits()],
            (n / hd) as u32,
            &[(1, x.binding()), (2, w.binding()), (3, out.binding())],
        )
    }

    /// `x *= s` over rows of `n`.
    pub fn scale(ctx: &GpuContext, x: &GpuBuffer, n: usize, s: f32) -> Result<Elementwise> {
        Self::in_place(ctx, ElemKind::Scale, x, n, s)
    }

    /// An element-wise op on `x` in place with one f32 parameter `s`, a thread per element.
    fn in_place(
        ctx: &GpuContext,
        op: ElemKind,
        x: &GpuBuffer,
        n: usize,
        s: f32,
    ) -> Result<Elementwise> {
        Self::build(
            ctx,
            op,
            [n as u32, 0, s.to_bits(), 0],
            (n as u32).div_ceil(WG),
            &[(1, x.binding())],
        )
    }

    /// `x = tanh(x / cap) · cap` over rows of `n`.
    pub fn softcap(ctx: &GpuContext, x: &GpuBuffer, n: usize, cap: f32) -> Result<Elementwise> {
        Self::in_place(ctx, ElemKind::SoftCap, x, n, cap)
    }

    /// `x += y` over rows of `n`.
    pub fn add(ctx: &GpuContext, x: &GpuBuffer, y: &GpuBuffer, n: usize) -> Result<Elementwise> {
        Self::build(
            ctx,
            ElemKind::Add,
            [n as u32, 0, 0, 0],
            (n as u32).div_ceil(WG),
            &[(1, x.binding()), (2, y.binding())],
        )
    }

    /// `q` = rows of `x` quantized to int8 per token, as the ternary matvecs read them.
    pub fn quant_i8(ctx: &GpuContext, x: &GpuBuffer, q: &QuantAct) -> Result<Elementwise> {
        if !q.k.is_multiple_of(4) {
            return Err(Error::KernelArgs(format!(
                "quant_i8: row width {} is not a multiple of 4",
                q.k
            )));
        }
        Self::build(
            ctx,
            ElemKind::QuantI8,
            [q.k as u32, 0, 0, 0],
            1,
            &[(1, x.binding()), (4, q.q.binding()), (5, q.meta.binding())],
        )
    }

    /// Records the op over the first `n_tokens` rows.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.dispatch.record(pass, n_tokens);
    }
}

/// The GEGLU/SwiGLU/ReLU² kernel of a graph activation.
pub(crate) fn kernel_glu(act: GluAct) -> KernelGlu {
    match act {
        GluAct::Relu2 => KernelGlu::ReluSqr,
        GluAct::Silu => KernelGlu::Silu,
        GluAct::GeluTanh => KernelGlu::GeluTanh,
    }
}
