// rmsnorm.wgsl — RMSNorm times weight; optionally followed by BitNet's per-token int8
// absmax quantization (docs/FORMATS.md#activation-formats), which feeds ternary.wgsl.
//
// Bindings (group 0):
//   0 uniform Params { n, eps }: row width (multiple of 4 for the quant entry), epsilon
//   1 storage read  x:    array<f32>        T × n input rows
//   2 storage read  w:    array<f32>        n norm weights
//   3 storage rw    out:  array<u32>        rmsnorm: T × n f32 (as bits);
//                                          rmsnorm_quant: T × n/4 words of packed int8, element
//                                          4i+b in byte b of word i (pack4xI8 order)
//   4 storage rw    tok_scale: array<vec2<u32>>  rmsnorm_quant only: per token (bits of the f32
//                                          scale s, bits of the i32 Σq)
// Dispatch: (T, 1, 1), one workgroup of 256 threads per token.
// Reductions: variant SUBGROUPS reduces within each subgroup (shuffles / subgroupAdd /
// subgroupMax), then sums the per-subgroup partials in subgroup order through shared
// memory (2 barriers per reduction); otherwise a shared-memory tree (9 barriers).
//
// Numerics against the CPU reference (backend/cpu/norm.rs, quant/act.rs):
// - Σx² (of the f32 squares) is accumulated as an unevaluated sum of two f32 (TwoSum), so
//   it carries ~48 bits like the reference's f64 sum; mean = Σ/n is refined with an fma
//   remainder, and sqrt and the reciprocal are corrected to the nearest f32 with fma
//   residuals, because WGSL does not promise correctly rounded sqrt or division. The
//   normalised values then match the CPU bit for bit except when the exact mean lies within
//   ~2^-40 of an f32 rounding boundary.
// - s = 127/max(m, 1e-5) is computed exactly as the reference's (f32)(127/(double)m): the
//   quotient is formed by integer long division and rounded to nearest even, so it does not
//   depend on the GPU's division precision.
// - q = clamp(round(y·s), −128, 127); WGSL round() is round-half-to-even, like ggml's
//   nearest_int. Because y differs by ulps, a product lying within an ulp of a .5 boundary
//   can round the other way (rare; the tests count such cases).

struct Params { n: u32, eps: f32 }

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<storage, read_write> tok_scale: array<vec2<u32>>;

// a + b as (rounded sum, exact error): Knuth's TwoSum.
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    let bb = s - a;
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
}

// (hi, lo) + (hi2, lo2), renormalised.
fn dd_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = two_sum(a.x, b.x);
    return two_sum(s.x, s.y + a.y + b.y);
}

#if SUBGROUPS
var<private> sg_lane: u32;
var<private> sg_size: u32;
var<private> sg_id: u32;
var<private> sg_count: u32;
var<workgroup> part_f: array<f32, WG>;
var<workgroup> part_lo: array<f32, WG>;
var<workgroup> part_i: array<i32, WG>;

fn max_f(v: f32, li: u32) -> f32 {
    let m = subgroupMax(v);
    if (sg_lane == 0u) {
        part_f[sg_id] = m;
    }
    workgroupBarrier();
    var r = part_f[0];
    for (var i = 1u; i < sg_count; i++) {
        r = max(r, part_f[i]);
    }
    workgroupBarrier();
    return r;
}

fn sum_i(v: i32, li: u32) -> i32 {
    let s = subgroupAdd(v);
    if (sg_lane == 0u) {
        part_i[sg_id] = s;
    }
    workgroupBarrier();
    var r = 0;
    for (var i = 0u; i < sg_count; i++) {
        r += part_i[i];
    }
    workgroupBarrier();
    return r;
}

// Workgroup sum of double-f32 values.
fn sum_dd(v: vec2<f32>, li: u32) -> vec2<f32> {
    var s = v;
    for (var o = sg_size / 2u; o > 0u; o >>= 1u) {
        s = dd_add(s, vec2<f32>(subgroupShuffleXor(s.x, o), subgroupShuffleXor(s.y, o)));
    }
    if (sg_lane == 0u) {
        part_f[sg_id] = s.x;
        part_lo[sg_id] = s.y;
    }
    workgroupBarrier();
    var r = vec2<f32>(part_f[0], part_lo[0]);
    for (var i = 1u; i < sg_count; i++) {
        r = dd_add(r, vec2<f32>(part_f[i], part_lo[i]));
    }
    workgroupBarrier();
    return r;
}
#else
var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_lo: array<f32, WG>;
var<workgroup> red_i: array<i32, WG>;

fn max_f(v: f32, li: u32) -> f32 {
    red_f[li] = v;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            red_f[li] = max(red_f[li], red_f[li + o]);
        }
        workgroupBarrier();
    }
    let r = red_f[0];
    workgroupBarrier();
    return r;
}

fn sum_i(v: i32, li: u32) -> i32 {
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

// Workgroup sum of double-f32 values.
fn sum_dd(v: vec2<f32>, li: u32) -> vec2<f32> {
    red_f[li] = v.x;
    red_lo[li] = v.y;
    workgroupBarrier();
    for (var o = WG / 2u; o > 0u; o >>= 1u) {
        if (li < o) {
            let r = dd_add(vec2<f32>(red_f[li], red_lo[li]), vec2<f32>(red_f[li + o], red_lo[li + o]));
            red_f[li] = r.x;
            red_lo[li] = r.y;
        }
        workgroupBarrier();
    }
    let r = vec2<f32>(red_f[0], red_lo[0]);
    workgroupBarrier();
    return r;
}

#endif

// The next f32 above / below a positive finite v.
fn up(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) + 1u);
}
fn down(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) - 1u);
}

// sqrt(a) rounded to the nearest f32: of sqrt's answer and its two neighbours, the one
// whose square is nearest a (exact residuals through fma).
fn sqrt_rn(a: f32) -> f32 {
    var best = sqrt(a);
    var err = abs(fma(-best, best, a));
    let c0 = down(best);
    let e0 = abs(fma(-c0, c0, a));
    if (e0 < err) {
        best = c0;
        err = e0;
    }
    let c1 = up(sqrt(a));
    if (abs(fma(-c1, c1, a)) < err) {
        best = c1;
    }
    return best;
}

// 1/s rounded to the nearest f32, chosen the same way.
fn recip_rn(s: f32) -> f32 {
    var best = 1.0 / s;
    var err = abs(fma(-best, s, 1.0));
    let c0 = down(best);
    let e0 = abs(fma(-c0, s, 1.0));
    if (e0 < err) {
        best = c0;
        err = e0;
    }
    let c1 = up(1.0 / s);
    if (abs(fma(-c1, s, 1.0)) < err) {
        best = c1;
    }
    return best;
}

// 1/sqrt(mean(x²) + eps) of row t, computed by the whole workgroup.
fn inv_rms(base: u32, li: u32) -> f32 {
    var ss = vec2<f32>(0.0, 0.0);
    for (var i = li; i < p.n; i += WG) {
        let v = x[base + i];
        let sq = v * v;
        ss = dd_add(ss, vec2<f32>(sq, 0.0));
    }
    let total = sum_dd(ss, li);
    let n = f32(p.n);
    let q = total.x / n;
    let mean = q + (fma(-q, n, total.x) + total.y) / n;
    return recip_rn(sqrt_rn(mean + p.eps));
}

fn normed(base: u32, i: u32, scale: f32) -> f32 {
    return (x[base + i] * scale) * w[i];
}

// Correctly rounded f32 127/m for a normal m > 1e-5 (see the header).
fn div127(m: f32) -> f32 {
    let bits = bitcast<u32>(m);
    let e = (bits >> 23u) & 0xffu;
    let mm = (bits & 0x7fffffu) | 0x800000u;
    var r = 127u << 17u;
    var shift = 17u;
    if (r < mm) {
        r <<= 1u;
        shift = 18u;
    }
    // Now mm <= r < 2·mm: 25 quotient bits of r/mm, the first one set.
    var q = 0u;
    for (var i = 0u; i < 25u; i++) {
        q <<= 1u;
        if (r >= mm) {
            r -= mm;
            q |= 1u;
        }
        r <<= 1u;
    }
    var mant = q >> 1u;
    let round_bit = (q & 1u) != 0u;
    if (round_bit && (r != 0u || (mant & 1u) != 0u)) {
        mant += 1u;
    }
    var exp = 150u + 127u - e - shift;
    if (mant == 0x1000000u) {
        mant = 0x800000u;
        exp += 1u;
    }
    return bitcast<f32>((exp << 23u) | (mant & 0x7fffffu));
}

fn quant_scale(amax: f32) -> f32 {
    // m = max(amax, 1e-5) in f64: every f32 ≤ 1e-5f32 is below 1e-5, and 127/1e-5 = 12.7e6
    // is exactly representable.
    if (amax <= 1e-5) {
        return 12700000.0;
    }
    return div127(amax);
}

fn q8(v: f32) -> i32 {
    return i32(clamp(round(v), -128.0, 127.0));
}

@compute @workgroup_size(256)
fn rmsnorm(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_size) ssz: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) ns: u32,
#endif
) {
#if SUBGROUPS
    sg_lane = sl;
    sg_size = ssz;
    sg_id = sid;
    sg_count = ns;
#endif
    let base = wg.x * p.n;
    let scale = inv_rms(base, li);
    for (var i = li; i < p.n; i += WG) {
        out[base + i] = bitcast<u32>(normed(base, i, scale));
    }
}

@compute @workgroup_size(256)
fn rmsnorm_quant(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
#if SUBGROUPS
    @builtin(subgroup_invocation_id) sl: u32,
    @builtin(subgroup_size) ssz: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) ns: u32,
#endif
) {
#if SUBGROUPS
    sg_lane = sl;
    sg_size = ssz;
    sg_id = sid;
    sg_count = ns;
#endif
    let t = wg.x;
    let base = t * p.n;
    let scale = inv_rms(base, li);
    var m = 0.0;
    for (var i = li; i < p.n; i += WG) {
        m = max(m, abs(normed(base, i, scale)));
    }
    let s = quant_scale(max_f(m, li));
    var qs = 0;
    for (var i = li * 4u; i < p.n; i += WG * 4u) {
        let q = vec4<i32>(
            q8(normed(base, i, scale) * s),
            q8(normed(base, i + 1u, scale) * s),
            q8(normed(base, i + 2u, scale) * s),
            q8(normed(base, i + 3u, scale) * s),
        );
        qs += q.x + q.y + q.z + q.w;
        out[(base + i) / 4u] = pack4xI8(q);
    }
    let total = sum_i(qs, li);
    if (li == 0u) {
        tok_scale[t] = vec2<u32>(bitcast<u32>(s), bitcast<u32>(total));
    }
}
