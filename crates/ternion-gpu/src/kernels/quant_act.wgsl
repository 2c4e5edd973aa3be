// quant_act.wgsl — ggml's activation quantizers, the input of the block-quantized matmuls
// (qmatvec.wgsl), as the format registry pairs them (quant/format.rs `RefDot`): Q8_0,
// Q8_1 and Q8_K. Bit-exact ports of quant/act.rs.
//
// Bindings (group 0):
//   0 uniform Params { k, _, _, _ }   row width (a multiple of the block: 32 or 256)
//   1 storage read  x: array<f32>     T × k activations
//   2 storage rw    q: array<u32>     T × k/4 words of packed int8 (element 4i+b in byte b
//                                     of word i, the dot4I8Packed order)
//   3 storage rw    d: array<f32>     T × k/BLOCK block scales (Q8_0: the scale rounded
//                                     through F16, as stored in a Q8_0 block; Q8_K: f32);
//                                     Q8_1: T × k/32 pairs (d as Q8_0, s)
// Dispatch: (ceil(k / 256), T, 1). Thread li of workgroup g handles element 256g + li of
// token row wg.y: `q8_0` reduces |x| over groups of 32 lanes (8 blocks per workgroup),
// `q8_k` over the whole workgroup (one block); `q8_1` as `q8_0`, then Σq over the 32 lanes.
//
// Numerics (quant/act.rs):
// - Q8_0: d = amax/127, id = 1/d (0 when d = 0), q = round-half-away(x·id); d is stored
//   rounded to F16 (RNE in integer arithmetic, common.wgsl).
// - Q8_1: Q8_0's q and d, and s = F16(f32(Σq)·scale) with the scale before F16 rounding.
// - Q8_K: max = the first element of largest |x| (sign kept; ties → lowest index), iscale =
//   −127/max, q = min(127, round-half-even(iscale·x)), d = 1/iscale; d = 0, q = 0 for an
//   all-zero block.
// - Divisions use div_rn (common.wgsl): correctly rounded like the CPU's, unlike WGSL `/`.
//   Products are single f32 multiplications, correctly rounded on every WebGPU backend.

const WG: u32 = 256u;

struct Params { k: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> q: array<u32>;
@group(0) @binding(3) var<storage, read_write> d: array<f32>;

var<workgroup> red_a: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> qv: array<u32, WG>;

// Round half away from zero (Rust's f32::round); x − trunc(x) is exact.
fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    if (abs(v - t) >= 0.5) {
        return t + sign(v);
    }
    return t;
}

// Stores this thread's int8 `v` and packs the workgroup's 256 values into 64 words.
fn pack_store(li: u32, e0: u32, row: u32, v: i32) {
    qv[li] = u32(v) & 0xffu;
    workgroupBarrier();
    if (li < WG / 4u && e0 + 4u * li < p.k) {
        let b = 4u * li;
        q[(row * p.k + e0) / 4u + li] = qv[b] | (qv[b + 1u] << 8u) | (qv[b + 2u] << 16u) | (qv[b + 3u] << 24u);
    }
}

// Q8_0 of this thread's element (0 past the row end): returns (q, scale before rounding).
fn q8_0_elem(li: u32, e: u32, row: u32) -> vec2<f32> {
    var v = 0.0;
    if (e < p.k) {
        v = x[row * p.k + e];
    }
    // amax over this lane's block of 32 (max is exact in any order).
    red_a[li] = abs(v);
    workgroupBarrier();
    for (var o = 16u; o > 0u; o >>= 1u) {
        if ((li & 31u) < o) {
            red_a[li] = max(red_a[li], red_a[li + o]);
        }
        workgroupBarrier();
    }
    let amax = red_a[li & ~31u];
    let scale = div_rn(amax, 127.0);
    var id = 0.0;
    if (scale != 0.0) {
        id = div_rn(1.0, scale);
    }
    return vec2<f32>(clamp(round_away(v * id), -128.0, 127.0), scale);
}

@compute @workgroup_size(256)
fn q8_0(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let e0 = wg.x * WG;
    let e = e0 + li;
    let r = q8_0_elem(li, e, row);
    if ((li & 31u) == 0u && e < p.k) {
        d[(row * p.k + e) / 32u] = round_f16(r.y);
    }
    pack_store(li, e0, row, i32(r.x));
}

@compute @workgroup_size(256)
fn q8_1(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let e0 = wg.x * WG;
    let e = e0 + li;
    let r = q8_0_elem(li, e, row);
    // Σq over this lane's block of 32 (integer, exact in any order).
    red_i[li] = bitcast<u32>(i32(r.x));
    workgroupBarrier();
    for (var o = 16u; o > 0u; o >>= 1u) {
        if ((li & 31u) < o) {
            red_i[li] = bitcast<u32>(bitcast<i32>(red_i[li]) + bitcast<i32>(red_i[li + o]));
        }
        workgroupBarrier();
    }
    if ((li & 31u) == 0u && e < p.k) {
        let b = (row * p.k + e) / 32u;
        d[2u * b] = round_f16(r.y);
        d[2u * b + 1u] = round_f16(f32(bitcast<i32>(red_i[li])) * r.y);
    }
    pack_store(li, e0, row, i32(r.x));
}

@compute @workgroup_size(256)
fn q8_k(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let row = wg.y;
    let e0 = wg.x * WG;
    let v = x[row * p.k + e0 + li];
    // (|x|, index) of the first largest |x|.
    red_a[li] = abs(v);
    red_i[li] = li;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            let a = red_a[li + o];
            if (a > red_a[li] || (a == red_a[li] && red_i[li + o] < red_i[li])) {
                red_a[li] = a;
                red_i[li] = red_i[li + o];
            }
        }
        workgroupBarrier();
    }
    let amax = red_a[0];
    let mx = x[row * p.k + e0 + red_i[0]];
    var qi = 0;
    var scale = 0.0;
    if (amax != 0.0) {
        let iscale = div_rn(-127.0, mx);
        qi = i32(clamp(round(iscale * v), -128.0, 127.0));
        scale = div_rn(1.0, iscale);
    }
    if (li == 0u) {
        d[(row * p.k + e0) / WG] = scale;
    }
    pack_store(li, e0, row, qi);
}
