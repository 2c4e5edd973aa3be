// select.wgsl — top-k of each of R rows of f32 (logits), k ≤ 64, in two passes; argmax is
// k = 1. Order: larger value first, equal values by lower index (ties → lowest id); NaN is
// never selected. Missing candidates are (−inf, 0xffffffff). A row may carry a token mask:
// the ids it does not allow count as −inf (a NaN among them too), exactly as the CPU's
// masked sampling sees them.
//
// Bindings (group 0):
//   0 uniform Params { n, chunk, chunks, rows }: row length; elements per workgroup
//                     (partial pass); workgroups per row of the partial pass; rows of masks
//                     (the partial pass's flag words; 0 in the merge pass, which reads none)
//   1 storage read  vals:     array<f32>   partial: R rows of n logits; merge: R rows of
//                                          candidate values (n = K · chunks each)
//   2 storage rw    out_vals: array<f32>   partial: K per chunk per row; merge: K per row,
//                                          best first
//   3 storage rw    out_idx:  array<u32>   same shape as out_vals: token ids within the row
//   4 storage read  in_idx:   array<u32>   merge only: candidate ids (partial's out_idx)
//   5 storage read  masks:    array<u32>   read by the partial pass (bound to both): word
//                                          r ≠ 0 when row r is masked, its bits at word
//                                          rows + r · ⌈n/32⌉ (bit i % 32 of word i / 32
//                                          allows id i)
// Dispatch: partial (chunks, R, 1); merge (1, R, 1).
// Method: K rounds; round r takes the best element strictly after round r−1's pick in the
// order above (no shared copy, no mutation), by a per-thread scan and a 256-wide tree.

override K: u32 = 1u;
const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

struct Params { n: u32, chunk: u32, chunks: u32, rows: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> vals: array<f32>;
@group(0) @binding(2) var<storage, read_write> out_vals: array<f32>;
@group(0) @binding(3) var<storage, read_write> out_idx: array<u32>;
@group(0) @binding(4) var<storage, read> in_idx: array<u32>;
@group(0) @binding(5) var<storage, read> masks: array<u32>;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;

fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return av > bv || (av == bv && ai < bi);
}

// Runs the K rounds over elements [start, end) with ids given by `id_of`-style lookup:
// merge reads ids from in_idx, partial uses the position itself. `mask_at`: the first word
// of the row's mask bits (partial only), or NONE for a row without a mask.
fn select_rounds(li: u32, start: u32, end: u32, merge: bool, out0: u32, base: u32,
                 mask_at: u32) {
    var pv = 0.0;
    var pi = NONE;
    // -inf from a runtime value: a constant expression may not be infinite (WGSL).
    var inf_bits = 0x7f800000u;
    let neg_inf = -bitcast<f32>(inf_bits);
    for (var r = 0u; r < K; r++) {
        var bv = neg_inf;
        var bi = NONE;
        for (var e = start + li; e < end; e += WG) {
            var v = vals[base + e];
            var id = e;
            if (merge) {
                id = in_idx[base + e];
            } else if (mask_at != NONE && (masks[mask_at + e / 32u] & (1u << (e % 32u))) == 0u) {
                v = neg_inf;
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
    var mask_at = NONE;
    if (row < p.rows && masks[row] != 0u) {
        mask_at = p.rows + row * ((p.n + 31u) / 32u);
    }
    select_rounds(li, start, end, false, (row * p.chunks + wg.x) * K, row * p.n, mask_at);
}

@compute @workgroup_size(256)
fn merge(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    select_rounds(li, 0u, p.n, true, wg.y * K, wg.y * p.n, NONE);
}
