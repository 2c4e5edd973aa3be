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
use super::context::GpuContext;
use super::exec::{GpuModel, GpuModelOptions};
use super::ops::TernaryWeights;
use crate::gguf::GgufFile;
use crate::model::graph::{Graph, WeightKind};
use crate::model::{self, Config};
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
    /// F16 rows (the embedding table, an F16 LM head), sharded to fit bindings.
    F16Rows(Sharded),
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
}

fn storage(
    ctx: &GpuContext,
    name: &str,
    ty: GgmlType,
    kind: &WeightKind,
) -> Result<(GpuWeight, usize)> {
    match *kind {
        WeightKind::Vector { n } => Ok((GpuWeight::Vector(None), n)),
        WeightKind::Matrix { k, m, .. } => match ty {
            GgmlType::I2_S => Ok((
                GpuWeight::Ternary(TernaryWeights::zeroed(ctx, name, k, m)?),
                k * m,
            )),
            GgmlType::F16 => Ok((
                GpuWeight::F16Rows(Sharded::zeroed(ctx, name, m, k * 2, None)?),
                k * m,
            )),
            other => Err(Error::Gpu(format!(
                "tensor '{name}' is {}: the GPU backend has no kernel for it in this build \
                 (use --backend cpu)",
                other.name()
            ))),
        },
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
        let graph = model::graph_for(&cfg, header);
        let info = |name: &str| {
            header
                .tensor(name)
                .ok_or_else(|| Error::Model(format!("tensor '{name}' is missing")))
        };
        let mut weights = Vec::with_capacity(graph.weights.len());
        let mut pending = Vec::new();
        for (i, w) in graph.weights.iter().enumerate() {
            let t = info(&w.name)?;
            let (weight, n) = storage(&ctx, &w.name, t.ty, &w.kind)?;
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
            return Err(Error::Gpu("upload: every tensor is already in".into()));
        };
        let name = &p.req.name;
        let want = p.req.range.end - p.req.range.start;
        if bytes.len() as u64 != want {
            return Err(Error::Gpu(format!(
                "upload of '{name}': {} bytes given, the file says {want}",
                bytes.len()
            )));
        }
        let g = &*self.ctx;
        match p.target {
            Target::Scale(i) => {
                let mut s = [0f32];
                quant::dequantize_row(p.ty, name, bytes, 1, 0, &mut s)?;
                self.scales[i] = s[0];
            }
            Target::Weight(i) => match &mut self.weights[i] {
                GpuWeight::Ternary(w) => w.fill(g, name, bytes)?,
                GpuWeight::F16Rows(s) => s.write_rows(g, bytes)?,
                GpuWeight::Vector(v) => {
                    let mut f = vec![0f32; p.n];
                    quant::dequantize_row(p.ty, name, bytes, p.n, 0, &mut f)?;
                    *v = Some(GpuBuffer::from_slice(g, name, &f)?);
                }
            },
        }
        self.next += 1;
        Ok(())
    }

    /// Compiles the plan once every tensor is in.
    pub fn finish(mut self) -> Result<GpuModel> {
        if let Some(t) = self.next_tensor() {
            return Err(Error::Gpu(format!(
                "upload incomplete: tensor '{}' was never given",
                t.name
            )));
        }
        for (w, s) in self.weights.iter_mut().zip(&self.scales) {
            if let GpuWeight::Ternary(t) = w {
                // Folded into the tensor scale (the CPU multiplies after; an ulp apart).
                t.scale *= s;
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
