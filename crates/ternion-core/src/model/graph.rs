//! The forward pass as one backend-neutral list of ops.
//!
//! An architecture file builds a [`Graph`] once from the model's configuration: the weights
//! it reads (by tensor name), the activation buffers a step uses (by width), and the ops in
//! order. Every backend runs the same list: the CPU interprets it op by op, the GPU compiles
//! it once into a plan of dispatches, one builder per op.
//!
//! Fusions are ops of their own, which the architecture files call explicitly:
//! [`Op::NormLinear`], [`Op::NormQkv`] and [`Op::NormGlu`] (an RMSNorm and the projections
//! that read it; its rows are scratch, so the GPU may keep them as int8 activations only),
//! [`Op::SelfAttention`] (RoPE, KV store and attention), and [`Op::Linear`]'s `add` (the
//! residual add). The CPU runs a fused op as the primitive ops it stands for, in order; the
//! GPU picks its fused kernels from the op and its weights' formats alone, never from the
//! ops around it.
//!
//! Rows: every activation holds one row per token of the step, except the output of
//! [`Op::SelectRows`], which holds the rows whose logits were asked for (the last one, or
//! all of them).

/// Index of a weight in [`Graph::weights`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub usize);

/// Index of an activation buffer in [`Graph::acts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActId(pub usize);

/// What a weight is.
#[derive(Clone, Debug, PartialEq)]
pub enum WeightKind {
    /// A matrix `[out × in]` stored row-major in the file (ggml shape `[in, out]`), used by
    /// [`Op::Linear`] (and [`Op::Embed`] when it is the token table); `scale` names an
    /// optional 1-element tensor multiplied into the product (1bitLLM `.scale`).
    Matrix {
        /// Input width.
        k: usize,
        /// Output width.
        m: usize,
        /// Optional per-matrix output scale tensor.
        scale: Option<String>,
    },
    /// A vector of `n` values (norm weights).
    Vector {
        /// Length.
        n: usize,
    },
}

/// A weight the graph reads.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightDesc {
    /// Tensor name in the file.
    pub name: String,
    /// Shape and role.
    pub kind: WeightKind,
}

/// An activation buffer of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct ActDesc {
    /// A name for profiles and errors.
    pub name: &'static str,
    /// Values per row.
    pub width: usize,
}

/// Element-wise gate activations of gated FFNs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluAct {
    /// `relu(g)² · u` (BitNet b1.58).
    Relu2,
    /// `g / (1 + e^−g) · u` (SwiGLU; 1bitLLM BitNet).
    Silu,
    /// `gelu_tanh(g) · u` (GEGLU; Gemma 3). The CPU reads GELU from ggml's F16 table, as
    /// [`UnaryAct::GeluTanh`] does.
    GeluTanh,
}

/// Element-wise activations of [`Op::Act`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryAct {
    /// GELU, tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (GPT-2).
    /// The CPU follows ggml's kernel, which reads an F16 table indexed by the F16-rounded
    /// input (0 below −10, identity above 10); another backend may compute it in f32
    /// (differences ≲ 1e-3 per element).
    GeluTanh,
}

/// How [`Op::SelfAttention`] pairs the rotated dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// GPT-NeoX / ggml `NEOX`: dimension i pairs with i + n_rot/2 (BitNet, Phi-3).
    Neox,
    /// ggml `NORM` (original LLaMA layout): dimension 2i pairs with 2i + 1 (llama).
    Norm,
}

/// The RMSNorm a projection op applies to its input first: `rmsnorm(x) · w`, with the
/// graph's [`Graph::rms_eps`], into `scratch`. The scratch holds nothing after the op: a
/// backend may keep the normalised rows in another form (the GPU's int8 activations of an
/// I2_S matvec), so no later op reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InNorm {
    /// Norm weight (vector).
    pub w: WeightId,
    /// Rows of the normalised input (the input's width).
    pub scratch: ActId,
}

/// One op of the forward pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `out[t]` = row `token[t]` of the `table` matrix, as f32.
    Embed {
        /// Token table (a [`WeightKind::Matrix`] with k = width, m = vocabulary).
        table: WeightId,
        /// Destination.
        out: ActId,
    },
    /// `out = rmsnorm(x) · w`.
    RmsNorm {
        /// Input.
        x: ActId,
        /// Norm weight (vector).
        w: WeightId,
        /// Destination (may not be `x`).
        out: ActId,
    },
    /// `out = W · x`, or `out += W · x` when `add` (the residual add fused).
    Linear {
        /// Weight matrix.
        w: WeightId,
        /// Input.
        x: ActId,
        /// Destination.
        out: ActId,
        /// Accumulate into `out` instead of overwriting it.
        add: bool,
    },
    /// Self-attention of `layer`: RoPE of `q` and `k` in place at the step's positions
    /// (when `rope`: the pairing is [`AttnGeometry::rope_mode`], the frequencies
    /// `pos·base^(−2i/n_rot)` with the base [`AttnGeometry::rope_base_of`], each divided by
    /// factor i of [`AttnGeometry::rope_freqs`] when present), then the step's `k` and `v`
    /// rows appended to the layer's cache, then `out` = attention of `q` over the cache:
    /// causal, or over the whole step when [`AttnGeometry::causal`] is false; limited to
    /// the layer's window when [`AttnGeometry::window_of`] gives one.
    SelfAttention {
        /// Layer index.
        layer: usize,
        /// Whether `q` and `k` are rotated first.
        rope: bool,
        /// Query rows (n_head heads).
        q: ActId,
        /// Key rows (n_head_kv heads).
        k: ActId,
        /// Value rows.
        v: ActId,
        /// Destination (head outputs concatenated).
        out: ActId,
    },
    /// `out = W · (rmsnorm(x) · norm.w)`, or `out +=` when `add`: a projection of a
    /// normalised input.
    NormLinear {
        /// Input (before the norm).
        x: ActId,
        /// The input norm.
        norm: InNorm,
        /// Weight matrix.
        w: WeightId,
        /// Destination.
        out: ActId,
        /// Accumulate into `out` instead of overwriting it.
        add: bool,
    },
    /// `h = rmsnorm(x) · norm.w; out[i] = W[i] · h` for the query, key and value
    /// projections `i` = 0, 1, 2.
    NormQkv {
        /// Input (before the norm).
        x: ActId,
        /// The input norm.
        norm: InNorm,
        /// Q, K and V matrices.
        w: [WeightId; 3],
        /// Q, K and V destinations.
        out: [ActId; 3],
    },
    /// The gated half of an FFN: `h = rmsnorm(x) · norm.w; gate = act(W_gate·h) · (W_up·h)`.
    NormGlu {
        /// Input (before the norm).
        x: ActId,
        /// The input norm.
        norm: InNorm,
        /// Gate activation.
        act: GluAct,
        /// Gate and up matrices.
        w: [WeightId; 2],
        /// Destination (the gated product).
        gate: ActId,
        /// Scratch for the up projection.
        up: ActId,
    },
    /// `gate = act(gate) · up`.
    Glu {
        /// Activation.
        act: GluAct,
        /// Gate in, result out.
        gate: ActId,
        /// Up projection.
        up: ActId,
    },
    /// `out = (x − mean(x)) / √(var(x) + eps) · w + b` per row (LayerNorm with bias; the
    /// variance is the biased one, as in ggml `norm`).
    LayerNorm {
        /// Input.
        x: ActId,
        /// Scale (vector).
        w: WeightId,
        /// Bias (vector).
        b: WeightId,
        /// Epsilon (`{arch}.attention.layer_norm_epsilon`).
        eps: f32,
        /// Destination (may not be `x`).
        out: ActId,
    },
    /// `x[t] += b` for every row `t` (the bias of a linear layer; `b` has `x`'s width).
    AddBias {
        /// Rows updated in place.
        x: ActId,
        /// Bias (vector).
        b: WeightId,
    },
    /// `x = act(x)` element-wise, in place.
    Act {
        /// The activation.
        act: UnaryAct,
        /// Rows updated in place.
        x: ActId,
    },
    /// `x[t] += table[pos0 + t]`: learned absolute position embeddings (GPT-2), at the
    /// step's positions. `table` is a [`WeightKind::Matrix`] with k = width and m = the
    /// number of positions; a position past m is an error.
    AddPosEmbed {
        /// Position table.
        table: WeightId,
        /// Rows updated in place.
        x: ActId,
    },
    /// `out[t] = x[t][start .. start + width(out)]`: a column slice of each row. Splits the
    /// output of a fused projection (Q | K | V, gate | up) into its parts; the fused matrix
    /// stays one [`Op::Linear`] so its weight is read once.
    Slice {
        /// Input.
        x: ActId,
        /// First column taken.
        start: usize,
        /// Destination (its width is the slice's width).
        out: ActId,
    },
    /// `out = rmsnorm(x) · w` over each head of `x` separately: `w` has one head's width
    /// and `x`'s width is a multiple of it (Qwen3 and Gemma 3 q/k norms).
    HeadRmsNorm {
        /// Input.
        x: ActId,
        /// Norm weight of one head (vector).
        w: WeightId,
        /// Destination (may not be `x`).
        out: ActId,
    },
    /// `x = x · s` element-wise, in place (Gemma 3's embedding × √n_embd).
    Scale {
        /// Rows updated in place.
        x: ActId,
        /// The factor.
        s: f32,
    },
    /// `x += y` element-wise (a residual add of a normed branch; same widths).
    Add {
        /// Rows updated in place.
        x: ActId,
        /// Added rows.
        y: ActId,
    },
    /// `x = cap · tanh(x / cap)` element-wise, in place (logit soft-capping).
    SoftCap {
        /// Rows updated in place.
        x: ActId,
        /// The cap.
        cap: f32,
    },
    /// `out` = the rows of `x` whose logits were asked for.
    SelectRows {
        /// Input (one row per token).
        x: ActId,
        /// Destination (one row per selected token).
        out: ActId,
    },
}

impl Op {
    /// A name for profiles, the same for every layer's instance of the op: what it does and
    /// the weights of its products by tensor name without the layer (`blk.N.`) and the
    /// `.weight` suffix, e.g. `norm + attn_q, attn_k, attn_v` or `output`.
    pub fn label(&self, weights: &[WeightDesc]) -> String {
        let kind = match self {
            Op::Embed { .. } => "embed",
            Op::RmsNorm { .. } => "rms norm",
            Op::Linear { .. } => "",
            Op::NormLinear { .. } | Op::NormQkv { .. } => "norm + ",
            Op::NormGlu { .. } => "norm + glu of ",
            Op::SelfAttention { .. } => "attention (rope, kv store)",
            Op::LayerNorm { .. } => "layer norm",
            Op::AddBias { .. } => "bias",
            Op::Act { .. } => "activation",
            Op::AddPosEmbed { .. } => "position embedding",
            Op::Slice { .. } => "slice",
            Op::Glu { .. } => "glu",
            Op::HeadRmsNorm { .. } => "head rms norm",
            Op::Scale { .. } => "scale",
            Op::Add { .. } => "residual add",
            Op::SoftCap { .. } => "soft cap",
            Op::SelectRows { .. } => "select rows",
        };
        let names: Vec<&str> = self
            .products()
            .into_iter()
            .map(|(w, _)| {
                let name = weights.get(w.0).map_or("?", |d| d.name.as_str());
                let name = name.strip_suffix(".weight").unwrap_or(name);
                match name.strip_prefix("blk.") {
                    Some(rest) => rest.split_once('.').map_or(rest, |(_, n)| n),
                    None => name,
                }
            })
            .collect();
        format!("{kind}{}", names.join(", "))
    }

    /// The matrix products of this op, as (weight, destination) pairs.
    pub fn products(&self) -> Vec<(WeightId, ActId)> {
        match *self {
            Op::Linear { w, out, .. } | Op::NormLinear { w, out, .. } => vec![(w, out)],
            Op::NormQkv { w, out, .. } => w.into_iter().zip(out).collect(),
            Op::NormGlu { w, gate, up, .. } => vec![(w[0], gate), (w[1], up)],
            _ => Vec::new(),
        }
    }
}

/// RoPE and attention geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnGeometry {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Head width.
    pub head_dim: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// Pairing of rotated dimensions.
    pub rope_mode: RopeMode,
    /// Optional per-pair frequency divisors (a vector of n_rot/2 values: `rope_freqs.weight`).
    pub rope_freqs: Option<WeightId>,
    /// Sliding-window layers, when the architecture has them (Gemma 3).
    pub sliding: Option<SlidingWindow>,
    /// Whether a token sees only the positions up to its own (`false`: every position of
    /// its step and before; embedding models with `attention.causal = false`).
    pub causal: bool,
}

/// Layers whose attention sees only the last `window` positions (the query's included),
/// with a RoPE base of their own.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a query sees, itself included.
    pub window: usize,
    /// RoPE base of the local layers.
    pub rope_base: f32,
    /// Whether layer i is local.
    pub local: Vec<bool>,
}

impl AttnGeometry {
    fn local(&self, layer: usize) -> Option<&SlidingWindow> {
        self.sliding
            .as_ref()
            .filter(|s| s.local.get(layer).copied().unwrap_or(false))
    }

    /// The RoPE base of `layer`.
    pub fn rope_base_of(&self, layer: usize) -> f32 {
        self.local(layer).map_or(self.rope_base, |s| s.rope_base)
    }

    /// The attention window of `layer` (`None`: the whole cache).
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        self.local(layer).map(|s| s.window)
    }
}

/// The forward pass of one architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// Weights read, by tensor name.
    pub weights: Vec<WeightDesc>,
    /// Activation buffers.
    pub acts: Vec<ActDesc>,
    /// Ops in execution order.
    pub ops: Vec<Op>,
    /// Attention geometry.
    pub attn: AttnGeometry,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Layers with a KV cache.
    pub n_layer: usize,
    /// The activation that holds the logits at the end of a step.
    pub logits: ActId,
}

/// Incremental construction of a [`Graph`].
#[derive(Default)]
pub struct Builder {
    weights: Vec<WeightDesc>,
    acts: Vec<ActDesc>,
    ops: Vec<Op>,
}

impl Builder {
    /// Declares a weight.
    pub fn weight(&mut self, name: impl Into<String>, kind: WeightKind) -> WeightId {
        self.weights.push(WeightDesc {
            name: name.into(),
            kind,
        });
        WeightId(self.weights.len() - 1)
    }

    /// Declares a matrix `[m × k]` without an output scale.
    pub fn matrix(&mut self, name: impl Into<String>, k: usize, m: usize) -> WeightId {
        self.weight(name, WeightKind::Matrix { k, m, scale: None })
    }

    /// Declares a vector of `n` values.
    pub fn vector(&mut self, name: impl Into<String>, n: usize) -> WeightId {
        self.weight(name, WeightKind::Vector { n })
    }

    /// Declares an activation buffer.
    pub fn act(&mut self, name: &'static str, width: usize) -> ActId {
        self.acts.push(ActDesc { name, width });
        ActId(self.acts.len() - 1)
    }

    /// The width of activation `a`.
    pub fn width(&self, a: ActId) -> usize {
        self.acts[a.0].width
    }

    /// Appends an op.
    pub fn op(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// `out = W · x` (or `out += W · x` when `add`).
    pub fn linear(&mut self, w: WeightId, x: ActId, out: ActId, add: bool) {
        self.op(Op::Linear { w, x, out, add });
    }

    /// `out = rmsnorm(x) · w`.
    pub fn rms_norm(&mut self, x: ActId, w: WeightId, out: ActId) {
        self.op(Op::RmsNorm { x, w, out });
    }

    /// `out (+)= W · (rmsnorm(x) · norm)`, through `scratch` ([`Op::NormLinear`]).
    pub fn norm_linear(
        &mut self,
        (x, norm, scratch): (ActId, WeightId, ActId),
        w: WeightId,
        out: ActId,
        add: bool,
    ) {
        let norm = InNorm { w: norm, scratch };
        self.op(Op::NormLinear {
            x,
            norm,
            w,
            out,
            add,
        });
    }

    /// q, k, v = `W_q·h, W_k·h, W_v·h` with `h = rmsnorm(x) · norm` ([`Op::NormQkv`]).
    pub fn norm_qkv(
        &mut self,
        (x, norm, scratch): (ActId, WeightId, ActId),
        w: [WeightId; 3],
        out: [ActId; 3],
    ) {
        let norm = InNorm { w: norm, scratch };
        self.op(Op::NormQkv { x, norm, w, out });
    }

    /// The gated FFN's first half: `gate = act(W_gate·h) · (W_up·h)` with
    /// `h = rmsnorm(x) · norm` ([`Op::NormGlu`]).
    pub fn norm_glu(
        &mut self,
        (x, norm, scratch): (ActId, WeightId, ActId),
        act: GluAct,
        w: [WeightId; 2],
        (gate, up): (ActId, ActId),
    ) {
        let norm = InNorm { w: norm, scratch };
        self.op(Op::NormGlu {
            x,
            norm,
            act,
            w,
            gate,
            up,
        });
    }

    /// `out = rmsnorm(x) · w` over each head of `x` (`w` has one head's width).
    pub fn head_rms_norm(&mut self, x: ActId, w: WeightId, out: ActId) {
        self.op(Op::HeadRmsNorm { x, w, out });
    }

    /// `out = attention(q, cache of layer)` after RoPE of `q`, `k` (when `rope`) and the
    /// store of `k`, `v` ([`Op::SelfAttention`]).
    pub fn attention(&mut self, (layer, rope): (usize, bool), [q, k, v]: [ActId; 3], out: ActId) {
        self.op(Op::SelfAttention {
            layer,
            rope,
            q,
            k,
            v,
            out,
        });
    }

    /// Finishes the graph.
    pub fn finish(self, attn: AttnGeometry, rms_eps: f32, n_layer: usize, logits: ActId) -> Graph {
        Graph {
            weights: self.weights,
            acts: self.acts,
            ops: self.ops,
            attn,
            rms_eps,
            n_layer,
            logits,
        }
    }
}
