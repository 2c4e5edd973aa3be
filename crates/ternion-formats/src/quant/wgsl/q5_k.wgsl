// quant/wgsl/q5_k.wgsl — Q5_K decode (block.wgsl interface). Super-block: 176 B / 256: F16 d,
// F16 dmin, 12 B of 6-bit scales/mins (as Q4_K), qh[32], qs[128]; sub-block j (unit u % 8)
// = nibbles (low if j even) of qs[32(j/2) ..] with bit j of qh[l] as fifth bit;
// w = d·s_j·q − dmin·m_j (Unit: q = the unsigned code, s0 = s_j, s1 = m_j). Activations
// Q8_K; y = (d_a·d)·f32(s_j·Σ q·a) − (d_a·dmin)·f32(m_j·Σ a) per unit (the CPU sums a
// super-block in integers first).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let sb = u % 8u;
    let bo = ro + 176u * (u / 8u);
    r.d = f16_at(bo);
    r.dmin = f16_at(bo + 2u);
    let sm = scale_min_k4(bo + 4u, sb);
    r.s0 = sm.x;
    r.s1 = sm.y;
    let sh = 4u * (sb & 1u);
    for (var i = 0u; i < 8u; i++) {
        let lo = (ld(bo + 48u + 32u * (sb / 2u) + 4u * i) >> sh) & M4;
        let hi = (ld(bo + 16u + 4u * i) >> sb) & ONES;
        r.q[i] = lo | (hi << 4u);
    }
    return r;
}

const SUMS: u32 = SUMS_WITH_A;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u / 8u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return unit_sum_scale_min(w, s, da.x);
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return (w.d * f32(w.s0)) * q - w.dmin * f32(w.s1);
}
