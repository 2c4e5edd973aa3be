// rowops.wgsl — the row and element-wise ops of the GPT-2 / Phi-3 / Llama graphs
// (model/graph.rs): LayerNorm with bias, bias add, GELU (tanh form) in place, learned
// position embeddings, column slices and the last-row select. One entry point per op.
//
// Bindings (group 0; each entry point binds only those it uses):
//   0 uniform Params { n, m, start, eps }: input row width n; `slice`: output width m and
//                     first column `start`; `add_pos`: m = positions in the table, start =
//                     1 for an F16 table, 0 for f32; `layernorm`: eps (f32 bits)
//   1 uniform Step { n_tokens, .. }        add_pos, select_last
//   2 storage rw    x:   array<f32>   T × n rows (in place for add_bias, gelu, add_pos)
//   3 storage read  a:   array<u32>   layernorm: n f32 weights; add_bias: n f32 biases;
//                                     add_pos: m × n table rows (f32, or F16 two per word,
//                                     element 2i in the low half)
//   4 storage read  b:   array<f32>   layernorm: n biases
//   5 storage rw    out: array<f32>   layernorm: T × n; slice: T × m; select_last: n;
//                                     gather: R × n
//   6 storage read  toks: array<vec2<u32>>  add_pos: T × (position, sequence slot)
//   7 storage read  picks: array<u32>  gather: R row indices into x
// Dispatch:
//   layernorm   (T, 1, 1): one workgroup per row (tree sums in shared memory)
//   add_bias, gelu, add_pos, slice: (ceil(width / 256), T, 1), a thread per element
//   select_last (ceil(n / 256), 1, 1): row n_tokens − 1 of x into out
//   gather      (ceil(n / 256), R, 1): out row r = x row picks[r] (low 31 bits); with m = 1
//               a row whose pick has the top bit set is rounded to F16 (the decode
//               numerics of an F16 LM head, for a sequence's single-token step)
// `add_pos` skips rows whose position is past the table (the host rejects such steps).
//
// Numerics against backend/cpu (norm.rs, unary.rs):
// - layernorm: f32 tree sums where the CPU sums in f64, and WGSL sqrt/division (not
//   correctly rounded): |Δ| ≲ 1e-6·|y| relative to the normalised values.
// - gelu: the CPU reads ggml's F16 table (F16 input → F16 output). This kernel rounds the
//   input to F16, evaluates 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))) in f32 (tanh from
//   exp, WGSL exp is not correctly rounded) and rounds the result to F16: equal to the table
//   or one F16 ulp away near a rounding boundary, except where 1 + tanh cancels (x < −4,
//   outputs below ~1e-5 in magnitude, where the table itself is a few % off the exact
//   value): there within 1e-6 absolute. 0 for x ≤ −10 and x for x ≥ 10, like ggml.
// - add_bias, add_pos, slice, select_last, gather: exact (gather's rounding is RNE).

const WG: u32 = 256u;

struct Params { n: u32, m: u32, start: u32, eps: f32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read> a: array<u32>;
@group(0) @binding(4) var<storage, read> b: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(7) var<storage, read> picks: array<u32>;

var<workgroup> red: array<f32, WG>;

fn sum_wg(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            red[li] = red[li] + red[li + o];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn layernorm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.n;
    var s = 0.0;
    for (var i = li; i < p.n; i += WG) {
        s += x[base + i];
    }
    let mean = sum_wg(s, li) / f32(p.n);
    var s2 = 0.0;
    for (var i = li; i < p.n; i += WG) {
        let y = x[base + i] - mean;
        s2 += y * y;
    }
    let var_ = sum_wg(s2, li) / f32(p.n);
    let scale = 1.0 / sqrt(var_ + p.eps);
    for (var i = li; i < p.n; i += WG) {
        out[base + i] = ((x[base + i] - mean) * scale) * bitcast<f32>(a[i]) + b[i];
    }
}

@compute @workgroup_size(256)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        let i = gid.y * p.n + gid.x;
        x[i] = x[i] + bitcast<f32>(a[gid.x]);
    }
}

@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    x[i] = gelu_ggml(x[i]);
}

@compute @workgroup_size(256)
fn add_pos(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n || gid.y >= step.n_tokens) {
        return;
    }
    let pos = toks[gid.y].x;
    if (pos >= p.m) {
        return;
    }
    let e = pos * p.n + gid.x;
    var t: f32;
    if (p.start == 1u) {
        t = unpack2x16float(a[e / 2u] >> (16u * (e % 2u))).x;
    } else {
        t = bitcast<f32>(a[e]);
    }
    let i = gid.y * p.n + gid.x;
    x[i] = x[i] + t;
}

@compute @workgroup_size(256)
fn slice(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.m) {
        out[gid.y * p.m + gid.x] = x[gid.y * p.n + p.start + gid.x];
    }
}

@compute @workgroup_size(256)
fn select_last(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        out[gid.x] = x[(step.n_tokens - 1u) * p.n + gid.x];
    }
}

@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        let pk = picks[gid.y];
        let v = x[(pk & 0x7fffffffu) * p.n + gid.x];
        if (p.m == 1u && pk >= 0x80000000u) {
            out[gid.y * p.n + gid.x] = round_f16(v);
        } else {
            out[gid.y * p.n + gid.x] = v;
        }
    }
}
