// window_attention.wgsl — sliding-window grouped-query attention over the layer's paged
// KV cache (F16 or F32: kv_type.wgsl) (Gemma 3's local layers): token t, at position toks[t].x of sequence slot
// toks[t].y, sees that sequence's keys max(0, pos + 1 − window) ..= pos;
// out = softmax(f16(q)·Kᵀ · scale) · V per head, q head h reading kv head h / group.
//
// Bindings (group 0):
//   0 uniform Params { n_head, n_head_kv, head_dim, window, scale, pps, _, _ }:
//                     pps = page-table entries per sequence
//   1 uniform Step { n_tokens, .. }
//   2 storage read  q:       array<f32>   T × n_head·head_dim (rotated)
//   3 storage read  k_cache: array<KvWord> pages × PAGE rows of kv_dim elements, two a
//                                         word; (seq s, position i) is row
//                                         pages[s·pps + i / PAGE]·PAGE + i % PAGE
//   4 storage read  v_cache: array<KvWord> same layout
//   5 storage rw    out:     array<f32>   T × n_head·head_dim
//   6 storage rw    probs:   array<f32>   T × n_head × window (scratch)
//   9 storage read  toks:    array<vec2<u32>>  T × (position, slot | DECODE_ROW flag)
//  10 storage read  pages:   array<u32>   slots × pps page ids
// Dispatch: (n_head, T, 1), one workgroup of 256 threads per (head, token): a thread per
// key for the scores and the softmax (tree max and sum in shared memory), then a thread per
// head dimension for P·V. head_dim must be even and ≤ 512.
// Numerics against backend/cpu/attention.rs: over an F16 cache q is rounded to F16 and the
// probabilities too for a decode row (a step of one token, or a row flagged DECODE_ROW), as on the CPU; the
// softmax sums in f32 where the CPU sums in f64, and P·V adds in key order as the CPU does.

const WG: u32 = 256u;
const MAX_HD: u32 = 512u;

struct Params {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    window: u32,
    scale: f32,
    pps: u32,
    pad0: u32,
    pad1: u32,
}
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<KvWord>;
@group(0) @binding(4) var<storage, read> v_cache: array<KvWord>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> probs: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;

var<workgroup> q_sh: array<f32, MAX_HD>;
var<workgroup> red: array<f32, WG>;

fn row_of(s: u32, i: u32) -> u32 {
    return pages[s * p.pps + i / PAGE] * PAGE + i % PAGE;
}

// Tree reduction over the workgroup: max when `is_max`, else sum.
fn reduce(v: f32, li: u32, is_max: bool) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if (li < w) {
            if (is_max) {
                red[li] = max(red[li], red[li + w]);
            } else {
                red[li] = red[li] + red[li + w];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let tk = toks[t];
    let slot = tk.y & SLOT_MASK;
    let n_keys = tk.x + 1u;
    let first = n_keys - min(n_keys, p.window);
    let cnt = n_keys - first;
    let round_p = step.n_tokens == 1u || (tk.y & DECODE_ROW) != 0u;
    let kvh = h / (p.n_head / p.n_head_kv);
    let hw = p.head_dim / 2u;
    let qbase = (t * p.n_head + h) * p.head_dim;
    for (var i = li; i < p.head_dim; i += WG) {
        q_sh[i] = kv_round(q[qbase + i]);
    }
    workgroupBarrier();
    let pbase = (t * p.n_head + h) * p.window;
    var m = NEG;
    for (var i = li; i < cnt; i += WG) {
        let kb = (row_of(slot, first + i) * p.n_head_kv + kvh) * hw;
        var acc = 0.0;
        for (var j = 0u; j < hw; j++) {
            let kk = kv_unpack(k_cache[kb + j]);
            acc += kk.x * q_sh[2u * j] + kk.y * q_sh[2u * j + 1u];
        }
        let s = acc * p.scale;
        probs[pbase + i] = s;
        m = max(m, s);
    }
    m = reduce(m, li, true);
    var l = 0.0;
    for (var i = li; i < cnt; i += WG) {
        let e = exp(probs[pbase + i] - m);
        probs[pbase + i] = e;
        l += e;
    }
    let inv = 1.0 / reduce(l, li, false);
    for (var i = li; i < cnt; i += WG) {
        var pr = probs[pbase + i] * inv;
        if (round_p) {
            pr = kv_round(pr);
        }
        probs[pbase + i] = pr;
    }
    storageBarrier();
    workgroupBarrier();
    for (var d = li; d < p.head_dim; d += WG) {
        var acc = 0.0;
        for (var i = 0u; i < cnt; i++) {
            let vb = (row_of(slot, first + i) * p.n_head_kv + kvh) * hw;
            let vv = kv_unpack(v_cache[vb + d / 2u]);
            acc += probs[pbase + i] * select(vv.x, vv.y, (d & 1u) == 1u);
        }
        out[qbase + d] = acc;
    }
}
