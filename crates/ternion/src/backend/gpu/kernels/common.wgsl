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
