// attention_fast.wgsl — single-token causal GQA attention with the "fast" numerics
// (docs/ARCHITECTURE.md): split-K over the KV pages, merged by the last workgroup of each
// kv head, one launch a layer. Serves every decode row: the one token of a single-token
// step, and each token flagged DECODE_ROW in a multi-token step (attention.wgsl's `prefill`
// skips those under FAST), so a sequence decoded beside others gets exactly the values it
// gets alone.
//
// Bindings (group 0):
//   0 uniform AttnParams { n_head, n_head_kv, head_dim, n_ctx, scale, max_chunks, pps, _ }
//                     (paged_kv.wgsl; max_chunks here = FAST_KEYS / PAGE)
//   2 storage read  q:     array<f32>        T × n_head·head_dim (rotated)
//   3 storage read  k4:    array<KvWord4>   the paged key cache, four words at a time (16
//                                            bytes of F16: kv_type.wgsl)
//                                            (attention.wgsl's layout; head_dim % 8 == 0)
//   4 storage read  v_cache: array<KvWord>   the paged value cache, two elements a word
//   5 storage rw    out:   array<f32>        T × n_head·head_dim
//   8 storage rw    part:  array<f32>        slots × n_head × max_chunks × (head_dim + 2):
//                                            per (sequence, head, page) Σ e·v, then m, l
//   9 storage read  toks:  array<vec2<u32>>  T × (position, sequence slot | DECODE_ROW)
//  10 storage read  pages: array<u32>        the page tables
//  13 storage rw    done:  array<atomic<u32>> slots × n_head_kv: pages finished for the
//                                            (sequence, kv head); 0 between launches
//   6 storage read  k_raw: array<f32>        ROPE: T × kv_dim, the new keys (unrotated)
//   7 storage read  rope_tab: array<vec2<f32>>  ROPE: rope_table.wgsl's (cos θ, sin θ)
//  11 storage read  v_raw: array<f32>        ROPE: T × kv_dim, the new values
//  12 uniform RopeParams                     ROPE: rope_kv.wgsl's (rope.wgsl)
// Variant ROPE (single-token steps; the file compiled with `#if ROPE` on): the workgroup
// rotates its group's query heads itself (rope.wgsl, the same bits as rope_kv.wgsl) and
// the one whose page holds the new position rotates and stores that kv head's key and
// value into the cache (one writer per kv head), so a decode step runs no rope_kv launch.
// The angles come from rope_table.wgsl's table.
// Dispatch (n_head_kv, ceil(n_keys / PAGE), T): one workgroup per (kv head, page of keys,
// token) computes, for each of the G = n_head / n_head_kv query heads sharing the kv
// head, the page's scores s = f16(q)·k · scale, m = max s, e = exp(s − m), l = Σ e and
// Σ e·v, into `part`. A key's row is read by 8 threads (slices of consecutive 16-byte
// words, each summing its part of every head's product; the slices added in order), and
// each thread's first values are loaded before the scores, so both caches' latencies
// overlap (head_dim ≤ 256, G · head_dim ≤ MAX_GQ). Then the workgroup counts itself done
// (a device-scope storageBarrier before the atomic: its partial sums are visible to
// whoever counts last), and the last of the row's pages merges the G heads: M = max over
// pages of m, w_c = exp(m_c − M), out = Σ_c w_c·(Σ e·v)_c / Σ_c w_c·l_c, pages summed in
// order, and sets the counter back to 0. No workgroup waits for another, so the kernel needs no
// guarantee that workgroups run concurrently. Rows that are not decode rows, or whose
// context exceeds FAST_KEYS, are left to attention.wgsl.

// The head width and the query heads a kv head, the host's pipeline constants (the same as
// p.head_dim and p.n_head / p.n_head_kv): divisions by them fold to multiplications.
override HD: u32 = 128u;
override GQ: u32 = 4u;
const WG: u32 = 256u;
const FAST_KEYS: u32 = 2048u;
// Query values of one kv group: G · head_dim ≤ MAX_GQ (and head_dim ≤ 256).
const MAX_GQ: u32 = 1024u;

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
#if ROPE
@group(0) @binding(3) var<storage, read_write> k4: array<KvWord4>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<KvWord>;
@group(0) @binding(6) var<storage, read> k_raw: array<f32>;
@group(0) @binding(7) var<storage, read> rope_tab: array<vec2<f32>>;
@group(0) @binding(11) var<storage, read> v_raw: array<f32>;
@group(0) @binding(12) var<uniform> rp: RopeParams;
#else
@group(0) @binding(3) var<storage, read> k4: array<KvWord4>;
@group(0) @binding(4) var<storage, read> v_cache: array<KvWord>;
#endif
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read_write> part: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;
@group(0) @binding(13) var<storage, read_write> done: array<atomic<u32>>;

// Pages a merge reads at most (FAST_KEYS / PAGE), and query heads it stages at a time.
const MAX_PAGES: u32 = 64u;
const MERGE_HEADS: u32 = 8u;
// Threads a key row is split over for the scores (PAGE × SLICES = WG).
const SLICES: u32 = 8u;

var<workgroup> tok_sh: vec2<u32>;
// The group's queries; in the merge, each head's m (first half) and l (second half) per page.
var<workgroup> q_sh: array<f32, MAX_GQ>;
// Scores (head g, key j) at g·PAGE + j.
var<workgroup> s_sh: array<f32, 1024>;
// Partial dot products of four heads (head, key, slice); then probabilities e like s_sh.
var<workgroup> p_sh: array<f32, 1024>;
var<workgroup> ticket_sh: u32;

// Token t of the step, made uniform; the number of its keys, or 0 when this file does not
// handle it (not a decode row, or a context past FAST_KEYS).
fn decode_keys(t: u32, n_tokens: u32, li: u32) -> vec2<u32> {
    if (li == 0u) {
        tok_sh = toks[t];
    }
    let tk = workgroupUniformLoad(&tok_sh);
    let n_keys = tk.x + 1u;
    let decode = n_tokens == 1u || (tk.y & DECODE_ROW) != 0u;
    if (!decode || n_keys > FAST_KEYS) {
        return vec2<u32>(0u, 0u);
    }
    return vec2<u32>(n_keys, tk.y & SLOT_MASK);
}

// Offset in `part` of (slot, head h, page c).
fn part_base(slot: u32, h: u32, c: u32) -> u32 {
    return ((slot * p.n_head + h) * p.max_chunks + c) * (HD + 2u);
}

// Σ over the 8 elements of key words `w` times q_sh[o ..= o + 7].
fn dot8(w: KvWord4, o: u32) -> f32 {
    let a = kv_unpack(w[0]);
    let b = kv_unpack(w[1]);
    let c = kv_unpack(w[2]);
    let d = kv_unpack(w[3]);
    return a.x * q_sh[o] + a.y * q_sh[o + 1u] + b.x * q_sh[o + 2u] + b.y * q_sh[o + 3u]
        + c.x * q_sh[o + 4u] + c.y * q_sh[o + 5u] + d.x * q_sh[o + 6u] + d.y * q_sh[o + 7u];
}

// The four-word groups of a key row that slice `sl` reads: groups sl, sl + 8, sl + 16,
// sl + 24 of the row (zero past head_dim / 8), so the slices of a key read consecutive words.
struct KeyWords {
    k0: KvWord4,
    k1: KvWord4,
    k2: KvWord4,
    k3: KvWord4,
}

// Slice `sl` of key row `row` of kv head kvh.
fn key_words(row: u32, kvh: u32, sl: u32) -> KeyWords {
    let hv = HD / 8u;
    let base = (row * p.n_head_kv + kvh) * hv + sl;
    var r: KeyWords;
    if (sl < hv) {
        r.k0 = k4[base];
    }
    if (sl + 8u < hv) {
        r.k1 = k4[base + 8u];
    }
    if (sl + 16u < hv) {
        r.k2 = k4[base + 16u];
    }
    if (sl + 24u < hv) {
        r.k3 = k4[base + 24u];
    }
    return r;
}

// Slice `sl`'s part of f16(q)·k for query head g of the group (q_sh).
fn slice_dot(k: KeyWords, g: u32, sl: u32) -> f32 {
    let hv = HD / 8u;
    let o = g * HD + 8u * sl;
    var d = 0.0;
    if (sl < hv) {
        d += dot8(k.k0, o);
    }
    if (sl + 8u < hv) {
        d += dot8(k.k1, o + 64u);
    }
    if (sl + 16u < hv) {
        d += dot8(k.k2, o + 128u) + dot8(k.k3, o + 192u);
    }
    return d;
}

#if ROPE
// (cos θ, sin θ) of pair i at `pos` for rope.wgsl's `rope_words` (rope_table.wgsl).
fn rope_cs(pos: u32, i: u32) -> vec2<f32> {
    return rope_tab[pos * (rp.n_rot / 2u) + i];
}

// Element i of q (which 0) or of the new keys (which 1), for rope.wgsl's `rope_words`.
fn rope_src(which: u32, i: u32) -> f32 {
    if (which == 0u) {
        return q[i];
    }
    return k_raw[i];
}

// ROPE: the group's G query heads (from element qbase of q) rotated into q_sh (kv_round).
fn rope_q(qbase: u32, gq: u32, pos: u32, li: u32) {
    let hd = HD;
    let hw = hd / 2u;
    for (var i = li; i < gq * hw; i += WG) {
        let g = i / hw;
        let r = rope_words(0u, qbase + g * hd, i % hw, pos, rp.n_rot, rp.mode);
        let o = g * hd;
        if (r.n >= 1u) {
            q_sh[o + r.i0] = kv_round(r.v0.x);
            q_sh[o + r.i0 + 1u] = kv_round(r.v0.y);
        }
        if (r.n == 2u) {
            q_sh[o + r.i1] = kv_round(r.v1.x);
            q_sh[o + r.i1 + 1u] = kv_round(r.v1.y);
        }
    }
}

// Word w of the key cache (k4 holds four words an element).
fn put_k(w: u32, word: KvWord) {
    k4[w / 4u][w % 4u] = word;
}

// ROPE: kv head kvh of token t, rotated key and value, stored at (slot, pos) as rope_kv.wgsl
// stores them.
fn store_kv(t: u32, kvh: u32, slot: u32, pos: u32, li: u32) {
    let hd = HD;
    let hw = hd / 2u;
    let kv_dim = p.n_head_kv * hd;
    let crow = (pages[slot * p.pps + pos / PAGE] * PAGE + pos % PAGE) * kv_dim / 2u;
    let cbase = crow + kvh * hw;
    let base = t * kv_dim + kvh * hd;
    for (var j = li; j < hw; j += WG) {
        let r = rope_words(1u, base, j, pos, rp.n_rot, rp.mode);
        if (r.n >= 1u) {
            put_k(cbase + r.i0 / 2u, kv_pack(r.v0.x, r.v0.y));
        }
        if (r.n == 2u) {
            put_k(cbase + r.i1 / 2u, kv_pack(r.v1.x, r.v1.y));
        }
        v_cache[cbase + j] = kv_pack(v_raw[base + 2u * j], v_raw[base + 2u * j + 1u]);
    }
}
#endif

// The value words of one (head word, page) item: key j's in component j % 4 of vj/4.
struct Vals {
    v0: KvWord4,
    v1: KvWord4,
    v2: KvWord4,
    v3: KvWord4,
    v4: KvWord4,
    v5: KvWord4,
    v6: KvWord4,
    v7: KvWord4,
}

// Four value words of consecutive keys from word `a` (rows `rs` words apart).
fn load4(a: u32, rs: u32) -> KvWord4 {
    return KvWord4(v_cache[a], v_cache[a + rs], v_cache[a + 2u * rs], v_cache[a + 3u * rs]);
}

// Word w of kv head kvh for the page's 32 keys from cache row `row0` (32 loads in flight).
fn load_vals(row0: u32, kvh: u32, w: u32) -> Vals {
    let rs = p.n_head_kv * (HD / 2u);
    let a = (row0 * p.n_head_kv + kvh) * (HD / 2u) + w;
    return Vals(
        load4(a, rs),
        load4(a + 4u * rs, rs),
        load4(a + 8u * rs, rs),
        load4(a + 12u * rs, rs),
        load4(a + 16u * rs, rs),
        load4(a + 20u * rs, rs),
        load4(a + 24u * rs, rs),
        load4(a + 28u * rs, rs),
    );
}

// acc + e · the value pair `v` when the key exists (rows past cnt exist, whole pages, but
// hold no key of this sequence).
fn pv(acc: vec2<f32>, e: f32, v: KvWord, live: bool) -> vec2<f32> {
    return acc + e * select(vec2<f32>(0.0), kv_unpack(v), live);
}

// Σ e·v over keys 4i..4i+3 of head g (p_sh), in key order.
fn pv4(acc: vec2<f32>, v: KvWord4, g: u32, i: u32, cnt: u32) -> vec2<f32> {
    let e = g * PAGE + 4u * i;
    var r = pv(acc, p_sh[e], v[0], 4u * i < cnt);
    r = pv(r, p_sh[e + 1u], v[1], 4u * i + 1u < cnt);
    r = pv(r, p_sh[e + 2u], v[2], 4u * i + 2u < cnt);
    return pv(r, p_sh[e + 3u], v[3], 4u * i + 3u < cnt);
}

// Σ e·v of head g over the page's keys, in key order.
fn pv_page(vs: Vals, g: u32, cnt: u32) -> vec2<f32> {
    var acc = pv4(vec2<f32>(0.0), vs.v0, g, 0u, cnt);
    acc = pv4(acc, vs.v1, g, 1u, cnt);
    acc = pv4(acc, vs.v2, g, 2u, cnt);
    acc = pv4(acc, vs.v3, g, 3u, cnt);
    acc = pv4(acc, vs.v4, g, 4u, cnt);
    acc = pv4(acc, vs.v5, g, 5u, cnt);
    acc = pv4(acc, vs.v6, g, 6u, cnt);
    return pv4(acc, vs.v7, g, 7u, cnt);
}

// The last page of (slot, kv head kvh) to finish merges the group's heads of token t:
// their m and l per page staged in q_sh (MERGE_HEADS heads at a time), then a thread per
// (head, word) sums the pages in order, four at a time.
fn merge_group(slot: u32, kvh: u32, t: u32, n_pages: u32, li: u32) {
    let gq = GQ;
    let hd = HD;
    let hw = hd / 2u;
    let lofs = MERGE_HEADS * MAX_PAGES;
    for (var g0 = 0u; g0 < gq; g0 += MERGE_HEADS) {
        let gn = min(MERGE_HEADS, gq - g0);
        workgroupBarrier();
        for (var i = li; i < gn * n_pages; i += WG) {
            let g = i / n_pages;
            let c = i % n_pages;
            let b = part_base(slot, kvh * gq + g0 + g, c) + hd;
            q_sh[g * MAX_PAGES + c] = part[b];
            q_sh[lofs + g * MAX_PAGES + c] = part[b + 1u];
        }
        workgroupBarrier();
        for (var pw = li; pw < gn * hw; pw += WG) {
            let g = pw / hw;
            let w = pw % hw;
            let ms = g * MAX_PAGES;
            var mx = NEG;
            for (var c = 0u; c < n_pages; c++) {
                mx = max(mx, q_sh[ms + c]);
            }
            let h = kvh * gq + g0 + g;
            var l = 0.0;
            var acc = vec2<f32>(0.0);
            var c = 0u;
            let st = hd + 2u;
            for (; c + 4u <= n_pages; c += 4u) {
                let b = part_base(slot, h, c) + 2u * w;
                let v0 = vec2<f32>(part[b], part[b + 1u]);
                let v1 = vec2<f32>(part[b + st], part[b + st + 1u]);
                let v2 = vec2<f32>(part[b + 2u * st], part[b + 2u * st + 1u]);
                let v3 = vec2<f32>(part[b + 3u * st], part[b + 3u * st + 1u]);
                let w0 = exp(q_sh[ms + c] - mx);
                let w1 = exp(q_sh[ms + c + 1u] - mx);
                let w2 = exp(q_sh[ms + c + 2u] - mx);
                let w3 = exp(q_sh[ms + c + 3u] - mx);
                l += q_sh[lofs + ms + c] * w0;
                l += q_sh[lofs + ms + c + 1u] * w1;
                l += q_sh[lofs + ms + c + 2u] * w2;
                l += q_sh[lofs + ms + c + 3u] * w3;
                acc += w0 * v0;
                acc += w1 * v1;
                acc += w2 * v2;
                acc += w3 * v3;
            }
            for (; c < n_pages; c++) {
                let b = part_base(slot, h, c) + 2u * w;
                let wc = exp(q_sh[ms + c] - mx);
                l += q_sh[lofs + ms + c] * wc;
                acc += wc * vec2<f32>(part[b], part[b + 1u]);
            }
            let o = (t * p.n_head + h) * hd + 2u * w;
            out[o] = acc.x / l;
            out[o + 1u] = acc.y / l;
        }
    }
}

// Max over the page's scores of head g (s_sh).
fn head_max(g: u32) -> f32 {
    var m = NEG;
    for (var k = 0u; k < PAGE; k++) {
        m = max(m, s_sh[g * PAGE + k]);
    }
    return m;
}

@compute @workgroup_size(256)
fn split(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
) {
    let kvh = wg.x;
    let c = wg.y;
    let t = wg.z;
    let dk = decode_keys(t, nw.z, li);
    let n_keys = dk.x;
    let slot = dk.y;
    if (c * PAGE >= n_keys) {
        return;
    }
    let gq = GQ;
    let hd = HD;
    let hw = hd / 2u;
    let qbase = (t * p.n_head + kvh * gq) * hd;
#if ROPE
    let pos = n_keys - 1u;
    rope_q(qbase, gq, pos, li);
    if (c == pos / PAGE) {
        store_kv(t, kvh, slot, pos, li);
        // This workgroup reads the row it stored below.
        storageBarrier();
    }
#else
    for (var i = li; i < gq * hd; i += WG) {
        q_sh[i] = kv_round(q[qbase + i]);
    }
#endif
    let row0 = pages[slot * p.pps + c] * PAGE;
    let cnt = min(PAGE, n_keys - c * PAGE);
    // This thread's first (head, word) item's values, in flight during the scores.
    var first: Vals;
    if (li < gq * hw) {
        first = load_vals(row0, kvh, li % hw);
    }
    workgroupBarrier();
    // Scores: thread (key j, slice sl) holds its words of key j and sums its part of each
    // head's dot product into p_sh, four heads at a time; a thread per (head, key) adds the
    // slices in order.
    let sl = li % SLICES;
    let j = li / SLICES;
    let kw = key_words(row0 + j, kvh, sl);
    for (var g0 = 0u; g0 < gq; g0 += 4u) {
        for (var gi = 0u; gi < 4u && g0 + gi < gq; gi++) {
            p_sh[gi * WG + li] = slice_dot(kw, g0 + gi, sl);
        }
        workgroupBarrier();
        let gi = li / PAGE;
        let jk = li % PAGE;
        if (li < 4u * PAGE && g0 + gi < gq) {
            var d = 0.0;
            for (var k = 0u; k < SLICES; k++) {
                d += p_sh[gi * WG + jk * SLICES + k];
            }
            s_sh[(g0 + gi) * PAGE + jk] = select(NEG, d * p.scale, jk < cnt);
        }
        workgroupBarrier();
    }
    // e = exp(s − m), m the head's max over the page.
    for (var pr = li; pr < gq * PAGE; pr += WG) {
        let g = pr / PAGE;
        var e = 0.0;
        if (pr % PAGE < cnt) {
            e = exp(s_sh[pr] - head_max(g));
        }
        p_sh[pr] = e;
    }
    workgroupBarrier();
    // Σ e·v: a thread per (head g, word w of the head), keys in order.
    for (var pw = li; pw < gq * hw; pw += WG) {
        let g = pw / hw;
        let w = pw % hw;
        var vs = first;
        if (pw != li) {
            vs = load_vals(row0, kvh, w);
        }
        let acc = pv_page(vs, g, cnt);
        let b = part_base(slot, kvh * gq + g, c);
        part[b + 2u * w] = acc.x;
        part[b + 2u * w + 1u] = acc.y;
        if (w == 0u) {
            var l = 0.0;
            for (var k = 0u; k < PAGE; k++) {
                l += p_sh[g * PAGE + k];
            }
            part[b + hd] = head_max(g);
            part[b + hd + 1u] = l;
        }
    }
    // Count this page done; the last one merges (its partial sums visible first).
    storageBarrier();
    let counter = slot * p.n_head_kv + kvh;
    if (li == 0u) {
        ticket_sh = atomicAdd(&done[counter], 1u);
    }
    let n_pages = (n_keys + PAGE - 1u) / PAGE;
    if (workgroupUniformLoad(&ticket_sh) + 1u < n_pages) {
        return;
    }
    storageBarrier();
    if (li == 0u) {
        atomicStore(&done[counter], 0u);
    }
    merge_group(slot, kvh, t, n_pages, li);
}
