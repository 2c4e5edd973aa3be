//! Weights onto the GPU one tensor at a time, so a loader never needs the whole file in
//! memory (the browser streams 1.19 GB through HTTP range requests).
//!
//! [`GpuUpload::new`] reads only the header (configuration and tensor table), builds the
//! model's [`Graph`], checks every tensor it needs (present, shape, a type the GPU has a
//! kernel for) and allocates the GPU buffers. The loader then asks for tensors in file
//! order ([`GpuUpload::next_tensor`] gives the byte range), hands each one's bytes to
//! [`GpuUpload::put`], which queues the upload and keeps nothing, and
//! [`GpuUpload::finish`] compiles the plan into a [`GpuModel`].

use std::ops::Range;
use std::sync::Arc;

use super::buffers::{GpuBuffer, Sharded};
use super::context::{Caps, GpuContext};
use super::exec::{GpuModel, GpuModelOptions};
use super::ops::{QFormat, QWeights, TernaryWeights};
use crate::backend::cpu::{requantize_rows, requantized_row_bytes};
use crate::gguf::GgufFile;
use crate::model::graph::{Graph, Op, WeightId, WeightKind};
use crate::model::{self, Config, LmHead};
use crate::quant::{self, GgmlType};
use crate::{Error, Result};

/// A tensor the loader must fetch next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRequest {
    /// Tensor name.
    pub name: String,
    /// Absolute byte range in the file.
    pub range: Range<u64>,
}

/// A graph weight as the GPU holds it.
pub(crate) enum GpuWeight {
    /// I2_S codes as stored, and the tensor scale.
    Ternary(TernaryWeights),
    /// F16 rows (the embedding table, an F16 LM head, a position table), sharded to fit
    /// bindings.
    F16Rows(Sharded),
    /// Any other GGUF matrix, as stored; created when its bytes arrive. `scale` is the
    /// optional output scale (1bitLLM `.scale`), 1 otherwise.
    Quant {
        /// The uploaded rows.
        w: Option<QWeights>,
        /// Output scale.
        scale: f32,
    },
    /// An f32 vector (norm weights); created when its bytes arrive.
    Vector(Option<GpuBuffer>),
}

/// What a fetched tensor fills.
enum Target {
    /// Weight `i` of the graph.
    Weight(usize),
    /// The 1-element output scale of weight `i` (1bitLLM `.scale`).
    Scale(usize),
}

/// The opt-in quantized LM head: the stored weight whose bytes it is requantized from when
/// they arrive, the weight that holds it (the same one unless the stored one is also the
/// token table), and its format.
#[derive(Clone, Copy)]
struct HeadQuant {
    src: usize,
    dst: usize,
    to: GgmlType,
}

/// The requantized LM head `lm_head` asks for: where the linear that writes the logits sits
/// in `graph.ops`, the weight it reads, whether the token table is that same weight, and
/// the format to requantize to.
fn quantized_head(
    graph: &Graph,
    lm_head: LmHead,
) -> Result<Option<(usize, usize, bool, GgmlType)>> {
    let to = match lm_head {
        LmHead::AsStored => return Ok(None),
        LmHead::Q8_0 => GgmlType::Q8_0,
        LmHead::Q6K => GgmlType::Q6_K,
    };
    let linear = graph.ops.iter().enumerate().find_map(|(at, op)| match *op {
        Op::Linear { w, out, .. } if out == graph.logits => Some((at, w.0)),
        _ => None,
    });
    let Some((at, w)) = linear else {
        return Ok(None);
    };
    let desc = &graph.weights[w];
    match &desc.kind {
        WeightKind::Matrix { k, scale: None, .. } => {
            requantized_row_bytes(&desc.name, *k, to)?;
        }
        _ => {
            return Err(Error::Model(format!(
                "tensor '{}': an LM head with an output scale cannot be requantized",
                desc.name
            )))
        }
    }
    let tied = graph.ops.iter().any(
        |op| matches!(*op, Op::Embed { table, .. } | Op::AddPosEmbed { table, .. } if table.0 == w),
    );
    Ok(Some((at, w, tied, to)))
}

struct Pending {
    req: TensorRequest,
    ty: GgmlType,
    n: usize,
    target: Target,
}

/// A model being uploaded tensor by tensor (see the module docs).
pub struct GpuUpload {
    ctx: Arc<GpuContext>,
    cfg: Config,
    graph: Graph,
    opts: GpuModelOptions,
    weights: Vec<GpuWeight>,
    scales: Vec<f32>,
    pending: Vec<Pending>,
    next: usize,
    head: Option<HeadQuant>,
}

/// F16 matrices the embedding / LM-head / position kernels read directly: those read by an
/// embedding or position op, or by the linear that writes the logits.
fn f16_row_weights(graph: &Graph) -> Vec<bool> {
    let mut rows = vec![false; graph.weights.len()];
    for op in &graph.ops {
        match *op {
            Op::Embed { table, .. } | Op::AddPosEmbed { table, .. } => rows[table.0] = true,
            Op::Linear { w, out, .. } if out == graph.logits => rows[w.0] = true,
            _ => {}
        }
    }
    rows
}

fn storage(
    ctx: &GpuContext,
    name: &str,
    ty: GgmlType,
    kind: &WeightKind,
    f16_rows: bool,
) -> Result<(GpuWeight, usize)> {
    match *kind {
        WeightKind::Vector { n } => Ok((GpuWeight::Vector(None), n)),
        WeightKind::Matrix { k, m, .. } => Ok((
            match ty {
                GgmlType::I2_S => GpuWeight::Ternary(TernaryWeights::zeroed(ctx, name, k, m)?),
                GgmlType::F16 if f16_rows => {
                    GpuWeight::F16Rows(Sharded::zeroed(ctx, name, m, k * 2, None)?)
                }
                _ if QFormat::from_ggml(ty).is_some() || ty == GgmlType::TQ1_0 => {
                    GpuWeight::Quant {
                        w: None,
                        scale: 1.0,
                    }
                }
                _ => {
                    return Err(Error::unsupported(
                        format!("tensor '{name}': GPU weight type"),
                        ty,
                        GgmlType::all().filter(|&t| {
                            matches!(t, GgmlType::I2_S | GgmlType::F16 | GgmlType::TQ1_0)
                                || QFormat::from_ggml(t).is_some()
                        }),
                        "use --backend cpu",
                    ))
                }
            },
            k * m,
        )),
    }
}

/// Checks one weight against the adapter's limits before anything is allocated or fetched.
/// Ternary codes are bound whole, so they must fit one binding and one buffer; F16 and
/// GGUF-format matrices are split into row shards, so one row must fit. `stored` is the
/// tensor's size in the file.
pub(crate) fn check_fits(
    name: &str,
    ty: GgmlType,
    kind: &WeightKind,
    stored: u64,
    caps: &Caps,
) -> Result<()> {
    let WeightKind::Matrix { k, m, .. } = *kind else {
        return Ok(());
    };
    let (limit, max) = if caps.max_binding <= caps.max_buffer {
        ("max_storage_buffer_binding_size", caps.max_binding)
    } else {
        ("max_buffer_size", caps.max_buffer)
    };
    let (what, bytes) = match ty {
        GgmlType::I2_S => ("its ternary codes", (k * m / 4) as u64),
        // Uploaded as TQ2_0.
        GgmlType::TQ1_0 => (
            "one row",
            GgmlType::TQ2_0.row_bytes(k as u64).unwrap_or(u64::MAX),
        ),
        _ => ("one row", stored / (m.max(1) as u64)),
    };
    if bytes > max {
        return Err(Error::ExceedsLimit {
            what: format!("tensor '{name}' ({what})"),
            bytes,
            limit,
            max,
            adapter: caps.name.clone(),
            hint: "use --backend cpu",
        });
    }
    Ok(())
}

/// Names the tensor and the upload's progress in a GPU failure (out of GPU memory, a
/// buffer the device refuses, a weight the kernels cannot take).
fn while_uploading(e: Error, name: &str, done: u64, total: u64) -> Error {
    match e {
        Error::OutOfMemory { .. }
        | Error::ExceedsLimit { .. }
        | Error::DeviceFault { .. }
        | Error::DeviceLost { .. }
        | Error::KernelArgs(_)
        | Error::Unsupported { .. } => Error::Uploading {
            tensor: name.into(),
            done,
            total,
            error: Box::new(e),
        },
        other => other,
    }
}

impl GpuUpload {
    /// Reads the configuration and tensor table of `header` (tensor data is not touched),
    /// checks the tensors and allocates their GPU buffers.
    pub fn new(
        ctx: Arc<GpuContext>,
        header: &GgufFile,
        opts: GpuModelOptions,
    ) -> Result<GpuUpload> {
        let cfg = Config::from_gguf(header)?;
        let mut graph = model::graph_for(&cfg, header);
        let head = quantized_head(&graph, opts.lm_head)?;
        let info = |name: &str| {
            header
                .tensor(name)
                .ok_or_else(|| Error::Model(format!("tensor '{name}' is missing")))
        };
        let mut weights = Vec::with_capacity(graph.weights.len());
        let mut pending = Vec::new();
        let f16_rows = f16_row_weights(&graph);
        for w in &graph.weights {
            let t = info(&w.name)?;
            check_fits(&w.name, t.ty, &w.kind, t.size, ctx.caps())?;
        }
        let total: u64 = graph
            .weights
            .iter()
            .filter_map(|w| header.tensor(&w.name))
            .map(|t| t.size)
            .sum();
        let mut allocated = 0u64;
        for (i, w) in graph.weights.iter().enumerate() {
            let t = info(&w.name)?;
            let (weight, n) = match head {
                // An untied head is held only requantized.
                Some((_, h, false, _)) if h == i => (
                    GpuWeight::Quant {
                        w: None,
                        scale: 1.0,
                    },
                    0,
                ),
                _ => storage(&ctx, &w.name, t.ty, &w.kind, f16_rows[i])
                    .map_err(|e| while_uploading(e, &w.name, allocated, total))?,
            };
            allocated += t.size;
            let shape_ok = match w.kind {
                WeightKind::Vector { n } => t.n_elements() == n as u64,
                WeightKind::Matrix { k, m, .. } => t.shape == [k as u64, m as u64],
            };
            if !shape_ok {
                return Err(Error::Model(format!(
                    "tensor '{}': shape {:?} does not fit {:?}",
                    w.name, t.shape, w.kind
                )));
            }
            if let WeightKind::Matrix { scale: Some(s), .. } = &w.kind {
                let st = info(s)?;
                pending.push(Pending {
                    req: TensorRequest {
                        name: s.clone(),
                        range: st.offset..st.offset + st.size,
                    },
                    ty: st.ty,
                    n: 1,
                    target: Target::Scale(i),
                });
            }
            pending.push(Pending {
                req: TensorRequest {
                    name: w.name.clone(),
                    range: t.offset..t.offset + t.size,
                },
                ty: t.ty,
                n,
                target: Target::Weight(i),
            });
            weights.push(weight);
        }
        pending.sort_by_key(|p| p.req.range.start);
        // A tied head gets a weight of its own, which the logits' linear reads instead.
        let head = head.map(|(at, src, tied, to)| {
            let dst = if tied {
                graph.weights.push(graph.weights[src].clone());
                weights.push(GpuWeight::Quant {
                    w: None,
                    scale: 1.0,
                });
                if let Op::Linear { w, .. } = &mut graph.ops[at] {
                    *w = WeightId(graph.weights.len() - 1);
                }
                graph.weights.len() - 1
            } else {
                src
            };
            HeadQuant { src, dst, to }
        });
        let scales = vec![1.0; weights.len()];
        Ok(GpuUpload {
            ctx,
            cfg,
            graph,
            opts,
            weights,
            scales,
            pending,
            next: 0,
            head,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The next tensor to fetch and [`GpuUpload::put`], in file order; `None` when all are in.
    pub fn next_tensor(&self) -> Option<&TensorRequest> {
        self.pending.get(self.next).map(|p| &p.req)
    }

    /// Bytes of every tensor to fetch (for progress reports).
    pub fn total_bytes(&self) -> u64 {
        self.pending
            .iter()
            .map(|p| p.req.range.end - p.req.range.start)
            .sum()
    }

    /// Uploads the bytes of the tensor [`GpuUpload::next_tensor`] named.
    pub fn put(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(p) = self.pending.get(self.next) else {
            return Err(Error::Request("upload: every tensor is already in".into()));
        };
        let name = &p.req.name;
        let want = p.req.range.end - p.req.range.start;
        if bytes.len() as u64 != want {
            return Err(Error::Request(format!(
                "upload of '{name}': {} bytes given, the file says {want}",
                bytes.len()
            )));
        }
        let name = name.clone();
        let done: u64 = self.pending[..self.next]
            .iter()
            .map(|p| p.req.range.end - p.req.range.start)
            .sum();
        let total = self.total_bytes();
        self.store(bytes)
            .map_err(|e| while_uploading(e, &name, done, total))?;
        self.next += 1;
        Ok(())
    }

    /// Stores the bytes of the next tensor where it goes (the size was checked).
    fn store(&mut self, bytes: &[u8]) -> Result<()> {
        let p = &self.pending[self.next];
        let name = &p.req.name;
        let g = &*self.ctx;
        match p.target {
            Target::Scale(i) => {
                let mut s = [0f32];
                quant::dequantize_row(p.ty, name, bytes, 1, 0, &mut s)?;
                self.scales[i] = s[0];
            }
            Target::Weight(i) if self.head.is_some_and(|h| h.src == i) => {
                let h = self.head.expect("checked");
                let WeightKind::Matrix { k, m, .. } = self.graph.weights[i].kind else {
                    return Err(Error::KernelArgs(format!("{name}: not a matrix")));
                };
                let mut q = vec![0u8; m * requantized_row_bytes(name, k, h.to)?];
                requantize_rows((p.ty, name), bytes, k, h.to, &mut q)?;
                self.weights[h.dst] = GpuWeight::Quant {
                    w: Some(QWeights::upload(g, name, h.to, &q, k, m, None)?),
                    scale: 1.0,
                };
                if h.dst != i {
                    self.store_weight(i, bytes)?;
                }
            }
            Target::Weight(i) => self.store_weight(i, bytes)?,
        }
        Ok(())
    }

    /// Stores the bytes of weight `i` (the next tensor) as its storage holds them.
    fn store_weight(&mut self, i: usize, bytes: &[u8]) -> Result<()> {
        let p = &self.pending[self.next];
        let name = &p.req.name;
        let g = &*self.ctx;
        match &mut self.weights[i] {
            GpuWeight::Ternary(w) => w.fill(g, name, bytes)?,
            GpuWeight::F16Rows(s) => s.write_rows(g, bytes)?,
            GpuWeight::Quant { w, .. } => {
                let WeightKind::Matrix { k, m, .. } = self.graph.weights[i].kind else {
                    return Err(Error::KernelArgs(format!("{name}: not a matrix")));
                };
                // TQ1_0 goes up as TQ2_0: the same trits, one kernel.
                *w = Some(if p.ty == GgmlType::TQ1_0 {
                    if !bytes.len().is_multiple_of(quant::tq1_0::BLOCK_BYTES) {
                        return Err(Error::KernelArgs(format!(
                            "{name}: TQ1_0 bytes not whole blocks"
                        )));
                    }
                    let tq2 = quant::tq1_0::repack_tq2_0(bytes);
                    QWeights::upload(g, name, GgmlType::TQ2_0, &tq2, k, m, None)?
                } else {
                    QWeights::upload(g, name, p.ty, bytes, k, m, None)?
                });
            }
            GpuWeight::Vector(v) => {
                let mut f = vec![0f32; p.n];
                quant::dequantize_row(p.ty, name, bytes, p.n, 0, &mut f)?;
                *v = Some(GpuBuffer::from_slice(g, name, &f)?);
            }
        }
        Ok(())
    }

    /// Compiles the plan once every tensor is in.
    pub fn finish(mut self) -> Result<GpuModel> {
        if let Some(t) = self.next_tensor() {
            return Err(Error::Request(format!(
                "upload incomplete: tensor '{}' was never given",
                t.name
            )));
        }
        for (w, s) in self.weights.iter_mut().zip(&self.scales) {
            match w {
                // Folded into the tensor scale (the CPU multiplies after; an ulp apart).
                GpuWeight::Ternary(t) => t.scale *= s,
                GpuWeight::Quant { scale, .. } => *scale = *s,
                _ => {}
            }
        }
        GpuModel::compile(self.ctx, self.cfg, &self.graph, self.weights, self.opts)
    }

    /// Uploads every tensor of a file that is wholly in memory (mapped or read).
    pub fn from_file(
        ctx: Arc<GpuContext>,
        file: &GgufFile,
        opts: GpuModelOptions,
    ) -> Result<GpuModel> {
        let mut up = Self::new(ctx, file, opts)?;
        while let Some(t) = up.next_tensor() {
            let info = file
                .tensor(&t.name)
                .ok_or_else(|| Error::Model(format!("tensor '{}' is missing", t.name)))?;
            let bytes = file.tensor_data(info);
            up.put(bytes)?;
        }
        up.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PrefillKernel;

    /// Adapter limits forced small (no adapter needed).
    fn caps(max_binding: u64, max_buffer: u64) -> Caps {
        Caps {
            f16: false,
            subgroups: false,
            subgroup_min_size: 4,
            prefill: PrefillKernel::Tiled,
            timestamps: false,
            max_binding,
            max_buffer,
            name: "test adapter".into(),
            backend: "none".into(),
            robust_buffers: false,
            sms: None,
        }
    }

    fn matrix(k: usize, m: usize) -> WeightKind {
        WeightKind::Matrix { k, m, scale: None }
    }

    #[test]
    fn weights_are_checked_against_the_adapter_limits() {
        // I2_S codes are bound whole: 256 × 768 / 4 = 49,152 bytes.
        let ffn = matrix(256, 768);
        let err = check_fits(
            "blk.0.ffn_up.weight",
            GgmlType::I2_S,
            &ffn,
            0,
            &caps(32768, 1 << 30),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("'blk.0.ffn_up.weight'") && err.contains("49152"),
            "{err}"
        );
        assert!(
            err.contains("max_storage_buffer_binding_size (32768 bytes on test adapter)")
                && err.contains("--backend cpu"),
            "{err}"
        );
        // The buffer limit counts too, and is named when it is the smaller one.
        let e = check_fits("w", GgmlType::I2_S, &ffn, 0, &caps(1 << 30, 40000)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::ExceedsLimit {
                    bytes: 49152,
                    limit: "max_buffer_size",
                    max: 40000,
                    ..
                }
            ),
            "{e}"
        );
        check_fits("w", GgmlType::I2_S, &ffn, 0, &caps(49152, 49152)).unwrap();
        // Q8_0 is split into row shards: only one row (8 blocks × 34 bytes) must fit.
        let stored = 768 * 272;
        check_fits("w", GgmlType::Q8_0, &ffn, stored, &caps(4096, 4096)).unwrap();
        let err = check_fits("w", GgmlType::Q8_0, &ffn, stored, &caps(200, 4096))
            .unwrap_err()
            .to_string();
        assert!(err.contains("(one row): 272 bytes"), "{err}");
        // TQ1_0 goes up as TQ2_0 rows (66 bytes per 256 values).
        assert!(check_fits("w", GgmlType::TQ1_0, &ffn, 0, &caps(65, 65)).is_err());
        check_fits("w", GgmlType::TQ1_0, &ffn, 0, &caps(66, 66)).unwrap();
        // Vectors are tiny; nothing to check.
        check_fits(
            "n",
            GgmlType::F32,
            &WeightKind::Vector { n: 1 << 20 },
            4 << 20,
            &caps(4, 4),
        )
        .unwrap();
    }

    #[test]
    fn allocation_failures_name_the_tensor_and_the_progress() {
        let e = while_uploading(
            Error::OutOfMemory {
                what: "creating buffer 'x'".into(),
                bytes: Some(9),
                message: "driver".into(),
            },
            "output.weight",
            1_500_000,
            3_000_000,
        );
        let msg = e.to_string();
        assert!(
            msg.contains("while uploading 'output.weight' (1.5 of 3.0 MB"),
            "{msg}"
        );
        assert!(msg.contains("out of GPU memory"), "{msg}");
        assert!(matches!(
            e.root(),
            Error::OutOfMemory { bytes: Some(9), .. }
        ));
        // Other errors pass through unchanged.
        let e = while_uploading(Error::Model("bad".into()), "w", 0, 1);
        assert!(matches!(e, Error::Model(m) if m == "bad"));
    }
}
