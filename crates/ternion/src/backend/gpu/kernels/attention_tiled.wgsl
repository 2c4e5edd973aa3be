// attention_tiled.wgsl — causal GQA attention of a prompt step (the n tokens of ONE
// sequence at consecutive positions after those it caches) with the "fast" numerics
// (docs/ARCHITECTURE.md): flash attention over tiles. A workgroup takes a block of BQ
// queries of one head and walks the keys in tiles of BK, each tile's keys and values
// loaded once into workgroup memory for the whole block (attention.wgsl's `prefill`
// re-reads every key for every query).
//
// Bindings (group 0):
//   0 uniform Params { n_head, n_head_kv, head_dim, n_ctx, scale, max_chunks, pps, _ }
//                     (attention.wgsl's)
//   1 storage read  blocks:  array<vec2<u32>>  [0].x = block count, then per block (first
//                                         token, tokens ≤ BQ): consecutive tokens of one
//                                         sequence (ops/attention.rs KvIndex::write_blocks)
//   2 storage read  q:       array<f32>   T × n_head·head_dim (rotated)
//   3 storage read  k_cache: array<u32>   paged F16 keys, two halves a word (attention.wgsl)
//   4 storage read  v_cache: array<u32>   paged F16 values, same layout
//   5 storage rw    out:     array<f32>   T × n_head·head_dim
//   9 storage read  toks:    array<vec2<u32>>  T × (position, sequence slot)
//  10 storage read  pages:   array<u32>   the page tables
// Dispatch: (≥ block count, n_head, 1); workgroups past the count return. head_dim is 64 or
// 128 (the host checks).
// Thread (qi, j) = (li / 16, li % 16): the score of query qi against key j of the tile
// (f16(q)·k · scale, q rounded to F16 as everywhere), then, for the query's online softmax
// (running max m and sum l, recomputed identically by its 16 threads), Σ e·v over the tile
// for the query's dims 8j..8j+7 (head_dim 128; 4j..4j+3 for 64). Probabilities stay f32.

const WG: u32 = 256u;
const BQ: u32 = 16u;
const BK: u32 = 16u;
// Words (two halves) of a head row at most, and the padded stride of the q and key tiles
// (65: the 16 rows a score step reads lie in distinct banks).
const HW: u32 = 64u;
const HWP: u32 = 65u;
const NEG: f32 = -3.0e38;
const PAGE: u32 = 32u;
const SLOT_MASK: u32 = 0x7fffffffu;

struct Params {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_ctx: u32,
    scale: f32,
    max_chunks: u32,
    pps: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> blocks: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;

var<workgroup> q_sh: array<u32, 1040>;
var<workgroup> k_sh: array<u32, 1040>;
var<workgroup> v_sh: array<u32, 1024>;
var<workgroup> s_sh: array<f32, 256>;
var<workgroup> tok_sh: vec4<u32>;

fn cache_row(s: u32, i: u32) -> u32 {
    return pages[s * p.pps + i / PAGE] * PAGE + i % PAGE;
}

// Σ over a head of the F16 pairs of query row qi and key row kk of the tiles.
fn qk(qi: u32, kk: u32, hw: u32) -> f32 {
    var acc = 0.0;
    for (var w = 0u; w < hw; w++) {
        let a = unpack2x16float(q_sh[qi * HWP + w]);
        let b = unpack2x16float(k_sh[kk * HWP + w]);
        acc += a.x * b.x + a.y * b.y;
    }
    return acc;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.y;
    if (li == 0u) {
        var b = vec2<u32>(0u, 0u);
        if (wg.x < blocks[0].x) {
            b = blocks[1u + wg.x];
        }
        let tk = toks[b.x];
        tok_sh = vec4<u32>(b.x, b.y, tk.x, tk.y);
    }
    let blk = workgroupUniformLoad(&tok_sh);
    // The block's first token (of the step), its tokens, and where they start.
    let qb = blk.x;
    let n = qb + blk.y;
    if (blk.y == 0u) {
        return;
    }
    let pos0 = blk.z;
    let slot = blk.w & SLOT_MASK;
    let kvh = h / (p.n_head / p.n_head_kv);
    let hw = p.head_dim / 2u;
    // The block's queries, rounded to F16 (rows past the step repeat its last token).
    for (var i = li; i < BQ * hw; i += WG) {
        let qi = i / hw;
        let w = i % hw;
        let t = min(qb + qi, n - 1u);
        let b = (t * p.n_head + h) * p.head_dim + 2u * w;
        q_sh[qi * HWP + w] = f16_bits(q[b]) | (f16_bits(q[b + 1u]) << 16u);
    }
    let qi = li / 16u;
    let j = li % 16u;
    let t = qb + qi;
    let my_pos = pos0 + qi;
    // Keys the block's last query sees.
    let n_keys = pos0 + blk.y;
    // Words of the head this thread accumulates: wpt from word j·wpt.
    let wpt = hw / 16u;
    var m = NEG;
    var l = 0.0;
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var a2 = vec2<f32>(0.0);
    var a3 = vec2<f32>(0.0);
    for (var k0 = 0u; k0 < n_keys; k0 += BK) {
        workgroupBarrier();
        for (var i = li; i < BK * hw; i += WG) {
            let kk = i / hw;
            let w = i % hw;
            let key = k0 + kk;
            var kv = 0u;
            var vv = 0u;
            if (key < n_keys) {
                let at = (cache_row(slot, key) * p.n_head_kv + kvh) * hw + w;
                kv = k_cache[at];
                vv = v_cache[at];
            }
            k_sh[kk * HWP + w] = kv;
            v_sh[kk * hw + w] = vv;
        }
        workgroupBarrier();
        var s = NEG;
        if (t < n && k0 + j <= my_pos) {
            s = qk(qi, j, hw) * p.scale;
        }
        s_sh[qi * BK + j] = s;
        workgroupBarrier();
        var mt = m;
        for (var kk = 0u; kk < BK; kk++) {
            mt = max(mt, s_sh[qi * BK + kk]);
        }
        let alpha = exp(m - mt);
        l *= alpha;
        a0 *= alpha;
        a1 *= alpha;
        a2 *= alpha;
        a3 *= alpha;
        let w0 = j * wpt;
        for (var kk = 0u; kk < BK; kk++) {
            let e = exp(s_sh[qi * BK + kk] - mt);
            l += e;
            let vb = kk * hw + w0;
            a0 += e * unpack2x16float(v_sh[vb]);
            a1 += e * unpack2x16float(v_sh[vb + 1u]);
            if (wpt == 4u) {
                a2 += e * unpack2x16float(v_sh[vb + 2u]);
                a3 += e * unpack2x16float(v_sh[vb + 3u]);
            }
        }
        m = mt;
    }
    if (t < n) {
        let o = (t * p.n_head + h) * p.head_dim + 2u * j * wpt;
        out[o] = a0.x / l;
        out[o + 1u] = a0.y / l;
        out[o + 2u] = a1.x / l;
        out[o + 3u] = a1.y / l;
        if (wpt == 4u) {
            out[o + 4u] = a2.x / l;
            out[o + 5u] = a2.y / l;
            out[o + 6u] = a3.x / l;
            out[o + 7u] = a3.y / l;
        }
    }
}
