// quant/wgsl/q5_1.wgsl — Q5_1 decode (block.wgsl interface). Block: 24 B / 32 elements:
// F16 d, F16 m, qh (u32 LE at byte 4: bit j = fifth bit of element j), 16 B qs (element j
// the low nibble of qs[j], j + 16 the high nibble); w = q·d + m (Unit: q = the unsigned
// code, dmin = m). Activations Q8_1 (act_d holds (d_a, s_a) per block);
// y = (d·d_a)·f32(Σ q·a) + m·s_a per block (ggml's vec_dot_q5_1_q8_1).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 24u * u;
    r.d = f16_at(bo);
    r.dmin = f16_at(bo + 2u);
    let qh = ld(bo + 4u);
    for (var i = 0u; i < 4u; i++) {
        let b = ld(bo + 8u + 4u * i);
        r.q[i] = (b & M4) | spread4(qh >> (4u * i));
        r.q[i + 4u] = ((b >> 4u) & M4) | spread4(qh >> (16u + 4u * i));
    }
    return r;
}

const SUMS: u32 = SUMS_WHOLE;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + 2u * u], act_d[db + 2u * u + 1u]);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return (w.d * da.x) * f32(s.ql + s.qh) + w.dmin * da.y;
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return q * w.d + w.dmin;
}
