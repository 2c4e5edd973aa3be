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
//   3 storage read  k_cache: array<vec2<u32>>  paged F16 keys, two halves a word
//                                         (attention.wgsl), read two words at a time
//   4 storage read  v_cache: array<vec2<u32>>  paged F16 values, same layout (COOP_PV: as
//                                         array<vec4<f16>>, the same bytes)
//   5 storage rw    out:     array<f32>   T × n_head·head_dim
//   9 storage read  toks:    array<vec2<u32>>  T × (position, sequence slot)
//  10 storage read  pages:   array<u32>   the page tables
// Dispatch: (≥ block count, n_head, 1), read as one list of workgroups (see below); those
// past block count × n_head return. head_dim is 64 or 128 (the host checks), also given as
// the pipeline constant HD. Workgroup memory: 30,224 bytes, 46,992 with F32_TILES, 48,688
// with COOP_PV (the host checks the limit, and picks the variant the device allows).
//
// Variant F32_TILES holds the key and value tiles as f32 pairs, converted once when a page
// is staged, where the other holds the F16 words and converts each pair at every use (in
// the scores and in P·V, 32 times a page per word): the same values either way (an F16
// converts to f32 exactly), 11 % faster prompt attention on an H100 (BENCHMARKS.md,
// session 13). Its score loop takes two pairs a step, with 16-byte key loads (half the
// workgroup-memory load instructions), still adding pair 2i before pair 2i + 1.
//
// Variant COOP_PV (with F32_TILES; adapters with 16×16×16 f16 cooperative matrices, a
// subgroup size of 32 and 48,688 bytes of workgroup memory) multiplies P·V on the matrix
// units: the values are staged as F16 in v_h ([key][dim], read from the cache as F16: no
// conversion), each probability p' = e · 2^14 as two F16 parts (hi = p' rounded to F16, lo
// = the F16 of the rest: ~22 bits, products exact) in p_hi / p_lo ([query][key]), and
// subgroup s accumulates query rows 16·(s % 2)..+16 × head dims (head_dim / 4)·(s / 2).. in
// head_dim / 64 accumulators of 16 × 16 f32. The scores stay the scalar ones above, in the
// CPU's order. The exponent reference of a row is its running maximum plus MARGIN, raised
// only when a page's scores pass it; the accumulators are then rescaled through a 16 × 16
// scratch per subgroup (a branch the whole workgroup takes, rare once a row's largest
// scores are seen). P·V is then summed in the matrix units' order: the output differs from
// the scalar kernel's by ~1e-6 relative (the scores, which BitNet's int8 quantization of
// the output makes sensitive, are the same bits). Prompt attention 19 % shorter on an H100
// (BENCHMARKS.md, session 15).
//
// Workgroups take the (block, head) pairs longest first: the grid's workgroup i (x fastest)
// takes head i % n_head of the (i / n_head)-th block from the end of the step. Launched in
// that order, the long blocks of every head start together and the short ones fill in
// behind them; taking each head's blocks in turn instead (the grid's y as the head) left
// SMs idle at the end of the launch: 23 % longer on an H100 (BENCHMARKS.md, session 21).
// A workgroup takes a block of BQ = 32 queries of one head and walks the keys one KV page
// (BK = 32 keys) at a time, the page's keys and values loaded once for the block: each
// thread's share of the next page is loaded into registers while the current one is
// computed. Scores: thread t computes query t / 8 against keys t % 8 + 8i (i < 4), four
// independent sums sharing each query word; the row's new maximum comes from the eight
// threads' maxima of their four scores (pm_sh), and each thread turns its four scores into
// e = exp(s − max) in s_sh. P·V: thread t owns query t / 8 and head words t % 8 + 8x
// (x < head_dim / 16: eight lanes read eight consecutive words), rescales its running
// sums and adds e·v over the 32 keys in order.

#if COOP_PV
enable f16;
enable wgpu_cooperative_matrix;
#endif

// The head width, 64 or 128 (the host's pipeline constant; the same as p.head_dim): the
// loops over a head have constant trip counts and the index arithmetic folds.
override HD: u32 = 128u;
const WG: u32 = 256u;
const BQ: u32 = 32u;
const BK: u32 = 32u;
// Padded strides of the query tile (QP2 = 33 pairs of words: 66 words a row, rows in
// distinct banks and 8-byte aligned), of the key tile (F16 words: HWP = 65; f32 pairs:
// KP4 = 33 vec4s, 66 pairs a key, rows 16-byte aligned and in distinct banks) and of the
// score tile (33).
const QP2: u32 = 33u;
const HWP: u32 = 65u;
const KP4: u32 = 33u;
const SP: u32 = 33u;

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(1) var<storage, read> blocks: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<vec2<u32>>;
#if COOP_PV
// Four values as F16, staged into v_h with no conversion.
alias VQuad = vec4<f16>;
#else
// Four values: two words of F16 pairs.
alias VQuad = vec2<u32>;
#endif
@group(0) @binding(4) var<storage, read> v_cache: array<VQuad>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;

var<workgroup> q_sh: array<vec2<u32>, 1056>; // BQ × QP2 words, each an F16 pair
#if F32_TILES
var<workgroup> k_sh: array<vec4<f32>, 1056>; // BK × KP4: pairs 2i, 2i + 1 in vec4 i
#if COOP_PV
#else
var<workgroup> v_sh: array<vec2<f32>, 2048>; // BK × 64 pairs, converted once
#endif
#else
var<workgroup> k_sh: array<u32, 2080>; // BK × HWP
var<workgroup> v_sh: array<u32, 2048>; // BK × 64
#endif
#if COOP_PV
// Padded row lengths of the value tile (vec4s of F16: 136 values) and of the probability
// parts (F16): rows 16-byte aligned, the fragment loads' rows in distinct banks.
const VHP4: u32 = 34u;
const PP: u32 = 40u;
// p' = e · P_SCALE keeps the lo parts of small probabilities out of F16's subnormals; the
// exponent reference sits MARGIN above a row's maximum when it is raised.
const P_SCALE: f32 = 16384.0;
const MARGIN: f32 = 4.0;
var<workgroup> v_h: array<vec4<f16>, 1088>; // BK × VHP4 vec4s of F16 values, [key][dim]
var<workgroup> p_hi: array<f16, 1280>; // BQ × PP
var<workgroup> p_lo: array<f16, 1280>; // BQ × PP
var<workgroup> o_sh: array<f32, 2048>; // 8 subgroups × 16 × 16 (column-major)
// Per query row: the page's rescaling factor (0..31), l at the end (32..63).
var<workgroup> row_sh: array<f32, 64>;
// Per subgroup: whether one of its rows raised its reference past the first page.
var<workgroup> raised: array<u32, 8>;
#else
var<workgroup> s_sh: array<f32, 1056>; // BQ × SP probabilities e
#endif
var<workgroup> pm_sh: array<f32, 256>; // each thread's maximum of its four scores
var<workgroup> tok_sh: vec4<u32>;

// Four consecutive keys' elements of a row (two words) and the values' beside them.
struct Quad {
    k: vec2<u32>,
    v: VQuad,
}

// A thread's share of one page of keys and values: items li + 256·n (n < 4) of the page's
// BK × head_dim/4 quads.
struct Tile {
    q0: Quad,
    q1: Quad,
    q2: Quad,
    q3: Quad,
}

// Quad i of the page from cache row row0 (first key k0): quad i % hq of key i / hq (hq =
// head_dim / 4 quads a head row), zero past the page, the sequence's keys or the tile.
fn tile_quad(row0: u32, k0: u32, n_keys: u32, kvh: u32, i: u32) -> Quad {
    let hq = HD / 4u;
    let j = i / hq;
    var r: Quad;
    if (i < BK * hq && k0 + j < n_keys) {
        let at = ((row0 + j) * p.n_head_kv + kvh) * hq + i % hq;
        r = Quad(k_cache[at], v_cache[at]);
    }
    return r;
}

// Issues the loads of this thread's share of the page of keys k0..k0 + 32.
fn load_tile(slot: u32, k0: u32, n_keys: u32, kvh: u32, li: u32) -> Tile {
    let row0 = pages[slot * p.pps + k0 / PAGE] * PAGE;
    return Tile(
        tile_quad(row0, k0, n_keys, kvh, li),
        tile_quad(row0, k0, n_keys, kvh, li + WG),
        tile_quad(row0, k0, n_keys, kvh, li + 2u * WG),
        tile_quad(row0, k0, n_keys, kvh, li + 3u * WG),
    );
}

// Quad i's keys and values into the tiles (quads past the tile are not stored).
fn put(q: Quad, i: u32) {
    let hq = HD / 4u;
    if (i < BK * hq) {
        let j = i / hq;
        let w2 = i % hq;
#if F32_TILES
        // Converted once (exactly): pairs 2·w2 and 2·w2 + 1 in vec4 w2.
        k_sh[j * KP4 + w2] = vec4<f32>(unpack2x16float(q.k.x), unpack2x16float(q.k.y));
#else
        k_sh[j * HWP + 2u * w2] = q.k.x;
        k_sh[j * HWP + 2u * w2 + 1u] = q.k.y;
#endif
#if COOP_PV
        v_h[j * VHP4 + w2] = q.v;
#else
        v_sh[j * 64u + 2u * w2] = kv_tile(q.v.x);
        v_sh[j * 64u + 2u * w2 + 1u] = kv_tile(q.v.y);
#endif
    }
}

// This thread's share of a page into the tiles.
fn store_tile(t: Tile, li: u32) {
    put(t.q0, li);
    put(t.q1, li + WG);
    put(t.q2, li + 2u * WG);
    put(t.q3, li + 3u * WG);
}

#if F32_TILES
// A value word as the value tile holds it: its F16 pair converted to f32 (exactly).
fn kv_tile(word: u32) -> vec2<f32> {
    return unpack2x16float(word);
}

#if COOP_PV
#else
// The value pair at `at` of the value tile, as f32.
fn v_pair(at: u32) -> vec2<f32> {
    return v_sh[at];
}
#endif
#else
// A value word as the value tile holds it: the F16 pair itself.
fn kv_tile(word: u32) -> u32 {
    return word;
}

// The key pair at `at` of the key tile, as f32.
fn k_pair(at: u32) -> vec2<f32> {
    return unpack2x16float(k_sh[at]);
}

// The value pair at `at` of the value tile, as f32.
fn v_pair(at: u32) -> vec2<f32> {
    return unpack2x16float(v_sh[at]);
}
#endif

#if COOP_PV
#else
// Adds e · the value pair at word `at` of the value tile to `a`.
fn pv(a: vec2<f32>, e: f32, at: u32) -> vec2<f32> {
    return a + e * v_pair(at);
}
#endif

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
#if COOP_PV
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
    // Workgroup i of the grid (in launch order) takes head i % n_head of the (i / n_head)-th
    // block from the end: every head's last blocks, which walk the most keys, start first,
    // then the shorter ones fill the SMs as the long ones finish.
    let i = wg.y * nwg.x + wg.x;
    let h = i % p.n_head;
    let from_end = i / p.n_head;
    if (li == 0u) {
        var b = vec2<u32>(0u, 0u);
        let count = blocks[0].x;
        if (from_end < count) {
            b = blocks[count - from_end];
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
    let hw = HD / 2u;
    // The block's queries, rounded to F16, two words a store (rows past the block repeat
    // its last token).
    let hw2 = hw / 2u;
    for (var i = li; i < BQ * hw2; i += WG) {
        let r = i / hw2;
        let w2 = i % hw2;
        let t = qb + min(r, blk.y - 1u);
        let b = (t * p.n_head + h) * HD + 4u * w2;
        q_sh[r * QP2 + w2] = vec2<u32>(
            f16_bits(q[b]) | (f16_bits(q[b + 1u]) << 16u),
            f16_bits(q[b + 2u]) | (f16_bits(q[b + 3u]) << 16u),
        );
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
#if COOP_PV
    // Accumulators: rows rb.., head dims d0.. (and d0 + 16 for head_dim 128).
    let rb = 16u * (sg % 2u);
    let d0 = (HD / 4u) * (sg / 2u);
    let two = HD == 128u;
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
#else
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var a2 = vec2<f32>(0.0);
    var a3 = vec2<f32>(0.0);
    var a4 = vec2<f32>(0.0);
    var a5 = vec2<f32>(0.0);
    var a6 = vec2<f32>(0.0);
    var a7 = vec2<f32>(0.0);
#endif
    var tile = load_tile(slot, 0u, n_keys, kvh, li);
    for (var k0 = 0u; k0 < n_keys; k0 += BK) {
        workgroupBarrier();
        // The page of keys k0..k0 + 32 (zeros past the last key), then the next one's loads.
        store_tile(tile, li);
        workgroupBarrier();
        if (k0 + BK < n_keys) {
            tile = load_tile(slot, k0 + BK, n_keys, kvh, li);
        }
        // Four scores, each Σ over the head's F16 pairs in order (the CPU reference's).
        var c0 = 0.0;
        var c1 = 0.0;
        var c2 = 0.0;
        var c3 = 0.0;
#if F32_TILES
        // Two pairs a step: one 8-byte query load and four 16-byte key loads for sixteen
        // products, pair 2i added before pair 2i + 1.
        for (var i = 0u; i < hw2; i++) {
            let qq = q_sh[sq * QP2 + i];
            let a = unpack2x16float(qq.x);
            let a2 = unpack2x16float(qq.y);
            let b0 = k_sh[sk * KP4 + i];
            let b1 = k_sh[(sk + 8u) * KP4 + i];
            let b2 = k_sh[(sk + 16u) * KP4 + i];
            let b3 = k_sh[(sk + 24u) * KP4 + i];
            c0 += a.x * b0.x + a.y * b0.y;
            c1 += a.x * b1.x + a.y * b1.y;
            c2 += a.x * b2.x + a.y * b2.y;
            c3 += a.x * b3.x + a.y * b3.y;
            c0 += a2.x * b0.z + a2.y * b0.w;
            c1 += a2.x * b1.z + a2.y * b1.w;
            c2 += a2.x * b2.z + a2.y * b2.w;
            c3 += a2.x * b3.z + a2.y * b3.w;
        }
#else
        for (var w = 0u; w < hw; w++) {
            let a = unpack2x16float(q_sh[sq * QP2 + w / 2u][w % 2u]);
            let b0 = k_pair(sk * HWP + w);
            let b1 = k_pair((sk + 8u) * HWP + w);
            let b2 = k_pair((sk + 16u) * HWP + w);
            let b3 = k_pair((sk + 24u) * HWP + w);
            c0 += a.x * b0.x + a.y * b0.y;
            c1 += a.x * b1.x + a.y * b1.y;
            c2 += a.x * b2.x + a.y * b2.y;
            c3 += a.x * b3.x + a.y * b3.y;
        }
#endif
        let s0 = select(NEG, c0 * p.scale, k0 + sk <= s_pos);
        let s1 = select(NEG, c1 * p.scale, k0 + sk + 8u <= s_pos);
        let s2 = select(NEG, c2 * p.scale, k0 + sk + 16u <= s_pos);
        let s3 = select(NEG, c3 * p.scale, k0 + sk + 24u <= s_pos);
        pm_sh[li] = max(max(s0, s1), max(s2, s3));
        workgroupBarrier();
        let pr = qi * 8u;
#if COOP_PV
        // The page's maximum of the row (sq = qi); the reference m is raised MARGIN above it
        // when the page passes it.
        let pmax = row_max(pr);
        var alpha = 1.0;
        if (pmax > m) {
            let mt = pmax + MARGIN;
            alpha = exp(m - mt);
            m = mt;
        }
        let e0 = exp(s0 - m);
        let e1 = exp(s1 - m);
        let e2 = exp(s2 - m);
        let e3 = exp(s3 - m);
        let prow = sq * PP + sk;
        put_p(e0, prow);
        put_p(e1, prow + 8u);
        put_p(e2, prow + 16u);
        put_p(e3, prow + 24u);
        // The row's Σe over its eight lanes (the same bits in each: pairwise sums commute).
        var rs = (e0 + e1) + (e2 + e3);
        rs += subgroupShuffleXor(rs, 1u);
        rs += subgroupShuffleXor(rs, 2u);
        rs += subgroupShuffleXor(rs, 4u);
        l = l * alpha + rs;
        if (sk == 0u) {
            row_sh[sq] = alpha;
        }
        // Raised references after the first page rescale what the accumulators hold.
        let up = subgroupAny(alpha != 1.0 && k0 > 0u);
        if (lane == 0u) {
            raised[sg] = u32(up);
        }
        let rf = workgroupUniformLoad(&raised);
        if ((rf[0] | rf[1] | rf[2] | rf[3] | rf[4] | rf[5] | rf[6] | rf[7]) != 0u) {
            o0 = rescale(o0, sg, lane, rb);
            if (two) {
                o1 = rescale(o1, sg, lane, rb);
            }
        }
        // O += P·V over the page's two 16-key halves, hi and lo parts of P.
        for (var ks = 0u; ks < BK; ks += 16u) {
            let ph = coopLoadT<coop_mat16x16<f16, A>>(&p_hi[rb * PP + ks], PP);
            let pl = coopLoadT<coop_mat16x16<f16, A>>(&p_lo[rb * PP + ks], PP);
            let v0 = coopLoadT<coop_mat16x16<f16, B>>(&v_h[ks * VHP4 + d0 / 4u], VHP4);
            o0 = coopMultiplyAdd(ph, v0, o0);
            o0 = coopMultiplyAdd(pl, v0, o0);
            if (two) {
                let v1 = coopLoadT<coop_mat16x16<f16, B>>(&v_h[ks * VHP4 + d0 / 4u + 4u], VHP4);
                o1 = coopMultiplyAdd(ph, v1, o1);
                o1 = coopMultiplyAdd(pl, v1, o1);
            }
        }
    }
    if (sk == 0u) {
        row_sh[32u + sq] = l * P_SCALE;
    }
    drain(o0, sg, lane, rb, d0, qb, blk.y, h);
    if (two) {
        drain(o1, sg, lane, rb, d0 + 16u, qb, blk.y, h);
    }
#else
        // The row's maximum so far (sq = qi: the row's eight threads hold its 32 scores).
        let mt = max(m, row_max(pr));
        let srow = sq * SP + sk;
        s_sh[srow] = exp(s0 - mt);
        s_sh[srow + 8u] = exp(s1 - mt);
        s_sh[srow + 16u] = exp(s2 - mt);
        s_sh[srow + 24u] = exp(s3 - mt);
        workgroupBarrier();
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
            let e = s_sh[qi * SP + j];
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
        let o = ((qb + qi) * p.n_head + h) * HD + 2u * w0;
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
#endif
}

// The page's largest score of a row: the maxima of its eight threads from pm_sh[pr..].
fn row_max(pr: u32) -> f32 {
    return max(
        max(max(pm_sh[pr], pm_sh[pr + 1u]), max(pm_sh[pr + 2u], pm_sh[pr + 3u])),
        max(max(pm_sh[pr + 4u], pm_sh[pr + 5u]), max(pm_sh[pr + 6u], pm_sh[pr + 7u])),
    );
}

#if COOP_PV
// Probability e of P at `at` of the parts: p' = e · P_SCALE as hi (p' rounded to F16, in
// integer arithmetic: the driver folds f32(f16(x)) to x) and lo = the F16 of p' − hi.
fn put_p(e: f32, at: u32) {
    let x = e * P_SCALE;
    let hi = round_f16(x);
    p_hi[at] = f16(hi);
    p_lo[at] = f16(x - hi);
}

// Accumulator `o` of rows rb.. times each row's factor in row_sh, through the subgroup's
// scratch (column-major: element i is row i % 16). The whole workgroup calls it.
fn rescale(o: coop_mat16x16<f32, C>, sg: u32, lane: u32, rb: u32) -> coop_mat16x16<f32, C> {
    let base = sg * 256u;
    coopStore(o, &o_sh[base], 16u);
    workgroupBarrier();
    for (var i = lane; i < 256u; i += 32u) {
        o_sh[base + i] *= row_sh[rb + i % 16u];
    }
    workgroupBarrier();
    return coopLoad<coop_mat16x16<f32, C>>(&o_sh[base], 16u);
}

// Accumulator `o` (rows rb.., head dims d..) divided by its rows' l · P_SCALE into `out`, for
// the block's n queries from token qb of head h; through the scratch row-major, so sixteen
// lanes store sixteen consecutive values. The whole workgroup calls it.
fn drain(o: coop_mat16x16<f32, C>, sg: u32, lane: u32, rb: u32, d: u32, qb: u32, n: u32, h: u32) {
    let base = sg * 256u;
    coopStoreT(o, &o_sh[base], 16u);
    workgroupBarrier();
    for (var i = lane; i < 256u; i += 32u) {
        let r = rb + i / 16u;
        if (r < n) {
            let at = ((qb + r) * p.n_head + h) * HD + d + i % 16u;
            out[at] = o_sh[base + i] / row_sh[32u + r];
        }
    }
    workgroupBarrier();
}
#else
// Two consecutive outputs from `at`.
fn store2(at: u32, v: vec2<f32>) {
    out[at] = v.x;
    out[at + 1u] = v.y;
}
#endif
