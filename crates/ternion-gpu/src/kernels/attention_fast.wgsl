// attention_fast.wgsl — single-token causal GQA attention with the "fast" numerics
// (docs/ARCHITECTURE.md): split-K over the KV pages, then a merge, two launches a layer.
// Serves every decode row: the one token of a single-token step, and each token flagged
// DECODE_ROW in a multi-token step (attention.wgsl's `prefill` skips those under FAST), so
// a sequence decoded beside others gets exactly the values it gets alone.
//
// Bindings (group 0; each entry point binds only those it uses):
//   0 uniform AttnParams { n_head, n_head_kv, head_dim, n_ctx, scale, max_chunks, pps, _ }
//                     (paged_kv.wgsl; max_chunks here = FAST_KEYS / PAGE)
//   2 storage read  q:     array<f32>        T × n_head·head_dim (rotated)
//   3 storage read  k4:    array<vec4<u32>>  the paged F16 key cache, 16 bytes at a time
//                                            (attention.wgsl's layout; head_dim % 8 == 0)
//   4 storage read  v_cache: array<u32>      the paged F16 value cache, two halves a word
//   5 storage rw    out:   array<f32>        T × n_head·head_dim
//   8 storage rw    part:  array<f32>        slots × n_head × max_chunks × (head_dim + 2):
//                                            per (sequence, head, page) Σ e·v, then m, l
//   9 storage read  toks:  array<vec2<u32>>  T × (position, sequence slot | DECODE_ROW)
//  10 storage read  pages: array<u32>        the page tables
//   6 storage read  k_raw: array<f32>        ROPE: T × kv_dim, the new keys (unrotated)
//   7 storage read  freqs: array<f32>        ROPE: rope_kv.wgsl's frequency divisors
//  11 storage read  v_raw: array<f32>        ROPE: T × kv_dim, the new values
//  12 uniform RopeParams                     ROPE: rope_kv.wgsl's (rope.wgsl)
// Variant ROPE (single-token steps; the file compiled with `#if ROPE` on): `split` rotates its group's query heads itself
// (rope.wgsl, the same bits as rope_kv.wgsl) and the workgroup whose page holds the new
// position rotates and stores that kv head's key and value into the cache (one writer per
// kv head) before reading the page, so a decode step runs no rope_kv launch.
// Dispatch: `split` (n_head_kv, ceil(n_keys / PAGE), T): one workgroup per (kv head, page
// of keys, token) computes, for each of the G = n_head / n_head_kv query heads sharing the
// kv head, the page's scores s = f16(q)·k · scale, m = max s, e = exp(s − m), l = Σ e and
// Σ e·v. `merge` (n_head, 1, T): M = max over pages of m, w_c = exp(m_c − M), out =
// Σ_c w_c·(Σ e·v)_c / Σ_c w_c·l_c, the pages summed in a fixed order. Rows that are not
// decode rows, or whose context exceeds FAST_KEYS, are left to attention.wgsl.

const WG: u32 = 256u;
const FAST_KEYS: u32 = 2048u;
// Query values of one kv group: G · head_dim ≤ MAX_GQ.
const MAX_GQ: u32 = 2048u;

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
#if ROPE
@group(0) @binding(3) var<storage, read_write> k4: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(6) var<storage, read> k_raw: array<f32>;
@group(0) @binding(7) var<storage, read> freqs: array<f32>;
@group(0) @binding(11) var<storage, read> v_raw: array<f32>;
@group(0) @binding(12) var<uniform> rp: RopeParams;
#else
@group(0) @binding(3) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> v_cache: array<u32>;
#endif
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<storage, read_write> part: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;

var<workgroup> tok_sh: vec2<u32>;
var<workgroup> q_sh: array<f32, MAX_GQ>;
var<workgroup> e_sh: array<f32, 1024>;
var<workgroup> ml_sh: array<vec2<f32>, 64>;
var<workgroup> acc_sh: array<vec2<f32>, WG>;

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
    return ((slot * p.n_head + h) * p.max_chunks + c) * (p.head_dim + 2u);
}

// Σ over the 8 halves of key word vector `w` times q_sh[o ..= o + 7].
fn dot8(w: vec4<u32>, o: u32) -> f32 {
    let a = unpack2x16float(w.x);
    let b = unpack2x16float(w.y);
    let c = unpack2x16float(w.z);
    let d = unpack2x16float(w.w);
    return a.x * q_sh[o] + a.y * q_sh[o + 1u] + b.x * q_sh[o + 2u] + b.y * q_sh[o + 3u]
        + c.x * q_sh[o + 4u] + c.y * q_sh[o + 5u] + d.x * q_sh[o + 6u] + d.y * q_sh[o + 7u];
}

// f16(q)·k · scale of query head g of the group (q_sh) against key row `row` of kv head
// kvh: eight 16-byte loads in flight at a time (a 128-wide head in two round trips),
// summed four at a time in order.
fn score(row: u32, kvh: u32, g: u32) -> f32 {
    let hv = p.head_dim / 8u;
    let base = (row * p.n_head_kv + kvh) * hv;
    let q0 = g * p.head_dim;
    var acc = 0.0;
    var i = 0u;
    for (; i + 8u <= hv; i += 8u) {
        let w0 = k4[base + i];
        let w1 = k4[base + i + 1u];
        let w2 = k4[base + i + 2u];
        let w3 = k4[base + i + 3u];
        let w4 = k4[base + i + 4u];
        let w5 = k4[base + i + 5u];
        let w6 = k4[base + i + 6u];
        let w7 = k4[base + i + 7u];
        let o = q0 + 8u * i;
        acc += dot8(w0, o) + dot8(w1, o + 8u) + dot8(w2, o + 16u) + dot8(w3, o + 24u);
        acc += dot8(w4, o + 32u) + dot8(w5, o + 40u) + dot8(w6, o + 48u) + dot8(w7, o + 56u);
    }
    for (; i + 4u <= hv; i += 4u) {
        let w0 = k4[base + i];
        let w1 = k4[base + i + 1u];
        let w2 = k4[base + i + 2u];
        let w3 = k4[base + i + 3u];
        acc += dot8(w0, q0 + 8u * i) + dot8(w1, q0 + 8u * i + 8u) + dot8(w2, q0 + 8u * i + 16u)
            + dot8(w3, q0 + 8u * i + 24u);
    }
    for (; i < hv; i++) {
        acc += dot8(k4[base + i], q0 + 8u * i);
    }
    return acc * p.scale;
}

#if ROPE
// Element i of q (which 0) or of the new keys (which 1), for rope.wgsl's `rope_words`.
fn rope_src(which: u32, i: u32) -> f32 {
    if (which == 0u) {
        return q[i];
    }
    return k_raw[i];
}

// ROPE: the group's G query heads (from element qbase of q) rotated into q_sh, F16-rounded.
fn rope_q(qbase: u32, gq: u32, pos: u32, li: u32) {
    let hd = p.head_dim;
    let hw = hd / 2u;
    for (var i = li; i < gq * hw; i += WG) {
        let g = i / hw;
        let r = rope_words(0u, qbase + g * hd, i % hw, pos, rp.n_rot, rp.mode, rp.theta_scale, rp.has_freqs);
        let o = g * hd;
        if (r.n >= 1u) {
            q_sh[o + r.i0] = round_f16(r.v0.x);
            q_sh[o + r.i0 + 1u] = round_f16(r.v0.y);
        }
        if (r.n == 2u) {
            q_sh[o + r.i1] = round_f16(r.v1.x);
            q_sh[o + r.i1 + 1u] = round_f16(r.v1.y);
        }
    }
}

// Word w of the key cache (k4 holds four words a vec4).
fn put_k(w: u32, bits: u32) {
    k4[w / 4u][w % 4u] = bits;
}

// ROPE: kv head kvh of token t, rotated key and value, stored at (slot, pos) as rope_kv.wgsl
// stores them.
fn store_kv(t: u32, kvh: u32, slot: u32, pos: u32, li: u32) {
    let hd = p.head_dim;
    let hw = hd / 2u;
    let kv_dim = p.n_head_kv * hd;
    let crow = (pages[slot * p.pps + pos / PAGE] * PAGE + pos % PAGE) * kv_dim / 2u;
    let cbase = crow + kvh * hw;
    let base = t * kv_dim + kvh * hd;
    for (var j = li; j < hw; j += WG) {
        let r = rope_words(1u, base, j, pos, rp.n_rot, rp.mode, rp.theta_scale, rp.has_freqs);
        if (r.n >= 1u) {
            put_k(cbase + r.i0 / 2u, pack_f16(r.v0.x, r.v0.y));
        }
        if (r.n == 2u) {
            put_k(cbase + r.i1 / 2u, pack_f16(r.v1.x, r.v1.y));
        }
        v_cache[cbase + j] = pack_f16(v_raw[base + 2u * j], v_raw[base + 2u * j + 1u]);
    }
}
#endif

// acc + e · the value pair `v` when the key exists (rows past cnt exist, whole pages, but
// hold no key of this sequence).
fn pv(acc: vec2<f32>, e: f32, v: u32, live: bool) -> vec2<f32> {
    return acc + e * select(vec2<f32>(0.0), unpack2x16float(v), live);
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
    let gq = p.n_head / p.n_head_kv;
    let hd = p.head_dim;
    let qbase = (t * p.n_head + kvh * gq) * hd;
#if ROPE
    let pos = n_keys - 1u;
    rope_q(qbase, gq, pos, li);
    if (c == pos / PAGE) {
        store_kv(t, kvh, slot, pos, li);
    }
    // This workgroup reads the row it stored below.
    storageBarrier();
#else
    for (var i = li; i < gq * hd; i += WG) {
        q_sh[i] = round_f16(q[qbase + i]);
    }
#endif
    workgroupBarrier();
    let row0 = pages[slot * p.pps + c] * PAGE;
    let cnt = min(PAGE, n_keys - c * PAGE);
    // Scores: pair (head g, key j) at g·PAGE + j.
    for (var pr = li; pr < gq * PAGE; pr += WG) {
        let j = pr % PAGE;
        var s = NEG;
        if (j < cnt) {
            s = score(row0 + j, kvh, pr / PAGE);
        }
        e_sh[pr] = s;
    }
    workgroupBarrier();
    // Per head: m, e = exp(s − m), l (a thread per head, keys in order).
    for (var g = li; g < gq; g += WG) {
        var m = NEG;
        for (var j = 0u; j < cnt; j++) {
            m = max(m, e_sh[g * PAGE + j]);
        }
        var l = 0.0;
        for (var j = 0u; j < PAGE; j++) {
            var e = 0.0;
            if (j < cnt) {
                e = exp(e_sh[g * PAGE + j] - m);
            }
            e_sh[g * PAGE + j] = e;
            l += e;
        }
        ml_sh[g] = vec2<f32>(m, l);
    }
    workgroupBarrier();
    // Σ e·v: a thread per (head g, word w of the head), keys in order, eight loads in
    // flight at a time.
    let hw = hd / 2u;
    let rs = p.n_head_kv * hw;
    for (var pw = li; pw < gq * hw; pw += WG) {
        let g = pw / hw;
        let w = pw % hw;
        var acc = vec2<f32>(0.0);
        for (var j = 0u; j < PAGE; j += 8u) {
            let a = ((row0 + j) * p.n_head_kv + kvh) * hw + w;
            let v0 = v_cache[a];
            let v1 = v_cache[a + rs];
            let v2 = v_cache[a + 2u * rs];
            let v3 = v_cache[a + 3u * rs];
            let v4 = v_cache[a + 4u * rs];
            let v5 = v_cache[a + 5u * rs];
            let v6 = v_cache[a + 6u * rs];
            let v7 = v_cache[a + 7u * rs];
            let e = g * PAGE + j;
            acc = pv(acc, e_sh[e], v0, j < cnt);
            acc = pv(acc, e_sh[e + 1u], v1, j + 1u < cnt);
            acc = pv(acc, e_sh[e + 2u], v2, j + 2u < cnt);
            acc = pv(acc, e_sh[e + 3u], v3, j + 3u < cnt);
            acc = pv(acc, e_sh[e + 4u], v4, j + 4u < cnt);
            acc = pv(acc, e_sh[e + 5u], v5, j + 5u < cnt);
            acc = pv(acc, e_sh[e + 6u], v6, j + 6u < cnt);
            acc = pv(acc, e_sh[e + 7u], v7, j + 7u < cnt);
        }
        let b = part_base(slot, kvh * gq + g, c);
        part[b + 2u * w] = acc.x;
        part[b + 2u * w + 1u] = acc.y;
        if (w == 0u) {
            part[b + hd] = ml_sh[g].x;
            part[b + hd + 1u] = ml_sh[g].y;
        }
    }
}

@compute @workgroup_size(256)
fn merge(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
) {
    let h = wg.x;
    let t = wg.z;
    let dk = decode_keys(t, nw.z, li);
    let n_keys = dk.x;
    let slot = dk.y;
    if (n_keys == 0u) {
        return;
    }
    let hd = p.head_dim;
    let n_pages = (n_keys + PAGE - 1u) / PAGE;
    if (li < n_pages) {
        let b = part_base(slot, h, li);
        ml_sh[li] = vec2<f32>(part[b + hd], part[b + hd + 1u]);
    }
    workgroupBarrier();
    var mx = NEG;
    for (var c = 0u; c < n_pages; c++) {
        mx = max(mx, ml_sh[c].x);
    }
    var l = 0.0;
    for (var c = 0u; c < n_pages; c++) {
        l += ml_sh[c].y * exp(ml_sh[c].x - mx);
    }
    // A thread per (word w, page group pg); groups summed in order through acc_sh.
    let hw = hd / 2u;
    let groups = WG / hw;
    let pg = li / hw;
    let w = li % hw;
    var acc = vec2<f32>(0.0);
    if (pg < groups) {
        for (var c = pg; c < n_pages; c += groups) {
            let b = part_base(slot, h, c) + 2u * w;
            acc += exp(ml_sh[c].x - mx) * vec2<f32>(part[b], part[b + 1u]);
        }
    }
    acc_sh[li] = acc;
    workgroupBarrier();
    if (li < hw) {
        var s = vec2<f32>(0.0);
        for (var g = 0u; g < groups; g++) {
            s += acc_sh[g * hw + li];
        }
        let o = (t * p.n_head + h) * hd + 2u * li;
        out[o] = s.x / l;
        out[o + 1u] = s.y / l;
    }
}
