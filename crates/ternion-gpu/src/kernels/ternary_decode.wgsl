// ternary_decode.wgsl — the fast single-token BitLinear path (numerics policy "fast",
// docs/ARCHITECTURE.md): RMSNorm × weight and BitNet's per-token int8 absmax quantization
// (docs/FORMATS.md, I2_S) in one workgroup-wide pass, kept in workgroup memory as the
// prologue of the I2_S matvecs that consume it — a decode step runs no norm launch — or
// written out by `norm_quant` for steps of several tokens (the batch and tiled kernels of
// ternary.wgsl / ternary_mm.wgsl / ternary_coop.wgsl read it). Both paths run the same
// functions over the same thread layout, so a token's activations are bit-identical
// whichever path quantized them.
//
// Bindings (group 0; each entry point binds only those it uses):
//   0 uniform Params { rows, words, w_scale, up_scale }: output features M (all matrices
//                     of matvec3_n together), u32 words per weight row (K/16), the first
//                     matrix's I2_S scale, and the up matrix's (glu_n; 0 for matvec_n, whose
//                     residual add pins y with it, as ternary.wgsl does)
//   1 storage read  w:    array<vec4<u32>>   M × K/64: the I2_S codes as in the file
//   2 storage read  x:    array<vec4<f32>>   T × K/4: the f32 rows to normalise
//   3 storage read  nw:   array<vec4<f32>>   K/4 norm weights
//   4 storage rw    out:  array<f32>         M outputs; EPILOGUE 0 stores, 1 adds (residual)
//   5 uniform Norm { k, eps, _, _ }           row width K, epsilon
//   6 storage read  w2:   array<vec4<u32>>   glu_n: the up matrix; matvec3_n: the 2nd matrix
//   7 storage read  w3:   array<vec4<u32>>   matvec3_n: the 3rd matrix
//   8 storage rw    out2: array<f32>         matvec3_n: M2 outputs
//   9 storage rw    out3: array<f32>         matvec3_n: M3 outputs
//  10 uniform Parts { m1, m2, scale2, scale3 } matvec3_n
//  11 storage rw    qa:   array<vec4<u32>>   norm_quant: T × K/16 (K/4 words of packed int8,
//                                           element 4i+b in byte b of word i)
//  12 storage rw    tok_meta: array<vec2<u32>>   norm_quant: per token (f32 scale bits, i32 Σq)
// Dispatch: norm_quant (T, 1, 1); the matvecs (ceil(M / (256/TPR)), 1, 1). K is a
// multiple of 64 and at most 4·MAX_WORDS (the host checks both).
//
// Numerics: Σx² and max|x·w| in f32 (one pass; a workgroup reduction of both), inv =
// inverseSqrt(Σx²/K + eps), y = (x·inv)·w, s = 127 / (max|x·w|·inv) (1.27e7 when that is
// ≤ 1e-5), q = clamp(round(y·s), −128, 127). The CPU reference sums in f64 and divides
// exactly (rmsnorm.wgsl reproduces it bit for bit at ~16 µs a row); this path differs from
// it by ulps in y and so, rarely, by one in a q. The integer dot products and their scaling
// are ternary.wgsl's exactly.
//
// Weight layout (ternary.wgsl explains it): vec4 v of a row is words 4v..4v+3 of I2_S block
// v/2; shifted right by 6−2g and masked, word e pairs with activation word
// 32·(v/2) + 8g + 4·(v%2) + e, i.e. component e of activation vec4 8·(v/2) + 2g + v%2.
// A workgroup is 256 threads = 256/TPR rows × TPR lanes. Each thread first issues the loads
// of its part of the row to normalise, then those of its lane's first PRE vec4s of the
// weight row, so the norm's inputs come back first and the weights' memory latency hides
// behind the norm (PRE vec4s cover a 2,560-wide row entirely, and 8/13.5 of a 6,912-wide
// one at TPR 8); then lanes stride over the rest four vec4s at a time (four loads in
// flight).
// Activation group c sits in act_sh slot swz(c) (bits 1–2 of c flipped by bits 3–4): a
// row's lanes read groups 8 apart, which would share the banks of workgroup memory (a 4-way
// conflict on every 16-byte read); swizzled they fall in 8 distinct bank groups.
// Reductions: variant SUBGROUPS sums the prologue's Σx² and max with subgroupAdd/subgroupMax
// and then over the subgroups in order (2 barriers), leaves Σq's per-subgroup sums for the
// epilogue to add (sum_q), and sums a row's TPR lanes with
// subgroupShuffleXor (the host picks the variant only when TPR ≤ the smallest subgroup);
// otherwise a shared-memory tree, and the row's lanes through one barrier.

override TPR: u32 = 8u;
override EPILOGUE: u32 = 0u;
override ACT: u32 = 0u;
const WG: u32 = 256u;
const M2: u32 = 0x03030303u;
// Activation words held in workgroup memory: rows of up to 8,192 elements.
const MAX_WORDS: u32 = 2048u;
// The row width k (= nrm.k = 16·p.words), the host's pipeline constant: the loops over a
// row have constant trip counts and its index arithmetic folds. (The mean of the squares
// still divides by the uniform, so the scale keeps its bits.)
override K: u32 = 2560u;
// Weight vec4s per lane loaded before the prologue.
const PRE: u32 = 8u;

struct Params { rows: u32, words: u32, w_scale: f32, up_scale: f32 }
struct Norm { k: u32, eps: f32, pad0: u32, pad1: u32 }
struct Parts { m1: u32, m2: u32, scale2: f32, scale3: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> nrm: Norm;
@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> w3: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> out2: array<f32>;
@group(0) @binding(9) var<storage, read_write> out3: array<f32>;
@group(0) @binding(10) var<uniform> parts: Parts;
@group(0) @binding(11) var<storage, read_write> qa: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read_write> tok_meta: array<vec2<u32>>;

var<workgroup> act_sh: array<vec4<u32>, 512>;
var<workgroup> red_f: array<vec2<f32>, WG>;
var<workgroup> red_i: array<vec4<i32>, WG>;

#if SUBGROUPS
var<private> sg_lane: u32;
var<private> sg_id: u32;
var<private> sg_count: u32;

// Workgroup (Σ, max) of (a.x, a.y): per subgroup, then over the subgroups in order.
fn reduce_sum_max(a: vec2<f32>, li: u32) -> vec2<f32> {
    let s = vec2<f32>(subgroupAdd(a.x), subgroupMax(a.y));
    if (sg_lane == 0u) {
        red_f[sg_id] = s;
    }
    workgroupBarrier();
    var r = red_f[0];
    for (var i = 1u; i < sg_count; i++) {
        let b = red_f[i];
        r = vec2<f32>(r.x + b.x, max(r.y, b.y));
    }
    return r;
}

// Sum over the TPR lanes of each row, valid in the row's lane 0.
fn reduce_row(v: vec2<i32>, li: u32) -> vec2<i32> {
    var s = v;
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        s += vec2<i32>(subgroupShuffleXor(s.x, o), subgroupShuffleXor(s.y, o));
    }
    return s;
}
#else
// The token's Σq once the prologue has run (the tree's total, in every thread).
var<private> q_total: i32;

// Workgroup (Σ, max) of (a.x, a.y), in a fixed order (a shared-memory tree).
fn reduce_sum_max(a: vec2<f32>, li: u32) -> vec2<f32> {
    red_f[li] = a;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            let b = red_f[li + o];
            red_f[li] = vec2<f32>(red_f[li].x + b.x, max(red_f[li].y, b.y));
        }
        workgroupBarrier();
    }
    return red_f[0];
}

// Workgroup sum of v (valid in every thread), a shared-memory tree.
fn reduce_all(v: vec4<i32>, li: u32) -> vec4<i32> {
    red_i[li] = v;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            red_i[li] = red_i[li] + red_i[li + o];
        }
        workgroupBarrier();
    }
    let r = red_i[0];
    workgroupBarrier();
    return r;
}

// Sum over the TPR lanes of each row, valid in the row's lane 0 (one barrier).
fn reduce_row(v: vec2<i32>, li: u32) -> vec2<i32> {
    red_i[li] = vec4<i32>(v, 0, 0);
    workgroupBarrier();
    var s = vec2<i32>(0, 0);
    if (li % TPR == 0u) {
        for (var i = 0u; i < TPR; i++) {
            s += red_i[li + i].xy;
        }
    }
    return s;
}
#endif

// The builtins every entry point takes.
struct Ids {
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) ns: u32,
#endif
}

// Records the subgroup builtins for the reductions (variant SUBGROUPS).
fn enter(ids: Ids) {
#if SUBGROUPS
    sg_lane = ids.sl;
    sg_id = ids.sid;
    sg_count = ids.ns;
#endif
}

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

// The packed int8 word of four normalised values.
fn quant4(v: vec4<f32>, g: vec4<f32>, inv: f32, s: f32) -> vec4<i32> {
    let y = (v * inv) * g;
    return vec4<i32>(clamp(round(y * s), vec4<f32>(-128.0), vec4<f32>(127.0)));
}

// Sixteen values of a row (x) and their norm weights (g), read once by the thread that
// quantizes them (zero past the row's end).
struct Group {
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
    g0: vec4<f32>,
    g1: vec4<f32>,
    g2: vec4<f32>,
    g3: vec4<f32>,
}

// Group c (values 16c..16c+15) of the row starting at vec4 `base`, when c < n16.
fn load_group(base: u32, c: u32, n16: u32) -> Group {
    var r: Group;
    if (c < n16) {
        let e = 4u * c;
        r = Group(
            x[base + e],
            x[base + e + 1u],
            x[base + e + 2u],
            x[base + e + 3u],
            nw[e],
            nw[e + 1u],
            nw[e + 2u],
            nw[e + 3u],
        );
    }
    return r;
}

// (Σx², max|x·g|) of a group.
fn group_stats(q: Group) -> vec2<f32> {
    let ss = (dot(q.x0, q.x0) + dot(q.x1, q.x1)) + (dot(q.x2, q.x2) + dot(q.x3, q.x3));
    let m = max(max(max4(abs(q.x0 * q.g0)), max4(abs(q.x1 * q.g1))), max(max4(abs(q.x2 * q.g2)), max4(abs(q.x3 * q.g3))));
    return vec2<f32>(ss, m);
}

// The act_sh slot of activation group c: bits 1–2 flipped by bits 3–4, a permutation
// within each aligned run of 8 groups. A row's TPR lanes read groups 8 apart (vec_dot);
// unswizzled those share banks (a 4-way conflict on every 16-byte read), swizzled they
// fall in distinct ones.
fn swz(c: u32) -> u32 {
    return c ^ (((c >> 3u) & 3u) << 1u);
}

// Quantizes a group into act_sh (slot swz(c)); returns its Σq (per lane of the packed words).
fn quant_group(q: Group, c: u32, inv: f32, s: f32) -> vec4<i32> {
    let q0 = quant4(q.x0, q.g0, inv, s);
    let q1 = quant4(q.x1, q.g1, inv, s);
    let q2 = quant4(q.x2, q.g2, inv, s);
    let q3 = quant4(q.x3, q.g3, inv, s);
    act_sh[swz(c)] = vec4<u32>(pack4xI8(q0), pack4xI8(q1), pack4xI8(q2), pack4xI8(q3));
    return q0 + q1 + q2 + q3;
}

// The two groups of row t of x (and their norm weights) thread li normalises: groups li
// and li + WG (K ≤ 4·MAX_WORDS = 32·WG values), so the row is read once.
struct RowPart {
    a: Group,
    b: Group,
}

// Issues the loads of thread li's part of row t (before the weight loads of a matvec, whose
// latency the norm then hides).
fn load_row(t: u32, li: u32) -> RowPart {
    let n16 = K / 16u;
    let base = t * (K / 4u);
    return RowPart(load_group(base, li, n16), load_group(base, li + WG, n16));
}

// RMSNorm and int8 quantization of a row (thread li holding `part`, from load_row) into
// act_sh (see the header); returns the token's scale s (the same in every thread).
fn prologue(part: RowPart, li: u32) -> f32 {
    let n16 = K / 16u;
    let a = part.a;
    let b = part.b;
    let sa = group_stats(a);
    let sb = group_stats(b);
    let r = reduce_sum_max(vec2<f32>(sa.x + sb.x, max(sa.y, sb.y)), li);
    let inv = inverseSqrt(r.x / f32(nrm.k) + nrm.eps);
    let amax = r.y * inv;
    var s = 12700000.0;
    if (amax > 1e-5) {
        s = 127.0 / amax;
    }
    var qs = vec4<i32>(0);
    if (li < n16) {
        qs += quant_group(a, li, inv, s);
    }
    if (li + WG < n16) {
        qs += quant_group(b, li + WG, inv, s);
    }
#if SUBGROUPS
    // Σq is needed only by the epilogue: the subgroups' sums wait in red_i behind this
    // barrier and are added there (sum_q), off the path to the products.
    let q4 = subgroupAdd(qs);
    if (sg_lane == 0u) {
        red_i[sg_id] = q4;
    }
#else
    let total = reduce_all(qs, li);
    q_total = total.x + total.y + total.z + total.w;
#endif
    workgroupBarrier();
    return s;
}

// The token's Σq, once the prologue's last barrier has passed (the subgroups' sums in
// order, or the tree's total).
fn sum_q() -> i32 {
#if SUBGROUPS
    var r = vec4<i32>(0);
    for (var i = 0u; i < sg_count; i++) {
        r += red_i[i];
    }
    return r.x + r.y + r.z + r.w;
#else
    return q_total;
#endif
}

@compute @workgroup_size(256)
fn norm_quant(ids: Ids) {
    let li = ids.li;
    let wg = ids.wg;
    enter(ids);
    let t = wg.x;
    let s = prologue(load_row(t, li), li);
    let n16 = K / 16u;
    for (var c = li; c < n16; c += WG) {
        qa[t * n16 + c] = act_sh[swz(c)];
    }
    if (li == 0u) {
        tok_meta[t] = vec2<u32>(bitcast<u32>(s), bitcast<u32>(sum_q()));
    }
}

// Σ_k code·q over the four words of one 4-element column of codes against activation
// words `a` (their packed int8).
fn dot4(w: vec4<u32>, a: vec4<u32>) -> i32 {
    return dot4I8Packed(w.x, a.x) + dot4I8Packed(w.y, a.y) + dot4I8Packed(w.z, a.z)
        + dot4I8Packed(w.w, a.w);
}

// Σ code·q of weight vec4 `wv` (vec4 v of its row) against the activations in act_sh. Each
// bit plane is masked in place rather than shifted down: plane 3 (bits 0–1) counts 1×,
// plane 2 (bits 2–3) 4×, plane 1 (bits 4–5) and plane 0 (bits 6–7, shifted right by 2)
// 16× (every byte stays ≤ 32, a valid int8), and the exact integer sums are divided back.
fn vec_dot(wv: vec4<u32>, v: u32) -> i32 {
    let a = (v >> 1u) * 8u + (v & 1u);
    let p0 = (wv >> vec4<u32>(2u)) & vec4<u32>(0x30303030u);
    let p1 = wv & vec4<u32>(0x30303030u);
    let p2 = wv & vec4<u32>(0x0C0C0C0Cu);
    let p3 = wv & vec4<u32>(M2);
    // a, a + 2, a + 4, a + 6 lie in one aligned run of 8 groups: one flip serves all four.
    let f = ((a >> 3u) & 3u) << 1u;
    let d16 = dot4(p0, act_sh[a ^ f]) + dot4(p1, act_sh[(a + 2u) ^ f]);
    let d4 = dot4(p2, act_sh[(a + 4u) ^ f]);
    return dot4(p3, act_sh[(a + 6u) ^ f]) + (d4 >> 2u) + (d16 >> 4u);
}

// Vec4 i of matrix `which` (0: w, 1: w2, 2: w3).
fn wload(which: u32, i: u32) -> vec4<u32> {
    if (which == 1u) {
        return w2[i];
    }
    if (which == 2u) {
        return w3[i];
    }
    return w[i];
}

// A lane's first PRE weight vec4s of a row (zero past the row's end).
struct Pre {
    a0: vec4<u32>,
    a1: vec4<u32>,
    a2: vec4<u32>,
    a3: vec4<u32>,
    a4: vec4<u32>,
    a5: vec4<u32>,
    a6: vec4<u32>,
    a7: vec4<u32>,
}

// Vec4 v of the row starting at vec4 `base` of matrix `which`, or zero past its end `nv`.
fn wl(which: u32, base: u32, v: u32, nv: u32) -> vec4<u32> {
    if (v < nv) {
        return wload(which, base + v);
    }
    return vec4<u32>(0u);
}

// Issues the loads of a lane's first PRE vec4s of row `row` (all zero when `live` is false).
fn prefetch(which: u32, row: u32, lane: u32, live: bool) -> Pre {
    var r: Pre;
    if (live) {
        let nv = K / 64u;
        let b = row * nv;
        r = Pre(
            wl(which, b, lane, nv),
            wl(which, b, lane + TPR, nv),
            wl(which, b, lane + 2u * TPR, nv),
            wl(which, b, lane + 3u * TPR, nv),
            wl(which, b, lane + 4u * TPR, nv),
            wl(which, b, lane + 5u * TPR, nv),
            wl(which, b, lane + 6u * TPR, nv),
            wl(which, b, lane + 7u * TPR, nv),
        );
    }
    return r;
}

// Σ code·q of the prefetched vec4s (zero codes add zero).
fn pre_dots(r: Pre, lane: u32) -> i32 {
    return vec_dot(r.a0, lane) + vec_dot(r.a1, lane + TPR) + vec_dot(r.a2, lane + 2u * TPR)
        + vec_dot(r.a3, lane + 3u * TPR) + vec_dot(r.a4, lane + 4u * TPR)
        + vec_dot(r.a5, lane + 5u * TPR) + vec_dot(r.a6, lane + 6u * TPR)
        + vec_dot(r.a7, lane + 7u * TPR);
}

// Σ code·q over the rest of row `row` of matrix `which` (after the PRE prefetched vec4s),
// and of w2 too when `glu` (.y), lanes striding four vec4s at a time with their loads
// issued together.
fn row_dots(row: u32, lane: u32, which: u32, glu: bool) -> vec2<i32> {
    let nv = K / 64u;
    let base = row * nv;
    let zero = vec4<u32>(0u);
    var acc = vec2<i32>(0, 0);
    for (var v0 = lane + PRE * TPR; v0 < nv; v0 += 4u * TPR) {
        let v1 = v0 + TPR;
        let v2 = v1 + TPR;
        let v3 = v2 + TPR;
        let a0 = wload(which, base + v0);
        var a1 = zero;
        var a2 = zero;
        var a3 = zero;
        if (v1 < nv) {
            a1 = wload(which, base + v1);
        }
        if (v2 < nv) {
            a2 = wload(which, base + v2);
        }
        if (v3 < nv) {
            a3 = wload(which, base + v3);
        }
        // Zero codes add zero: the missing vec4s need no branch below.
        acc.x += vec_dot(a0, v0) + vec_dot(a1, v1) + vec_dot(a2, v2) + vec_dot(a3, v3);
        if (glu) {
            let u0 = w2[base + v0];
            var u1 = zero;
            var u2 = zero;
            var u3 = zero;
            if (v1 < nv) {
                u1 = w2[base + v1];
            }
            if (v2 < nv) {
                u2 = w2[base + v2];
            }
            if (v3 < nv) {
                u3 = w2[base + v3];
            }
            acc.y += vec_dot(u0, v0) + vec_dot(u1, v1) + vec_dot(u2, v2) + vec_dot(u3, v3);
        }
    }
    return acc;
}

// The token's scale s and Σq (sum_q, added once per row).
struct Tok { s: f32, sq: i32 }

// The f32 output of integer dot `d` for the token `tok` and a matrix of scale `scale`
// (ternary.wgsl `scaled`).
fn scaled(d: i32, tok: Tok, scale: f32) -> f32 {
    return (f32(d - tok.sq) / tok.s) * scale;
}

@compute @workgroup_size(256)
fn matvec_n(ids: Ids) {
    let li = ids.li;
    let wg = ids.wg;
    enter(ids);
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let live = row < p.rows;
    let x_part = load_row(0u, li);
    let pre = prefetch(0u, row, lane, live);
    let s = prologue(x_part, li);
    var acc = vec2<i32>(pre_dots(pre, lane), 0);
    if (live) {
        acc += row_dots(row, lane, 0u, false);
    }
    let d = reduce_row(acc, li).x;
    if (lane == 0u && live) {
        let y = scaled(d, Tok(s, sum_q()), p.w_scale);
        if (EPILOGUE == 1u) {
            out[row] = out[row] + pinned(y, bitcast<u32>(p.up_scale));
        } else {
            out[row] = y;
        }
    }
}

@compute @workgroup_size(256)
fn glu_n(ids: Ids) {
    let li = ids.li;
    let wg = ids.wg;
    enter(ids);
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let live = row < p.rows;
    let x_part = load_row(0u, li);
    let pre_g = prefetch(0u, row, lane, live);
    let pre_u = prefetch(1u, row, lane, live);
    let s = prologue(x_part, li);
    var acc = vec2<i32>(pre_dots(pre_g, lane), pre_dots(pre_u, lane));
    if (live) {
        acc += row_dots(row, lane, 0u, true);
    }
    let d = reduce_row(acc, li);
    if (lane == 0u && live) {
        let tok = Tok(s, sum_q());
        let g = scaled(d.x, tok, p.w_scale);
        let u = scaled(d.y, tok, p.up_scale);
        var y: f32;
        if (ACT == 0u) {
            let r = max(g, 0.0);
            y = (r * r) * u;
        } else {
            y = (g / (1.0 + exp(-g))) * u;
        }
        out[row] = y;
    }
}

@compute @workgroup_size(256)
fn matvec3_n(ids: Ids) {
    let li = ids.li;
    let wg = ids.wg;
    enter(ids);
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let live = row < p.rows;
    // Which matrix this row belongs to, and its row there.
    var part = 0u;
    var r = row;
    if (row >= parts.m1 + parts.m2) {
        part = 2u;
        r = row - parts.m1 - parts.m2;
    } else if (row >= parts.m1) {
        part = 1u;
        r = row - parts.m1;
    }
    let x_part = load_row(0u, li);
    let pre = prefetch(part, r, lane, live);
    let s = prologue(x_part, li);
    var acc = vec2<i32>(pre_dots(pre, lane), 0);
    if (live) {
        acc += row_dots(r, lane, part, false);
    }
    let d = reduce_row(acc, li).x;
    if (lane == 0u && live) {
        let tok = Tok(s, sum_q());
        if (part == 0u) {
            out[r] = scaled(d, tok, p.w_scale);
        } else if (part == 1u) {
            out2[r] = scaled(d, tok, parts.scale2);
        } else {
            out3[r] = scaled(d, tok, parts.scale3);
        }
    }
}
