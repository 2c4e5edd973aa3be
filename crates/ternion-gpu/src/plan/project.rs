//! The builders of the fused projection ops: an input norm and the matrix products that
//! read it, as one launch where every matrix is I2_S (q/k/v: `Ternary3`; gate/up/GLU:
//! `TernaryGlu`), else the norm and one product at a time.

use super::build::Compiler;
use super::launch::{FusedGlu, FusedQkv, Launch};
use super::linear::ternary;
use super::TPR;
use crate::model::graph::{ActId, GluAct, InNorm, Op, WeightId};
use crate::ops::{
    kernel_glu, CoopFused, Glu, NarrowFused, NormMatvecKind, OwnTiles, Ternary3, TernaryGlu,
    TernaryLinear,
};
use crate::pipelines::Epilogue;
use crate::Result;

impl Compiler<'_> {
    /// `Op::NormLinear`.
    pub(super) fn norm_linear(
        &mut self,
        op: &Op,
        (x, norm): (ActId, InNorm),
        w: WeightId,
        out: ActId,
        add: bool,
    ) -> Result<()> {
        let mut int8 = self.in_norm(x, norm, ternary(self.weights, w).is_some())?;
        self.product(op, (w, norm.scratch, out, add), &mut int8)
    }

    /// `Op::NormQkv`.
    pub(super) fn norm_qkv(
        &mut self,
        op: &Op,
        (x, norm): (ActId, InNorm),
        w: [WeightId; 3],
        out: [ActId; 3],
    ) -> Result<()> {
        let weights = self.weights;
        let i2s = w.map(|w| ternary(weights, w));
        let distinct = out[0] != out[1] && out[0] != out[2] && out[1] != out[2];
        let (g, v, s) = (self.g, self.variant, self.steps);
        match i2s {
            [Some(a), Some(b), Some(c)] if distinct && !out.contains(&norm.scratch) => {
                let input = self.norm_i8(x, norm)?;
                let ob = [
                    self.acts.f32(out[0])?,
                    self.acts.f32(out[1])?,
                    self.acts.f32(out[2])?,
                ];
                let ws = [a, b, c];
                let out = [&ob[0], &ob[1], &ob[2]];
                let fused = Ternary3::new(g, v, TPR, ws, &input.q, out)?;
                let narrow = NarrowFused::qkv(g, ws, &input.q, out, &s.step)?;
                let coop = CoopFused::qkv(g, ws, &input.q, out, &s.step)?;
                let own = OwnTiles {
                    narrow: narrow.is_none(),
                    wide: coop.is_none(),
                    split: None,
                };
                let own = (Epilogue::Store, own);
                let mv =
                    |i: usize| TernaryLinear::new(g, v, TPR, ws[i], &input.q, out[i], own, &s.step);
                let each = [mv(0)?, mv(1)?, mv(2)?];
                let single = self.single(&input, NormMatvecKind::Three { w: ws, out })?;
                let qkv = FusedQkv {
                    fused,
                    each,
                    narrow,
                    coop,
                };
                self.push(Launch::decode(single, Launch::Ternary3(Box::new(qkv))))
            }
            _ => {
                let all = i2s.iter().all(Option::is_some);
                let mut int8 = self.in_norm(x, norm, all)?;
                for (w, out) in w.into_iter().zip(out) {
                    self.product(op, (w, norm.scratch, out, false), &mut int8)?;
                }
                Ok(())
            }
        }
    }

    /// `Op::NormGlu`.
    pub(super) fn norm_glu(
        &mut self,
        op: &Op,
        (x, norm): (ActId, InNorm),
        act: GluAct,
        [w_gate, w_up]: [WeightId; 2],
        (gate, up): (ActId, ActId),
    ) -> Result<()> {
        let weights = self.weights;
        let (g, v, s) = (self.g, self.variant, self.steps);
        let apart = gate != up && ![gate, up].contains(&norm.scratch);
        match (ternary(weights, w_gate), ternary(weights, w_up)) {
            (Some(gw), Some(uw)) if act != GluAct::GeluTanh && apart => {
                let input = self.norm_i8(x, norm)?;
                let act = kernel_glu(act);
                let (gb, ub) = (self.acts.f32(gate)?, self.acts.f32(up)?);
                let kind = NormMatvecKind::Glu {
                    gate: gw,
                    up: uw,
                    out: &gb,
                    act,
                };
                let single = self.single(&input, kind)?;
                let narrow = NarrowFused::glu(g, (gw, uw), &input.q, &gb, act, &s.step)?;
                let tail = self.acts.glu_tail()?;
                let coop = CoopFused::glu(g, (gw, uw), &input.q, &gb, act, &s.step, &tail)?;
                let own = OwnTiles {
                    narrow: narrow.is_none(),
                    wide: coop.is_none(),
                    split: None,
                };
                let own = (Epilogue::Store, own);
                let mv = |w, out| TernaryLinear::new(g, v, TPR, w, &input.q, out, own, &s.step);
                let fused = Launch::TernaryGlu(Box::new(FusedGlu {
                    fused: TernaryGlu::new(g, v, TPR, gw, uw, &input.q, &gb, act)?,
                    gate: mv(gw, &gb)?,
                    up: mv(uw, &ub)?,
                    glu: Glu::new(g, act, &gb, &ub, self.width(gate))?,
                    narrow,
                    coop,
                }));
                self.push(Launch::decode(single, fused))
            }
            (gw, uw) => {
                let mut int8 = self.in_norm(x, norm, gw.is_some() && uw.is_some())?;
                self.product(op, (w_gate, norm.scratch, gate, false), &mut int8)?;
                self.product(op, (w_up, norm.scratch, up, false), &mut int8)?;
                self.glu(act, gate, up)
            }
        }
    }

    /// `Op::Glu`: `gate = act(gate) · up`.
    pub(super) fn glu(&mut self, act: GluAct, gate: ActId, up: ActId) -> Result<()> {
        let act = kernel_glu(act);
        let (gb, ub) = (self.acts.f32(gate)?, self.acts.f32(up)?);
        let glu = Glu::new(self.g, act, &gb, &ub, self.width(gate))?;
        self.push(Launch::Glu(glu))
    }
}
