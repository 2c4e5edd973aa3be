// quant/wgsl/iq4_xs.wgsl — IQ4_XS decode (block.wgsl interface). Super-block: 136 B / 256:
// F16 d, u16 scales_h, scales_l[4], qs[128]; sub-block ib = u % 8 has the 6-bit scale
// ls = (nibble ib % 2 of scales_l[ib / 2]) | ((scales_h >> 2ib) & 3) << 4 and the IQ4_NL
// codes qs[16ib ..] (low nibbles first); w = d·(ls − 32)·KV[n] (Unit: s0 = ls − 32).
// Activations Q8_K; y = ((d·d_a)·(ls − 32))·f32(Σ KV[n]·a) per unit, ggml's
// vec_dot_iq4_xs_q8_K expression.

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let ib = u % 8u;
    let bo = ro + 136u * (u / 8u);
    r.d = f16_at(bo);
    let h = (ld8(bo + 2u) | (ld8(bo + 3u) << 8u)) >> (2u * ib);
    let lo = (ld8(bo + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu;
    r.s0 = i32(lo | ((h & 3u) << 4u)) - 32;
    for (var i = 0u; i < 4u; i++) {
        let b = ld(bo + 8u + 16u * ib + 4u * i);
        r.q[i] = kv4(b & M4);
        r.q[i + 4u] = kv4((b >> 4u) & M4);
    }
    return r;
}

const SUMS: u32 = SUMS_WHOLE;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u / 8u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return ((w.d * da.x) * f32(w.s0)) * f32(s.ql + s.qh);
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return (w.d * f32(w.s0)) * q;
}
