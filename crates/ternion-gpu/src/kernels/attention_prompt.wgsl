// attention_prompt.wgsl — causal GQA attention of a prompt step with the "fast" numerics
// (docs/ARCHITECTURE.md): flash attention over 32-query × 32-key tiles. Each score sums
// the F16 query and key pairs in the CPU reference's order, in f32 (so the scores equal
// the CPU's bit for bit): BitNet quantizes the attention output to int8 after its
// sub-norm, and scores summed in another order move the prompt logits past the golden
// tolerance (BENCHMARKS.md, 2026-11-25). Probabilities, sums and P·V are f32.
//
// Bindings (group 0):
//   0 uniform AttnParams { n_head, n_head_kv, head_dim, n_ctx, scale, max_chunks, pps, _ }
//                     (paged_kv.wgsl)
//   1 storage read  blocks:  array<vec2<u32>>  [0].x = block count, then per block (first
//                                         token, tokens ≤ 32): consecutive tokens of one
//                                         sequence (ops/paged.rs KvIndex::write_blocks)
//   2 storage read  q:       array<f32>   T × n_head·head_dim (rotated)
//   3 storage read  k_cache: array<u32>   paged F16 keys, two halves a word (attention.wgsl)
//   4 storage read  v_cache: array<u32>   paged F16 values, same layout
//   5 storage rw    out:     array<f32>   T × n_head·head_dim
//   9 storage read  toks:    array<vec2<u32>>  T × (position, sequence slot)
//  10 storage read  pages:   array<u32>   the page tables
// Dispatch: (≥ block count, n_head, 1); workgroups past the count return. head_dim is 64 or
// 128 (the host checks). Workgroup memory: 29,072 bytes (the host checks the limit).
//
// A workgroup takes a block of BQ = 32 queries of one head and walks the keys one KV page
// (BK = 32 keys) at a time, the page's keys and values loaded once for the block. Scores:
// thread t computes query t / 8 against keys t % 8 + 8i (i < 4), four independent sums
// sharing each query word. Softmax and P·V: thread t owns query t / 8 and head words
// t % 8 + 8x (x < head_dim / 16: eight lanes read eight consecutive words), takes the
// tile's max, rescales its running sums and adds e·v over the 32 keys in order.

const WG: u32 = 256u;
const BQ: u32 = 32u;
const BK: u32 = 32u;
// Padded strides (words) of the query and key tiles (65: rows in distinct banks) and of
// the score tile (33).
const HWP: u32 = 65u;
const SP: u32 = 33u;

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(1) var<storage, read> blocks: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<u32>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;

var<workgroup> q_sh: array<u32, 2080>; // BQ × HWP F16 pairs
var<workgroup> k_sh: array<u32, 2080>; // BK × HWP
var<workgroup> v_sh: array<u32, 2048>; // BK × 64
var<workgroup> s_sh: array<f32, 1056>; // BQ × SP scaled scores
var<workgroup> tok_sh: vec4<u32>;

// Adds e · the value pair at word `at` of the value tile to `a`.
fn pv(a: vec2<f32>, e: f32, at: u32) -> vec2<f32> {
    return a + e * unpack2x16float(v_sh[at]);
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
    if (blk.y == 0u) {
        return;
    }
    // The block's first token (of the step), its tokens, and where they start.
    let qb = blk.x;
    let pos0 = blk.z;
    let slot = blk.w & SLOT_MASK;
    let kvh = h / (p.n_head / p.n_head_kv);
    let hw = p.head_dim / 2u;
    // The block's queries, rounded to F16 (rows past the block repeat its last token).
    for (var i = li; i < BQ * hw; i += WG) {
        let r = i / hw;
        let w = i % hw;
        let t = qb + min(r, blk.y - 1u);
        let b = (t * p.n_head + h) * p.head_dim + 2u * w;
        q_sh[r * HWP + w] = f16_bits(q[b]) | (f16_bits(q[b + 1u]) << 16u);
    }
    // Keys the block's last query sees.
    let n_keys = pos0 + blk.y;
    // Score roles: query sq against keys sk + 8i. Softmax / P·V roles: query qi, words
    // w0 + 8x of the head.
    let sq = li / 8u;
    let sk = li % 8u;
    let s_pos = pos0 + min(sq, blk.y - 1u);
    let qi = li / 8u;
    let wpt = hw / 8u;
    let w0 = li % 8u;
    var m = NEG;
    var l = 0.0;
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var a2 = vec2<f32>(0.0);
    var a3 = vec2<f32>(0.0);
    var a4 = vec2<f32>(0.0);
    var a5 = vec2<f32>(0.0);
    var a6 = vec2<f32>(0.0);
    var a7 = vec2<f32>(0.0);
    for (var k0 = 0u; k0 < n_keys; k0 += BK) {
        workgroupBarrier();
        // The page of keys k0..k0 + 32 (zeros past the last key).
        let row0 = pages[slot * p.pps + k0 / PAGE] * PAGE;
        for (var i = li; i < BK * hw; i += WG) {
            let j = i / hw;
            let w = i % hw;
            var kv = 0u;
            var vv = 0u;
            if (k0 + j < n_keys) {
                let at = ((row0 + j) * p.n_head_kv + kvh) * hw + w;
                kv = k_cache[at];
                vv = v_cache[at];
            }
            k_sh[j * HWP + w] = kv;
            v_sh[j * 64u + w] = vv;
        }
        workgroupBarrier();
        // Four scores, each Σ over the head's F16 pairs in order (the CPU reference's).
        var c0 = 0.0;
        var c1 = 0.0;
        var c2 = 0.0;
        var c3 = 0.0;
        for (var w = 0u; w < hw; w++) {
            let a = unpack2x16float(q_sh[sq * HWP + w]);
            let b0 = unpack2x16float(k_sh[sk * HWP + w]);
            let b1 = unpack2x16float(k_sh[(sk + 8u) * HWP + w]);
            let b2 = unpack2x16float(k_sh[(sk + 16u) * HWP + w]);
            let b3 = unpack2x16float(k_sh[(sk + 24u) * HWP + w]);
            c0 += a.x * b0.x + a.y * b0.y;
            c1 += a.x * b1.x + a.y * b1.y;
            c2 += a.x * b2.x + a.y * b2.y;
            c3 += a.x * b3.x + a.y * b3.y;
        }
        let srow = sq * SP + sk;
        s_sh[srow] = select(NEG, c0 * p.scale, k0 + sk <= s_pos);
        s_sh[srow + 8u] = select(NEG, c1 * p.scale, k0 + sk + 8u <= s_pos);
        s_sh[srow + 16u] = select(NEG, c2 * p.scale, k0 + sk + 16u <= s_pos);
        s_sh[srow + 24u] = select(NEG, c3 * p.scale, k0 + sk + 24u <= s_pos);
        workgroupBarrier();
        var mt = m;
        for (var j = 0u; j < BK; j++) {
            mt = max(mt, s_sh[qi * SP + j]);
        }
        let alpha = exp(m - mt);
        l *= alpha;
        a0 *= alpha;
        a1 *= alpha;
        a2 *= alpha;
        a3 *= alpha;
        a4 *= alpha;
        a5 *= alpha;
        a6 *= alpha;
        a7 *= alpha;
        for (var j = 0u; j < BK; j++) {
            let e = exp(s_sh[qi * SP + j] - mt);
            l += e;
            let vb = j * 64u + w0;
            a0 = pv(a0, e, vb);
            a1 = pv(a1, e, vb + 8u);
            a2 = pv(a2, e, vb + 16u);
            a3 = pv(a3, e, vb + 24u);
            if (wpt == 8u) {
                a4 = pv(a4, e, vb + 32u);
                a5 = pv(a5, e, vb + 40u);
                a6 = pv(a6, e, vb + 48u);
                a7 = pv(a7, e, vb + 56u);
            }
        }
        m = mt;
    }
    if (qi < blk.y) {
        let o = ((qb + qi) * p.n_head + h) * p.head_dim + 2u * w0;
        store2(o, a0 / l);
        store2(o + 16u, a1 / l);
        store2(o + 32u, a2 / l);
        store2(o + 48u, a3 / l);
        if (wpt == 8u) {
            store2(o + 64u, a4 / l);
            store2(o + 80u, a5 / l);
            store2(o + 96u, a6 / l);
            store2(o + 112u, a7 / l);
        }
    }
}

// Two consecutive outputs from `at`.
fn store2(at: u32, v: vec2<f32>) {
    out[at] = v.x;
    out[at + 1u] = v.y;
}
