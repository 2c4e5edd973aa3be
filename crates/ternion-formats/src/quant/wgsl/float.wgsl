// quant/wgsl/float.wgsl — qmatvec.wgsl include for F32, F16 and BF16 weights against f32
// activations. FMT: 0 = F32 (4 B per element), 1 = F16 (IEEE half), 2 = BF16 (the high
// half of an f32), little-endian, rows as stored. A unit is 4 elements.
//
// Numerics: f32 products summed in a different order than the CPU; BF16 rounds x to BF16
// first (RNE, ggml's vec_dot_type) and F16 does when ROUND_X (single-token decode, as
// ggml). unpack2x16float is exact.

const F_F32: u32 = 0u;
const F_F16: u32 = 1u;
const F_BF16: u32 = 2u;

fn bf16_round(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

fn xval(i: u32) -> f32 {
    let v = bitcast<f32>(act[i]);
    if (FMT == F_BF16) {
        return bf16_round(v);
    }
    if (FMT == F_F16 && ROUND_X) {
        return round_f16(v);
    }
    return v;
}

fn xvec(i: u32) -> vec4<f32> {
    return vec4<f32>(xval(i), xval(i + 1u), xval(i + 2u), xval(i + 3u));
}

// The 4 weights of unit u (elements 4u .. 4u+3) as f32.
fn wfloat(ro: u32, u: u32) -> vec4<f32> {
    if (FMT == F_F32) {
        let o = ro + 16u * u;
        return vec4<f32>(bitcast<f32>(ld(o)), bitcast<f32>(ld(o + 4u)), bitcast<f32>(ld(o + 8u)), bitcast<f32>(ld(o + 12u)));
    }
    let o = ro + 8u * u;
    let w0 = ld(o);
    let w1 = ld(o + 4u);
    if (FMT == F_F16) {
        return vec4<f32>(unpack2x16float(w0), unpack2x16float(w1));
    }
    return vec4<f32>(bitcast<f32>(w0 << 16u), bitcast<f32>(w0 & 0xffff0000u), bitcast<f32>(w1 << 16u), bitcast<f32>(w1 & 0xffff0000u));
}

fn unit(ro: u32, u: u32, a: vec4<u32>, db: vec4<u32>, nt: u32) -> vec4<f32> {
    let wv = wfloat(ro, u);
    var y = vec4<f32>(0.0);
    for (var j = 0u; j < nt; j++) {
        y[j] = dot(wv, xvec(a[j] + 4u * u));
    }
    return y;
}

fn gather_unit(ro: u32, u: u32, t: u32) {
    let v = wfloat(ro, u);
    for (var i = 0u; i < 4u; i++) {
        out[t * p.out_stride + 4u * u + i] = v[i];
    }
}
