// quant/wgsl/q4_1.wgsl — Q4_1 decode (block.wgsl interface). Block: 20 B / 32 elements:
// F16 d, F16 m, 16 B qs; element j is the low nibble of qs[j], j + 16 the high nibble;
// w = n·d + m (Unit: q = the unsigned nibble, dmin = m). Activations Q8_1 (act_d holds
// (d_a, s_a) per block); y = (d·d_a)·f32(Σ n·a) + m·s_a per block (ggml's
// vec_dot_q4_1_q8_1).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 20u * u;
    r.d = f16_at(bo);
    r.dmin = f16_at(bo + 2u);
    for (var i = 0u; i < 4u; i++) {
        let b = ld(bo + 4u + 4u * i);
        r.q[i] = b & M4;
        r.q[i + 4u] = (b >> 4u) & M4;
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
