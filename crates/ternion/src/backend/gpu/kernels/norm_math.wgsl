// norm_math.wgsl — the RMSNorm and int8-quantization arithmetic shared by rmsnorm.wgsl and
// the fused-norm entry points of ternary.wgsl, appended to both (after the preprocessor, with
// the same defines), so the two paths compute bit-identical activations. The including file
// defines `const WG: u32 = 256u` and, under SUBGROUPS, sets sg_lane, sg_size, sg_id and
// sg_count from the entry point's builtins before the first reduction. See rmsnorm.wgsl's
// header for the numerics.

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

// 1/sqrt(total/n + eps) for the double-f32 sum of squares `total` of a row of n values.
fn inv_rms_of(total: vec2<f32>, n_u: u32, eps: f32) -> f32 {
    let n = f32(n_u);
    let q = total.x / n;
    let mean = q + (fma(-q, n, total.x) + total.y) / n;
    return recip_rn(sqrt_rn(mean + eps));
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

