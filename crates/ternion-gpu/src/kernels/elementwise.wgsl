// elementwise.wgsl — the per-head and element-wise ops of the Qwen3 / Gemma 3 graphs
// (model/graph.rs): per-head RMSNorm, scale, residual add, logit soft-capping; and the per-token int8 absmax
// quantization of an I2_S matmul's input that no RMSNorm feeds (llama + I2_S, Falcon3-1.58).
// One entry point per op.
//
// Bindings (group 0; each entry point binds only those it uses):
//   0 uniform Params { n, hd, s, eps }: row width n; head_rmsnorm: head width hd and eps
//                     (f32 bits); scale: the factor s (f32 bits); softcap: the cap s
//   1 storage rw    x:   array<f32>   T × n rows (in place for scale, add and softcap)
//   2 storage read  y:   array<f32>   add: T × n rows; head_rmsnorm: hd f32 weights
//   3 storage rw    out: array<f32>   head_rmsnorm: T × n rows
//   4 storage rw    qout: array<u32>  quant_i8: T × n/4 words of packed int8 (element 4i+b in
//                                     byte b of word i), as rmsnorm.wgsl's rmsnorm_quant
//   5 storage rw    qmeta: array<vec2<u32>>  quant_i8: per token (f32 bits of the scale s,
//                                     i32 bits of Σq)
// Dispatch:
//   scale, add, softcap (ceil(n / 256), T, 1): a thread per element
//   head_rmsnorm   (n / hd, T, 1): a workgroup of 64 per head
//   quant_i8       (1, T, 1): one workgroup per token (tree max and sum in shared memory)
// Numerics against backend/cpu (norm.rs): the CPU sums squares in f64, this kernel in f32
// (64 strided partial sums, then a tree),
// and WGSL's sqrt/division are not correctly rounded: |Δ| ≲ 1e-6 relative. scale and add
// are exact. softcap: x = tanh(x / s) · s with WGSL's tanh (the CPU uses libm's tanhf: a
// few ulp apart). quant_i8 (quant/act.rs quantize_per_token): s = 127/max(max|x|, 1e-5)
// correctly rounded (div_rn, common.wgsl), q = clamp(round_half_even(x·s), −128, 127):
// bit-exact.

const WG: u32 = 256u;

struct Params { n: u32, hd: u32, s: f32, eps: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read_write> qout: array<u32>;
@group(0) @binding(5) var<storage, read_write> qmeta: array<vec2<u32>>;

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_i: array<i32, WG>;

@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    x[i] = x[i] * p.s;
}

@compute @workgroup_size(256)
fn softcap(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    x[i] = tanh(x[i] / p.s) * p.s;
}

@compute @workgroup_size(256)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    x[i] = x[i] + y[i];
}

// One workgroup of HW threads per (head, token): lanes stride the head's values, their
// squares summed by a tree in shared memory.
const HW: u32 = 64u;

@compute @workgroup_size(HW)
fn head_rmsnorm(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.y * p.n + wg.x * p.hd;
    var sum = 0.0;
    for (var i = li; i < p.hd; i += HW) {
        let v = x[base + i];
        sum += v * v;
    }
    red_f[li] = sum;
    workgroupBarrier();
    for (var w = HW / 2u; w > 0u; w = w / 2u) {
        if (li < w) {
            red_f[li] = red_f[li] + red_f[li + w];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red_f[0] / f32(p.hd) + p.eps);
    for (var i = li; i < p.hd; i += HW) {
        out[base + i] = (x[base + i] * inv) * y[i];
    }
}

@compute @workgroup_size(256)
fn quant_i8(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.y * p.n;
    var m = 0.0;
    for (var i = li; i < p.n; i += WG) {
        m = max(m, abs(x[base + i]));
    }
    red_f[li] = m;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (li < w) {
            red_f[li] = max(red_f[li], red_f[li + w]);
        }
        workgroupBarrier();
    }
    var s = 12700000.0;
    if (red_f[0] > 1e-5) {
        s = div_rn(127.0, red_f[0]);
    }
    var qs = 0;
    for (var i = li * 4u; i < p.n; i += WG * 4u) {
        let v = vec4<f32>(x[base + i], x[base + i + 1u], x[base + i + 2u], x[base + i + 3u]);
        let q = vec4<i32>(clamp(round(v * s), vec4<f32>(-128.0), vec4<f32>(127.0)));
        qs += q.x + q.y + q.z + q.w;
        qout[(base + i) / 4u] = pack4xI8(q);
    }
    red_i[li] = qs;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (li < w) {
            red_i[li] = red_i[li] + red_i[li + w];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        qmeta[wg.y] = vec2<u32>(bitcast<u32>(s), bitcast<u32>(red_i[0]));
    }
}
