// f16_matvec.wgsl — F16 weight rows × f32 hidden state → f32 (the tied LM head), one
// shard of rows per dispatch (buffers.rs `Sharded`).
//
// Bindings (group 0):
//   0 uniform Params { rows, k, row0, out_stride }: rows in this shard, row width (multiple
//                     of 4), first output column of the shard, output row stride (vocab)
//   1 storage read  w:   this shard's rows, row-major F16 as in the file: vec4<f16> (variant
//                        F16) or vec2<u32> unpacked with unpack2x16float
//   2 storage read  x:   array<vec4<f32>>  T × k hidden states
//   3 storage rw    out: array<f32>        T × out_stride logits; writes row0 .. row0+rows
//   4 uniform Step { n_tokens, .. }        entries `last` and `main8`
// Entry points: `main` multiplies every token row t into output row t; `last` multiplies only
// the last token's row (t = n_tokens − 1 from the step uniform) into output row 0 (the
// logits of a prompt's last position without a copy between passes).
// Entry `main8` does eight token rows per workgroup (weights read once per eight tokens).
// Entry `decode` (one token, k ≤ 4·DECODE_K4) holds the (rounded) hidden state in workgroup
// memory once for DECODE_ROWS rows, each warp-sized row group walking two rows at a time
// (rows r and r + DECODE_ROWS/2) with four weight loads of each in flight (one row at a
// time read the LM head at 2.5 TB/s on an H100, two at 2.9); every row's sum is `main`'s,
// in the same order (bit-identical).
// Dispatch: main (ceil(rows / (256/TPR)), T, 1), decode (ceil(rows / DECODE_ROWS), 1, 1), last (ceil(rows / (256/TPR)), 1, 1),
// main8 (ceil(rows / (256/TPR)), ceil(T / 8), 1) per shard. TPR lanes per row, reduced by
// subgroupShuffleXor (SUBGROUPS) or shared memory, like ternary.wgsl.
// Numerics: f32 accumulation in a different order than the CPU's; ROUND_X rounds the hidden
// state through F16 first (the reference does this for single-token decode).
#if F16
enable f16;
#endif

override TPR: u32 = 32u;
const DECODE_ROWS: u32 = 64u;
const DECODE_K4: u32 = 768u;
override ROUND_X: bool = false;
const WG: u32 = 256u;

struct Params { rows: u32, k: u32, row0: u32, out_stride: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
#if F16
@group(0) @binding(1) var<storage, read> w: array<vec4<f16>>;
#else
@group(0) @binding(1) var<storage, read> w: array<vec2<u32>>;
#endif
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> step: Step;

#if SUBGROUPS
fn reduce(v: f32, li: u32) -> f32 {
    var s = v;
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}
#else
var<workgroup> red: array<f32, WG>;

fn reduce(v: f32, li: u32) -> f32 {
    let lane = li % TPR;
    red[li] = v;
    workgroupBarrier();
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        if (lane < o) {
            red[li] = red[li] + red[li + o];
        }
        workgroupBarrier();
    }
    return red[li];
}
#endif

fn load_w(i: u32) -> vec4<f32> {
#if F16
    return vec4<f32>(w[i]);
#else
    let v = w[i];
    return vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
#endif
}

fn load_x(i: u32) -> vec4<f32> {
    let v = x[i];
    if (ROUND_X) {
        return vec4<f32>(round_f16(v.x), round_f16(v.y), round_f16(v.z), round_f16(v.w));
    }
    return v;
}

fn body(li: u32, wg: vec3<u32>, t: u32, o: u32) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let k4 = p.k / 4u;
    var acc = 0.0;
    if (row < p.rows) {
        let wbase = row * k4;
        let xbase = t * k4;
        for (var i = lane; i < k4; i += TPR) {
            acc += dot(load_w(wbase + i), load_x(xbase + i));
        }
    }
    let s = reduce(acc, li);
    if (lane == 0u && row < p.rows) {
        out[o * p.out_stride + p.row0 + row] = s;
    }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    body(li, wg, wg.y, wg.y);
}

@compute @workgroup_size(256)
fn last(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    body(li, wg, step.n_tokens - 1u, 0u);
}

// Eight token rows t0 .. t0+7 (t0 = 8·wg.y) per workgroup: each weight vector is loaded once
// and dotted with eight hidden states; every token's sum is accumulated and reduced in the
// same order as `body` (bit-identical rows). Rows past n_tokens repeat the last token and
// are not written. The token bases and sums are named variables: private arrays indexed
// in a loop cost several µs a launch on NVIDIA's Vulkan compiler (BENCHMARKS.md,
// 2026-11-26).
@compute @workgroup_size(256)
fn main8(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let k4 = p.k / 4u;
    let t0 = wg.y * 8u;
    let last = step.n_tokens - 1u;
    let xa = vec4<u32>(min(t0, last), min(t0 + 1u, last), min(t0 + 2u, last), min(t0 + 3u, last)) * k4;
    let xc = vec4<u32>(min(t0 + 4u, last), min(t0 + 5u, last), min(t0 + 6u, last), min(t0 + 7u, last)) * k4;
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    if (row < p.rows) {
        let wbase = row * k4;
        for (var i = lane; i < k4; i += TPR) {
            let wv = load_w(wbase + i);
            lo.x += dot(wv, load_x(xa.x + i));
            lo.y += dot(wv, load_x(xa.y + i));
            lo.z += dot(wv, load_x(xa.z + i));
            lo.w += dot(wv, load_x(xa.w + i));
            hi.x += dot(wv, load_x(xc.x + i));
            hi.y += dot(wv, load_x(xc.y + i));
            hi.z += dot(wv, load_x(xc.z + i));
            hi.w += dot(wv, load_x(xc.w + i));
        }
    }
    put8(li, row, t0, 0u, reduce(lo.x, li));
    put8(li, row, t0, 1u, reduce(lo.y, li));
    put8(li, row, t0, 2u, reduce(lo.z, li));
    put8(li, row, t0, 3u, reduce(lo.w, li));
    put8(li, row, t0, 4u, reduce(hi.x, li));
    put8(li, row, t0, 5u, reduce(hi.y, li));
    put8(li, row, t0, 6u, reduce(hi.z, li));
    put8(li, row, t0, 7u, reduce(hi.w, li));
}

// main8: row `row`'s sum `s` for token t0 + j, written by the row's lane 0 when both exist.
fn put8(li: u32, row: u32, t0: u32, j: u32, s: f32) {
    if (li % TPR == 0u && row < p.rows && t0 + j <= step.n_tokens - 1u) {
        out[(t0 + j) * p.out_stride + p.row0 + row] = s;
    }
}

var<workgroup> xs: array<vec4<f32>, DECODE_K4>;

@compute @workgroup_size(256)
fn decode(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let k4 = p.k / 4u;
    for (var i = li; i < k4; i += WG) {
        xs[i] = load_x(i);
    }
    workgroupBarrier();
    let lane = li % TPR;
    // A uniform trip count (the reductions hold barriers): row group j takes rows
    // j·(WG/TPR) + li/TPR and the row DECODE_ROWS/2 after it.
    let groups = WG / TPR;
    let half = DECODE_ROWS / 2u;
    for (var j = 0u; j < (half + groups - 1u) / groups; j++) {
        let r = j * groups + li / TPR;
        let row = wg.x * DECODE_ROWS + r;
        let row2 = row + half;
        let live = r < half && row < p.rows;
        let live2 = r < half && row2 < p.rows;
        var acc = 0.0;
        var acc2 = 0.0;
        if (live) {
            let wb = row * k4;
            let wb2 = select(wb, row2 * k4, live2);
            var i = lane;
            for (; i + 3u * TPR < k4; i += 4u * TPR) {
                let w0 = load_w(wb + i);
                let w1 = load_w(wb + i + TPR);
                let w2 = load_w(wb + i + 2u * TPR);
                let w3 = load_w(wb + i + 3u * TPR);
                let u0 = load_w(wb2 + i);
                let u1 = load_w(wb2 + i + TPR);
                let u2 = load_w(wb2 + i + 2u * TPR);
                let u3 = load_w(wb2 + i + 3u * TPR);
                acc += dot(w0, xs[i]);
                acc += dot(w1, xs[i + TPR]);
                acc += dot(w2, xs[i + 2u * TPR]);
                acc += dot(w3, xs[i + 3u * TPR]);
                acc2 += dot(u0, xs[i]);
                acc2 += dot(u1, xs[i + TPR]);
                acc2 += dot(u2, xs[i + 2u * TPR]);
                acc2 += dot(u3, xs[i + 3u * TPR]);
            }
            for (; i < k4; i += TPR) {
                acc += dot(load_w(wb + i), xs[i]);
                acc2 += dot(load_w(wb2 + i), xs[i]);
            }
        }
        let s = reduce(acc, li);
        let s2 = reduce(acc2, li);
        if (lane == 0u && live) {
            out[p.row0 + row] = s;
        }
        if (lane == 0u && live2) {
            out[p.row0 + row2] = s2;
        }
    }
}
