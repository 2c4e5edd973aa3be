// common.wgsl — helpers appended to every kernel by the pipeline cache (WGSL functions may
// be declared after their use). No bindings, no entry points.
//
// WGSL leaves the rounding of f32 → f16 conversions (including pack2x16float) to the
// implementation; these helpers round to nearest even in integer arithmetic, as the CPU
// reference (and ggml's F16C path) does.

// F16 bits (round to nearest even, overflow to ±inf, NaN kept) of an f32.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return sign | 0x7c00u | select(0u, 0x200u, a > 0x7f800000u);
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    // F16 subnormal or zero: units of 2^-24; the scaling is exact and round() is RNE.
    return sign | u32(round(bitcast<f32>(a) * 16777216.0));
}

// x rounded to the nearest F16 value, as f32.
fn round_f16(x: f32) -> f32 {
    return unpack2x16float(f16_bits(x)).x;
}

// a / b correctly rounded (nearest even), by integer long division of the significands:
// WGSL (and Vulkan) allow 2.5 ulp for `/`, the CPU reference divides exactly. Operands and
// result must be normal f32 (or a zero dividend); anything else falls back to `a / b`.
fn div_rn(a: f32, b: f32) -> f32 {
    let ba = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let ea = (ba >> 23u) & 0xffu;
    let eb = (bb >> 23u) & 0xffu;
    if (ea == 0u || eb == 0u || ea == 255u || eb == 255u) {
        return a / b;
    }
    let sign = (ba ^ bb) & 0x80000000u;
    var ma = (ba & 0x7fffffu) | 0x800000u;
    let mb = (bb & 0x7fffffu) | 0x800000u;
    var e = i32(ea) - i32(eb) + 127;
    if (ma < mb) {
        ma <<= 1u;
        e -= 1;
    }
    // ma / mb is in [1, 2): 24 quotient bits, then r = twice the remainder.
    var q = 0u;
    var r = ma;
    for (var i = 0u; i < 24u; i++) {
        q <<= 1u;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1u;
    }
    if (r > mb || (r == mb && (q & 1u) == 1u)) {
        q += 1u;
        if (q == 0x1000000u) {
            q >>= 1u;
            e += 1;
        }
    }
    if (e <= 0 || e >= 255) {
        return a / b;
    }
    return bitcast<f32>(sign | (u32(e) << 23u) | (q & 0x7fffffu));
}

// y with its rounding pinned: `zero` is a uniform the host sets to 0, so the compiler cannot
// fuse the product that made y into a following add (Vulkan allows fma contraction; the
// CPU reference rounds the product and the sum separately). Keeps residual-add epilogues
// bit-identical across kernels.
fn pinned(y: f32, zero: u32) -> f32 {
    return bitcast<f32>(bitcast<u32>(y) ^ zero);
}

// GELU (tanh form) in f32: 0.5·v·(1 + tanh(√(2/π)·v·(1 + 0.044715·v²))).
fn gelu_f32(v: f32) -> f32 {
    let z = 0.7978845608 * v * (1.0 + 0.044715 * v * v);
    // tanh(−|z|) = 2s − 1 with s = e/(1 + e), e = e^{−2|z|} ≤ 1: one f32 rounding of the
    // sum, like the CPU's f32 tanh, so 1 + tanh keeps the CPU's granularity where it
    // cancels (large negative v).
    let e = exp(-2.0 * abs(z));
    let tn = 2.0 * (e / (1.0 + e)) - 1.0;
    let t = select(tn, -tn, z > 0.0);
    return 0.5 * v * (1.0 + t);
}

// GELU as ggml's CPU table gives it: 0 at or below −10, v at or above 10, else
// gelu_f32 of the F16-rounded input, rounded to F16 (rowops.wgsl states the error bound).
fn gelu_ggml(v: f32) -> f32 {
    if (v <= -10.0) {
        return 0.0;
    }
    if (v >= 10.0) {
        return v;
    }
    return round_f16(gelu_f32(round_f16(v)));
}

// act(g) · u of the gated feed-forward for act 0 (ReLU²) and 1 (SiLU): glu.wgsl's
// expressions, shared by the kernels that fuse it.
fn gated(g: f32, u: f32, act: u32) -> f32 {
    if (act == 0u) {
        let r = max(g, 0.0);
        return (r * r) * u;
    }
    return (g / (1.0 + exp(-g))) * u;
}
