// attention.wgsl — causal grouped-query attention over the layer's paged KV cache
// (rope_kv.wgsl writes it; F16 or F32: kv_type.wgsl): out = softmax(f16(q)·Kᵀ · scale) · V
// per head (q rounded to F16 over an F16 cache only), q head h reading
// kv head h / (n_head / n_head_kv). Token t, at position toks[t].x of sequence slot
// toks[t].y, sees that sequence's keys 0 ..= toks[t].x (the tokens of one step may belong
// to different sequences: batched decoding).
//
// Bindings (group 0; each entry point binds only those it uses):
//   0 uniform AttnParams { n_head, n_head_kv, head_dim, n_ctx, scale, max_chunks, pps, _ }:
//                     n_ctx = most positions of one sequence; pps = page-table entries per
//                     sequence
//   2 storage read  q:       array<f32>   T × n_head·head_dim (rotated)
//   3 storage read  k_cache: array<KvWord> pages × PAGE rows of kv_dim elements, two a
//                                         word; (seq s, position i) is row
//                                         pages[s·pps + i / PAGE]·PAGE + i % PAGE
//   4 storage read  v_cache: array<KvWord> same layout
//   5 storage rw    out:     array<f32>   T × n_head·head_dim
//   6 storage rw    scores:  array<f32>   n_head × n_ctx          (decode scratch)
//   7 storage rw    stats:   array<vec2<f32>>  T × n_head × max_chunks (chunk max, chunk Σe;
//                                         row 0 for single-token decode)
//   8 storage rw    partial: array<f32>   max_chunks × n_head·head_dim
//   9 storage read  toks:    array<vec2<u32>>  T × (position, sequence slot); for a non-causal
//                                         model each position is the last of its sequence's
//                                         tokens in the step (ops/paged.rs attn_toks)
//  10 storage read  pages:   array<u32>   slots × pps page ids (the page tables)
//
// Entry points and dispatch (256 threads per workgroup; CHUNK = 256 keys):
// - Single-token decode, flash-decoding split over chunks of CHUNK keys:
//   `scores_main` (n_chunks, n_head, 1): a thread per key: s = f16(q)·k · scale → scores; the
//              chunk's max m_c and Σ exp(s − m_c) → stats.
//   `probs_pv` (n_chunks, n_head, 1): merges the chunk stats into the global max M and sum
//              L = Σ_c l_c·exp(m_c − M), forms p = exp(s − M) / L (rounded to F16 when
//              ROUND_P: the reference's decode numerics) and this chunk's Σ p·v → partial.
//   `merge`    (ceil(n_head·head_dim/2 / 256), 1, 1): out = Σ_c partial (a thread per pair).
//   n_chunks = ceil((pos + 1) / CHUNK) is chosen by the host when recording.
// - Several tokens (a prompt, or one token of each of several sequences):
//   `prefill` (n_head, T, 1): one workgroup per (head, token) walks its keys in
//   chunks of CHUNK with an online softmax (running max and sum, rescaling the
//   accumulators); probabilities stay f32, as in the reference's batch numerics. A token
//   flagged DECODE_ROW in toks (the one token of its sequence in a step of several
//   sequences) instead repeats the decode split's arithmetic (`decode_row`): bit-identical
//   to decoding it alone.
// Under FAST (numerics "fast"), `prefill` leaves the decode rows of up to FAST_KEYS keys
// to attention_fast.wgsl, and under TILED every other row to attention_prompt.wgsl.
// In P·V a thread owns one word (2 dims) of the head and one of 256 / (head_dim/2) key
// groups; the groups are summed through shared memory. head_dim must be even and ≤ 512.
//
// Numerics against backend/cpu/attention.rs: q is rounded to F16 (RNE, in integer
// arithmetic: WGSL leaves f32→f16 conversion rounding to the implementation); q·k products
// of two F16 values are exact in f32, only the summation order differs. The CPU sums the
// softmax in f64, the GPU in f32 (per chunk, then rescaled); P·V accumulates in a different
// order. The f16 helpers are duplicated from rope_kv.wgsl (WGSL has no includes).

const WG: u32 = 256u;
const CHUNK: u32 = 256u;
const MAX_HD: u32 = 512u;

override ROUND_P: bool = false;
// Numerics "fast": decode rows of up to FAST_KEYS keys belong to attention_fast.wgsl.
override FAST: bool = false;
// attention_prompt.wgsl takes the rows that are not decode rows.
override TILED: bool = false;
const FAST_KEYS: u32 = 2048u;

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<KvWord>;
@group(0) @binding(4) var<storage, read> v_cache: array<KvWord>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> scores: array<f32>;
@group(0) @binding(7) var<storage, read_write> stats: array<vec2<f32>>;
@group(0) @binding(8) var<storage, read_write> partial: array<f32>;
@group(0) @binding(9) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(10) var<storage, read> pages: array<u32>;

// Cache row of position `i` of sequence slot `s`.
fn cache_row(s: u32, i: u32) -> u32 {
    return pages[s * p.pps + i / PAGE] * PAGE + i % PAGE;
}

var<workgroup> q_sh: array<f32, MAX_HD>;
var<workgroup> red: array<f32, WG>;
var<workgroup> probs: array<f32, CHUNK>;
var<workgroup> acc_sh: array<vec2<f32>, WG>;
var<workgroup> tok_sh: vec2<u32>;

fn max_all(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            red[li] = max(red[li], red[li + o]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn sum_all(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            red[li] = red[li] + red[li + o];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// q head h of token t, rounded as the cache type wants (kv_round), into q_sh.
fn load_q(t: u32, h: u32, li: u32) {
    let base = (t * p.n_head + h) * p.head_dim;
    for (var i = li; i < p.head_dim; i += WG) {
        q_sh[i] = kv_round(q[base + i]);
    }
    workgroupBarrier();
}

fn kv_head(h: u32) -> u32 {
    return h / (p.n_head / p.n_head_kv);
}

// f16(q)·k of the key at position `pos` of slot `s` (kv head kvh) times the scale.
fn score(s: u32, pos: u32, kvh: u32) -> f32 {
    let hw = p.head_dim / 2u;
    let base = (cache_row(s, pos) * p.n_head_kv + kvh) * hw;
    var acc = 0.0;
    for (var i = 0u; i < hw; i++) {
        let kk = kv_unpack(k_cache[base + i]);
        acc += kk.x * q_sh[2u * i] + kk.y * q_sh[2u * i + 1u];
    }
    return acc * p.scale;
}

// Σ probs[i]·v[key0 + i] (slot s) over i < cnt for this thread's (group, word); the result
// is summed over groups and returned to threads li < head_dim/2 (word li).
fn pv(s: u32, key0: u32, cnt: u32, kvh: u32, li: u32, carry: vec2<f32>) -> vec2<f32> {
    let hw = p.head_dim / 2u;
    let groups = WG / hw;
    let g = li / hw;
    let w = li % hw;
    var acc = carry;
    if (g < groups) {
        for (var i = g; i < cnt; i += groups) {
            let vv = kv_unpack(v_cache[(cache_row(s, key0 + i) * p.n_head_kv + kvh) * hw + w]);
            acc += probs[i] * vv;
        }
    }
    return acc;
}

fn sum_groups(acc: vec2<f32>, li: u32) -> vec2<f32> {
    let hw = p.head_dim / 2u;
    let groups = WG / hw;
    acc_sh[li] = acc;
    workgroupBarrier();
    var s = vec2<f32>(0.0);
    if (li < hw) {
        for (var g = 0u; g < groups; g++) {
            s += acc_sh[g * hw + li];
        }
    }
    return s;
}

@compute @workgroup_size(256)
fn scores_main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = wg.x;
    let h = wg.y;
    let tk = toks[0];
    let n_keys = tk.x + 1u;
    load_q(0u, h, li);
    let key = c * CHUNK + li;
    var s = NEG;
    if (key < n_keys) {
        s = score(tk.y & SLOT_MASK, key, kv_head(h));
        scores[h * p.n_ctx + key] = s;
    }
    let m = max_all(s, li);
    var e = 0.0;
    if (key < n_keys) {
        e = exp(s - m);
    }
    let l = sum_all(e, li);
    if (li == 0u) {
        stats[h * p.max_chunks + c] = vec2<f32>(m, l);
    }
}

@compute @workgroup_size(256)
fn probs_pv(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let c = wg.x;
    let h = wg.y;
    let tk = toks[0];
    let n_keys = tk.x + 1u;
    let n_chunks = (n_keys + CHUNK - 1u) / CHUNK;
    var mx = NEG;
    for (var i = 0u; i < n_chunks; i++) {
        mx = max(mx, stats[h * p.max_chunks + i].x);
    }
    var l = 0.0;
    for (var i = 0u; i < n_chunks; i++) {
        let st = stats[h * p.max_chunks + i];
        l += st.y * exp(st.x - mx);
    }
    let inv = 1.0 / l;
    let key0 = c * CHUNK;
    let key = key0 + li;
    var pr = 0.0;
    if (key < n_keys) {
        pr = exp(scores[h * p.n_ctx + key] - mx) * inv;
        if (ROUND_P) {
            pr = kv_round(pr);
        }
    }
    probs[li] = pr;
    workgroupBarrier();
    let cnt = min(CHUNK, n_keys - min(key0, n_keys));
    let s = sum_groups(pv(tk.y & SLOT_MASK, key0, cnt, kv_head(h), li, vec2<f32>(0.0)), li);
    let hw = p.head_dim / 2u;
    if (li < hw) {
        let o = (c * p.n_head + h) * p.head_dim + 2u * li;
        partial[o] = s.x;
        partial[o + 1u] = s.y;
    }
}

@compute @workgroup_size(256)
fn merge(@builtin(global_invocation_id) gid: vec3<u32>) {
    let words = p.n_head * p.head_dim / 2u;
    let i = gid.x;
    if (i >= words) {
        return;
    }
    let n_chunks = (toks[0].x + CHUNK) / CHUNK;
    let stride = p.n_head * p.head_dim;
    var s = vec2<f32>(0.0);
    for (var c = 0u; c < n_chunks; c++) {
        s += vec2<f32>(partial[c * stride + 2u * i], partial[c * stride + 2u * i + 1u]);
    }
    out[2u * i] = s.x;
    out[2u * i + 1u] = s.y;
}

// Decode numerics for row t inside a step of several tokens: the chunk stats, the global
// max and sum, the F16-rounded probabilities and the chunk-ordered P·V sums of
// scores_main + probs_pv + merge, as the same float operations in the same order, so the
// row is bit-identical to decoding its token alone. Scores are computed twice (stats pass,
// probability pass); the chunk stats go through `stats` at row t's slice.
fn decode_row(t: u32, h: u32, n_keys: u32, slot: u32, li: u32) {
    let kvh = kv_head(h);
    let n_chunks = (n_keys + CHUNK - 1u) / CHUNK;
    let st0 = (t * p.n_head + h) * p.max_chunks;
    for (var c = 0u; c < n_chunks; c++) {
        let key = c * CHUNK + li;
        var s = NEG;
        if (key < n_keys) {
            s = score(slot, key, kvh);
        }
        let m = max_all(s, li);
        var e = 0.0;
        if (key < n_keys) {
            e = exp(s - m);
        }
        let l = sum_all(e, li);
        if (li == 0u) {
            stats[st0 + c] = vec2<f32>(m, l);
        }
    }
    storageBarrier();
    workgroupBarrier();
    var mx = NEG;
    for (var i = 0u; i < n_chunks; i++) {
        mx = max(mx, stats[st0 + i].x);
    }
    var l = 0.0;
    for (var i = 0u; i < n_chunks; i++) {
        let st = stats[st0 + i];
        l += st.y * exp(st.x - mx);
    }
    let inv = 1.0 / l;
    var total = vec2<f32>(0.0);
    for (var c = 0u; c < n_chunks; c++) {
        let key0 = c * CHUNK;
        let key = key0 + li;
        var pr = 0.0;
        if (key < n_keys) {
            pr = kv_round(exp(score(slot, key, kvh) - mx) * inv);
        }
        probs[li] = pr;
        workgroupBarrier();
        let cnt = min(CHUNK, n_keys - key0);
        total += sum_groups(pv(slot, key0, cnt, kvh, li, vec2<f32>(0.0)), li);
        workgroupBarrier();
    }
    if (li < p.head_dim / 2u) {
        let o = (t * p.n_head + h) * p.head_dim + 2u * li;
        out[o] = total.x;
        out[o + 1u] = total.y;
    }
}

@compute @workgroup_size(256)
fn prefill(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    if (li == 0u) {
        tok_sh = toks[t];
    }
    let tk = workgroupUniformLoad(&tok_sh);
    let slot = tk.y & SLOT_MASK;
    let n_keys = tk.x + 1u;
    let kvh = kv_head(h);
    load_q(t, h, li);
    if ((tk.y & DECODE_ROW) != 0u) {
        if (!FAST || n_keys > FAST_KEYS) {
            decode_row(t, h, n_keys, slot, li);
        }
        return;
    }
    if (TILED) {
        return;
    }
    var m = NEG;
    var l = 0.0;
    var acc = vec2<f32>(0.0);
    for (var key0 = 0u; key0 < n_keys; key0 += CHUNK) {
        let key = key0 + li;
        var s = NEG;
        if (key < n_keys) {
            s = score(slot, key, kvh);
        }
        let m_new = max(m, max_all(s, li));
        let alpha = exp(m - m_new);
        var e = 0.0;
        if (key < n_keys) {
            e = exp(s - m_new);
        }
        probs[li] = e;
        // sum_all's barriers also publish probs.
        l = l * alpha + sum_all(e, li);
        m = m_new;
        acc = pv(slot, key0, min(CHUNK, n_keys - key0), kvh, li, acc * alpha);
        workgroupBarrier();
    }
    let s = sum_groups(acc, li);
    if (li < p.head_dim / 2u) {
        let o = (t * p.n_head + h) * p.head_dim + 2u * li;
        out[o] = s.x / l;
        out[o + 1u] = s.y / l;
    }
}
