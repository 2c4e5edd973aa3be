// select.wgsl — top-k of each of R rows of f32 (logits), k ≤ 64, in two passes; argmax is
// k = 1. Order: larger value first, equal values by lower index (ties → lowest id); NaN is
// never selected. Missing candidates are (−inf, 0xffffffff).
//
// Bindings (group 0):
//   0 uniform Params { n, chunk, chunks, _ }: row length; elements per workgroup (partial
//                     pass); workgroups per row of the partial pass
//   1 storage read  vals:     array<f32>   partial: R rows of n logits; merge: R rows of
//                                          candidate values (n = K · chunks each)
//   2 storage rw    out_vals: array<f32>   partial: K per chunk per row; merge: K per row,
//                                          best first
//   3 storage rw    out_idx:  array<u32>   same shape as out_vals: token ids within the row
//   4 storage read  in_idx:   array<u32>   merge only: candidate ids (partial's out_idx)
// Dispatch: partial (chunks, R, 1); merge (1, R, 1).
// Method: K rounds; round r takes the best element strictly after round r−1's pick in the
// order above (no shared copy, no mutation), by a per-thread scan and a 256-wide tree.

override K: u32 = 1u;
const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct Params { n: u32, chunk: u32, chunks: u32, pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> vals: array<f32>;
@group(0) @binding(2) var<storage, read_write> out_vals: array<f32>;
@group(0) @binding(3) var<storage, read_write> out_idx: array<u32>;
@group(0) @binding(4) var<storage, read> in_idx: array<u32>;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return av > bv || (av == bv && ai < bi);
}

// Runs the K rounds over elements [start, end) with ids given by `id_of`-style lookup:
// merge reads ids from in_idx, partial uses the position itself.
fn select_rounds(li: u32, start: u32, end: u32, merge: bool, out0: u32, base: u32) {
    var pv = 0.0;
    var pi = NONE;
    for (var r = 0u; r < K; r++) {
        // -inf from a runtime value: a constant expression may not be infinite (WGSL).
        var inf_bits = 0x7f800000u;
        var bv = -bitcast<f32>(inf_bits);
        var bi = NONE;
        for (var e = start + li; e < end; e += WG) {
            let v = vals[base + e];
            var id = e;
            if (merge) {
                id = in_idx[base + e];
            }
            let eligible = r == 0u || better(pv, pi, v, id);
            if (eligible && better(v, id, bv, bi)) {
                bv = v;
                bi = id;
            }
        }
        red_v[li] = bv;
        red_i[li] = bi;
        workgroupBarrier();
        for (var o = WG / 2u; o > 0u; o >>= 1u) {
            if (li < o && better(red_v[li + o], red_i[li + o], red_v[li], red_i[li])) {
                red_v[li] = red_v[li + o];
                red_i[li] = red_i[li + o];
            }
            workgroupBarrier();
        }
        pv = red_v[0];
        pi = red_i[0];
        workgroupBarrier();
        if (li == 0u) {
            out_vals[out0 + r] = pv;
            out_idx[out0 + r] = pi;
        }
    }
}

@compute @workgroup_size(256)
fn partial(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let start = wg.x * p.chunk;
    let end = min(start + p.chunk, p.n);
    let row = wg.y;
    select_rounds(li, start, end, false, (row * p.chunks + wg.x) * K, row * p.n);
}

@compute @workgroup_size(256)
fn merge(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    select_rounds(li, 0u, p.n, true, wg.y * K, wg.y * p.n);
}
