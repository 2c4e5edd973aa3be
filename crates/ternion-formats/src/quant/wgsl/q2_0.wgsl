// quant/wgsl/q2_0.wgsl — Q2_0 (ggml type 42) decode (block.wgsl interface). Block: 18 B / 64
// elements: F16 d, 16 B qs; element j = bits 2(j % 4) of byte 2 + j / 4; w = d·(code − 1).
// Unit u is elements 32(u % 2) .. of block u / 2: the 8 bytes at 2 + 8(u % 2).
// Activations Q8_0; y = d·(d_a·f32(Σ (code − 1)·a)) per unit (ggml's vec_dot_q2_0_q8_0
// sums the two d_a·Σ of a block before multiplying by d).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 18u * (u / 2u);
    r.d = f16_at(bo);
    let qo = bo + 2u + 8u * (u % 2u);
    for (var i = 0u; i < 8u; i++) {
        let c = ld8(qo + i);
        let v = (c & 3u) | (((c >> 2u) & 3u) << 8u) | (((c >> 4u) & 3u) << 16u) | ((c >> 6u) << 24u);
        r.q[i] = sub_bytes(v, 1u);
    }
    return r;
}

const SUMS: u32 = SUMS_WHOLE;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return w.d * (da.x * f32(s.ql + s.qh));
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return q * w.d;
}
