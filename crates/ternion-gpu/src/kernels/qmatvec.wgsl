// qmatvec.wgsl — out (= or +=) W · x for weights in a GGUF storage format, read as stored
// in the file (no repacking). This file is the driver; the pipeline cache appends the
// format's include (quant/format.rs `BlockFormat::WGSL`, files in ternion-formats'
// quant/wgsl/): float.wgsl for F32, F16, BF16 (f32 activations; FMT selects which), or
// formats/block.wgsl (this crate) followed by quant/wgsl/<fmt>.wgsl for block formats
// (int8 activations of the format's pairing, quant_act.wgsl). The include defines `unit(ro, u, a, db, nt) -> vec4<f32>` (the products
// of unit u of the row at byte ro with up to 4 tokens) and `gather_unit(ro, u, t)` (unit u
// dequantized into out row t). The `gather` entry point dequantizes whole rows (token
// embeddings stored in these formats).
//
// Bindings (group 0):
//   0 uniform Params { rows, units, row0, out_stride, row_bytes, act_stride, nb, post }:
//                     rows in this shard, units per row (32 elements, 4 for float formats),
//                     first output column of the shard, output row stride, bytes per
//                     weight row, activation words per token (k for float formats, k/4
//                     for packed int8), activation scale words per token, the output
//                     scale (1 unless the model has one)
//   1 storage read  w:     array<u32>  this shard's rows, bytes exactly as in the file
//                                      (rows at byte offset row·row_bytes; blocks may
//                                      start at any even offset, so words are read
//                                      through `ld`, which joins two words)
//   2 storage read  act:   array<u32>  float formats: T × k f32 (as bits); quantized: T × k/4
//                                      words of packed int8
//   3 storage read  act_d: array<f32>  T × nb block scales (block formats only)
//   4 storage rw    out:   array<f32>  T × out_stride; writes row0 .. row0 + rows
//   5 uniform Step { n_tokens, .. }    matmul4 only
//   6 storage read  ids:   array<u32>  gather only: T token ids
// Dispatch: matvec (ceil(rows / (256/TPR)), T, 1); matmul4 (ceil(rows / (256/TPR)),
// ceil(T/4), 1); gather (ceil(units / 256), T, 1) with out_stride = k; matmul_tiled
// (ceil(rows / 64), ceil(T / 64), 1), block formats only (`#if TILED`); one dispatch per
// shard. In matvec/matmul4 a workgroup is 256/TPR rows × TPR lanes; lanes
// stride over the row's units and their partial sums are reduced by subgroupShuffleXor
// (SUBGROUPS, TPR ≤ the minimum subgroup size) or in shared memory. matmul4 decodes each
// weight unit once for up to 4 tokens; matmul_tiled once for 64 (its layout above the
// entry point).
//
// Numerics: integer dots are exact; each include scales its integer sums in the CPU
// reference's expression (see its header), so results agree with the CPU to f32
// summation order. Byte layouts: docs/FORMATS.md.

override FMT: u32 = 0u;
override TPR: u32 = 32u;
override EPILOGUE: u32 = 0u;
override ROUND_X: bool = false;
const WG: u32 = 256u;

struct Params {
    rows: u32,
    units: u32,
    row0: u32,
    out_stride: u32,
    row_bytes: u32,
    act_stride: u32,
    nb: u32,
    post: f32,
}
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<u32>;
@group(0) @binding(3) var<storage, read> act_d: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;

// The 4 bytes at byte offset o of w (any alignment).
fn ld(o: u32) -> u32 {
    let i = o >> 2u;
    let s = (o & 3u) * 8u;
    if (s == 0u) {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

fn ld8(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// The F16 at the even byte offset o, as f32.
fn f16_at(o: u32) -> f32 {
    return unpack2x16float((w[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu).x;
}

fn i8_at(o: u32) -> i32 {
    return bitcast<i32>(ld8(o) << 24u) >> 24u;
}

#if TILED
const TM: u32 = 64u;
const TN: u32 = 64u;
const UCH: u32 = 2u;
const KW: u32 = 16u;

// Staged per K step of UCH units (KW k-words), k-word-major so that a thread reads its 4
// rows (4 tokens) of one k-word as one vec4: wsh[k][row / 4][row % 4] the weights' int8
// lanes, ash[k][token / 4][token % 4] the activations'; wsc[unit][row] the decoded unit's
// (d, dmin, s0, s1) as bits; asc[unit][token] the token's `unit_scales`. 11 KB in all.
var<workgroup> wsh: array<vec4<u32>, 256>;
var<workgroup> ash: array<vec4<u32>, 256>;
var<workgroup> wsc: array<vec4<u32>, 128>;
var<workgroup> asc: array<vec2<f32>, 128>;

// A tile of TM rows × TN tokens: thread (tr, tt) = (li % 16, li / 16) owns rows 4tr..+3
// and tokens 4tt..+3. Per unit it sums q·a over each half and a over each half in integers
// (16 dot4I8Packed per k-word against two vec4 reads), then adds the format's
// `unit_sum` of each (row, token) in unit order, as the CPU reference does. Accumulators
// are named, not arrays: a dynamically indexed array would live in local memory.
@compute @workgroup_size(256)
fn matmul_tiled(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let tr = li % 16u;
    let tt = li / 16u;
    let r0 = wg.x * TM;
    let t0 = wg.y * TN;
    let nt = min(TN, step.n_tokens - t0);
    var y0 = vec4<f32>(0.0);
    var y1 = vec4<f32>(0.0);
    var y2 = vec4<f32>(0.0);
    var y3 = vec4<f32>(0.0);
    for (var u0 = 0u; u0 < p.units; u0 += UCH) {
        if (li < TM * UCH) {
            let r = li % TM;
            let u = u0 + li / TM;
            var w: Unit;
            if (r0 + r < p.rows && u < p.units) {
                w = decode((r0 + r) * p.row_bytes, u);
            }
            let k0 = (li / TM) * 8u;
            for (var i = 0u; i < 8u; i++) {
                wsh[(k0 + i) * 16u + r / 4u][r % 4u] = w.q[i];
            }
            wsc[li] = vec4<u32>(bitcast<u32>(w.d), bitcast<u32>(w.dmin), bitcast<u32>(w.s0), bitcast<u32>(w.s1));
        } else {
            let i = li - TM * UCH;
            let t = i % TN;
            let u = u0 + i / TN;
            var sc = vec2<f32>(0.0);
            if (t < nt && u < p.units) {
                sc = unit_scales((t0 + t) * p.nb, u);
            }
            asc[i] = sc;
        }
        for (var i = li; i < TN * KW; i += 256u) {
            let t = i % TN;
            let k = i / TN;
            var v = 0u;
            if (t < nt && u0 + k / 8u < p.units) {
                v = act[(t0 + t) * p.act_stride + 8u * u0 + k];
            }
            ash[k * 16u + t / 4u][t % 4u] = v;
        }
        workgroupBarrier();
        for (var du = 0u; du < UCH; du++) {
            if (u0 + du < p.units) {
                let lo = half_sums(du * 8u, tr, tt);
                let hi = half_sums(du * 8u + 4u, tr, tt);
                let ta = du * TN + 4u * tt;
                let d0 = asc[ta];
                let d1 = asc[ta + 1u];
                let d2 = asc[ta + 2u];
                let d3 = asc[ta + 3u];
                let wr = du * TM + 4u * tr;
                y0 += sum4(staged(wr), lo.r0, hi.r0, lo.a, hi.a, d0, d1, d2, d3);
                y1 += sum4(staged(wr + 1u), lo.r1, hi.r1, lo.a, hi.a, d0, d1, d2, d3);
                y2 += sum4(staged(wr + 2u), lo.r2, hi.r2, lo.a, hi.a, d0, d1, d2, d3);
                y3 += sum4(staged(wr + 3u), lo.r3, hi.r3, lo.a, hi.a, d0, d1, d2, d3);
            }
        }
        workgroupBarrier();
    }
    let tb = 4u * tt;
    let n = nt - min(nt, tb);
    store_tile(r0 + 4u * tr, t0 + tb, n, y0);
    store_tile(r0 + 4u * tr + 1u, t0 + tb, n, y1);
    store_tile(r0 + 4u * tr + 2u, t0 + tb, n, y2);
    store_tile(r0 + 4u * tr + 3u, t0 + tb, n, y3);
}

// Integer sums over half a unit (k-words k0 .. k0 + 3) of a thread's 4 rows (r0..r3, each
// over its 4 tokens) and of the 4 tokens' activations (a).
struct HalfSums {
    r0: vec4<i32>,
    r1: vec4<i32>,
    r2: vec4<i32>,
    r3: vec4<i32>,
    a: vec4<i32>,
}

fn half_sums(k0: u32, tr: u32, tt: u32) -> HalfSums {
    var s: HalfSums;
    for (var k = k0; k < k0 + 4u; k++) {
        let wq = wsh[k * 16u + tr];
        let aq = ash[k * 16u + tt];
        s.r0 += dot4x4(wq.x, aq);
        s.r1 += dot4x4(wq.y, aq);
        s.r2 += dot4x4(wq.z, aq);
        s.r3 += dot4x4(wq.w, aq);
        s.a += dot4x4(ONES, aq);
    }
    return s;
}

// The dot products of weight word wv with the 4 tokens' activation words in aq.
fn dot4x4(wv: u32, aq: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(wv, aq.x), dot4I8Packed(wv, aq.y), dot4I8Packed(wv, aq.z), dot4I8Packed(wv, aq.w));
}

// The scales of staged unit i (its lanes are not needed once summed).
fn staged(i: u32) -> Unit {
    let s = wsc[i];
    var w = unit_new();
    w.d = bitcast<f32>(s.x);
    w.dmin = bitcast<f32>(s.y);
    w.s0 = bitcast<i32>(s.z);
    w.s1 = bitcast<i32>(s.w);
    return w;
}

// `unit_sum` of one row's unit against 4 tokens.
fn sum4(w: Unit, l: vec4<i32>, h: vec4<i32>, al: vec4<i32>, ah: vec4<i32>, d0: vec2<f32>, d1: vec2<f32>, d2: vec2<f32>, d3: vec2<f32>) -> vec4<f32> {
    return vec4<f32>(
        unit_sum(w, Sums(l.x, h.x, al.x, ah.x), d0),
        unit_sum(w, Sums(l.y, h.y, al.y, ah.y), d1),
        unit_sum(w, Sums(l.z, h.z, al.z, ah.z), d2),
        unit_sum(w, Sums(l.w, h.w, al.w, ah.w), d3),
    );
}

// Writes tokens t .. t + min(n, 4) − 1 of row `row` (when it is one of this shard's rows).
fn store_tile(row: u32, t: u32, n: u32, y: vec4<f32>) {
    if (row >= p.rows) {
        return;
    }
    for (var j = 0u; j < min(n, 4u); j++) {
        let o = (t + j) * p.out_stride + p.row0 + row;
        let v = y[j] * p.post;
        if (EPILOGUE == 1u) {
            out[o] = out[o] + v;
        } else {
            out[o] = v;
        }
    }
}
#endif

@group(0) @binding(6) var<storage, read> ids: array<u32>;

#if SUBGROUPS
fn reduce4(v: vec4<f32>, li: u32) -> vec4<f32> {
    var s = v;
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}
#else
var<workgroup> red4: array<vec4<f32>, WG>;

// Sum over the TPR lanes of a row; the result is valid in lane 0.
fn reduce4(v: vec4<f32>, li: u32) -> vec4<f32> {
    let lane = li % TPR;
    red4[li] = v;
    workgroupBarrier();
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        if (lane < o) {
            red4[li] = red4[li] + red4[li + o];
        }
        workgroupBarrier();
    }
    return red4[li];
}
#endif

fn body(li: u32, wg: vec3<u32>, t0: u32, nt: u32) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let ts = vec4<u32>(t0, t0 + 1u, t0 + 2u, t0 + 3u);
    let a = ts * p.act_stride;
    let db = ts * p.nb;
    var acc = vec4<f32>(0.0);
    if (row < p.rows) {
        let ro = row * p.row_bytes;
        for (var u = lane; u < p.units; u += TPR) {
            acc += unit(ro, u, a, db, nt);
        }
    }
    let s = reduce4(acc, li);
    if (lane == 0u && row < p.rows) {
        for (var j = 0u; j < nt; j++) {
            let o = (t0 + j) * p.out_stride + p.row0 + row;
            let y = s[j] * p.post;
            if (EPILOGUE == 1u) {
                out[o] = out[o] + y;
            } else {
                out[o] = y;
            }
        }
    }
}

@compute @workgroup_size(256)
fn matvec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    body(li, wg, wg.y, 1u);
}

@compute @workgroup_size(256)
fn matmul4(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t0 = wg.y * 4u;
    body(li, wg, t0, min(4u, step.n_tokens - t0));
}

// Gather: out[t][..] = dequantized row ids[t] − row0 of this shard (rows of other shards are
// left to their own dispatch). A thread per unit; the CPU's dequantization expressions.
@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u = gid.x;
    let t = gid.y;
    let id = ids[t];
    if (u >= p.units || id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    gather_unit((id - p.row0) * p.row_bytes, u, t);
}
