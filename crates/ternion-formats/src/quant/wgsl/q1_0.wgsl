// quant/wgsl/q1_0.wgsl — Q1_0 (ggml type 41) decode (block.wgsl interface). Block: 18 B / 128
// elements: F16 d, 16 B of sign bits (element j = bit j % 8 of byte 2 + j / 8); w = ±d.
// Unit u is elements 32(u % 4) .. of block u / 4: the 4 bytes at 2 + 4(u % 4).
// Activations Q8_0; y = d·(d_a·f32(Σ ±a)) per unit (ggml's vec_dot_q1_0_q8_0 sums the four
// d_a·Σ of a block before multiplying by d).

// Bits 0..3 of h as int8 lanes ±1 (set → +1).
fn signs4(h: u32) -> u32 {
    let s = (h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u);
    return sub_bytes(2u * s, 1u);
}

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 18u * (u / 4u);
    r.d = f16_at(bo);
    let bits = ld(bo + 2u + 4u * (u % 4u));
    for (var i = 0u; i < 8u; i++) {
        r.q[i] = signs4(bits >> (4u * i));
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
