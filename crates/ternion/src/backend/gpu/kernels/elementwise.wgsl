// elementwise.wgsl — the per-head and element-wise ops of the Qwen3 / Gemma 3 graphs
// (model/graph.rs): per-head RMSNorm, scale, residual add. One entry point per op.
//
// Bindings (group 0; each entry point binds only those it uses):
//   0 uniform Params { n, hd, s, eps }: row width n; head_rmsnorm: head width hd and eps
//                     (f32 bits); scale: the factor s (f32 bits)
//   1 storage rw    x:   array<f32>   T × n rows (in place for scale and add)
//   2 storage read  y:   array<f32>   add: T × n rows; head_rmsnorm: hd f32 weights
//   3 storage rw    out: array<f32>   head_rmsnorm: T × n rows
// Dispatch:
//   scale, add     (ceil(n / 256), T, 1): a thread per element
//   head_rmsnorm   (ceil(n / hd / 256), T, 1): a thread per head, summing its hd squares
// Numerics against backend/cpu (norm.rs): the CPU sums squares in f64, this kernel in f32,
// and WGSL's sqrt/division are not correctly rounded: |Δ| ≲ 1e-6 relative. scale and add
// are exact.

const WG: u32 = 256u;

struct Params { n: u32, hd: u32, s: f32, eps: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    x[i] = x[i] * p.s;
}

@compute @workgroup_size(256)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    x[i] = x[i] + y[i];
}

@compute @workgroup_size(256)
fn head_rmsnorm(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n_heads = p.n / p.hd;
    if (gid.x >= n_heads) {
        return;
    }
    let base = gid.y * p.n + gid.x * p.hd;
    var sum = 0.0;
    for (var i = 0u; i < p.hd; i = i + 1u) {
        let v = x[base + i];
        sum = sum + v * v;
    }
    let inv = 1.0 / sqrt(sum / f32(p.hd) + p.eps);
    for (var i = 0u; i < p.hd; i = i + 1u) {
        out[base + i] = (x[base + i] * inv) * y[i];
    }
}
