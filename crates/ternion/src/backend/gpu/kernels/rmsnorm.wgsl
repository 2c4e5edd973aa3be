// rmsnorm.wgsl — RMSNorm times weight; optionally followed by BitNet's per-token int8
// absmax quantization (BITNET.md §4), which feeds ternary.wgsl.
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
// The arithmetic lives in norm_math.wgsl (appended). Reductions: variant SUBGROUPS reduces within each subgroup (shuffles / subgroupAdd /
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

// 1/sqrt(mean(x²) + eps) of row t, computed by the whole workgroup.
fn inv_rms(base: u32, li: u32) -> f32 {
    var ss = vec2<f32>(0.0, 0.0);
    for (var i = li; i < p.n; i += WG) {
        let v = x[base + i];
        ss = dd_add(ss, vec2<f32>(v * v, 0.0));
    }
    return inv_rms_of(sum_dd(ss, li), p.n, p.eps);
}

fn normed(base: u32, i: u32, scale: f32) -> f32 {
    return (x[base + i] * scale) * w[i];
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
