// qmatvec.wgsl — out (= or +=) W · x for weights in a GGUF storage format, read as stored
// in the file (no repacking). This file is the driver; the pipeline cache appends the
// format's include (quant/format.rs `BlockFormat::WGSL`): formats/float.wgsl for F32, F16,
// BF16 (f32 activations; FMT selects which), or formats/block.wgsl followed by
// formats/<fmt>.wgsl for block formats (int8 activations of the format's pairing,
// quant_act.wgsl). The include defines `unit(ro, u, a, db, nt) -> vec4<f32>` (the products
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
// ceil(T/4), 1); gather (ceil(units / 256), T, 1) with out_stride = k; one dispatch per
// shard. In matvec/matmul4 a workgroup is 256/TPR rows × TPR lanes; lanes
// stride over the row's units and their partial sums are reduced by subgroupShuffleXor
// (SUBGROUPS, TPR ≤ the minimum subgroup size) or in shared memory. matmul4 decodes each
// weight unit once for up to 4 tokens.
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
