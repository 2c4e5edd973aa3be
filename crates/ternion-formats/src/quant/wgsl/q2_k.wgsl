// quant/wgsl/q2_k.wgsl — Q2_K decode (block.wgsl interface). Super-block: 84 B / 256:
// scales[16] (per 16 elements: low nibble scale, high nibble min), qs[64], F16 d, F16 dmin;
// unit v = 4h + j (v = u % 8): codes (qs[32h + l] >> 2j) & 3; w = d·sc·q − dmin·m
// (Unit: s0 / s1 = the scale bytes of elements 0..15 / 16..31). Activations Q8_K;
// y = (d_a·d)·f32(Σ sc·Σ q·a) − (d_a·dmin)·f32(Σ m·Σ a) per unit (the CPU sums a
// super-block in integers first, as ggml's vec_dot_q2_K_q8_K).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let v = u % 8u;
    let bo = ro + 84u * (u / 8u);
    r.d = f16_at(bo + 80u);
    r.dmin = f16_at(bo + 82u);
    r.s0 = i32(ld8(bo + 2u * v));
    r.s1 = i32(ld8(bo + 2u * v + 1u));
    let sh = 2u * (v % 4u);
    for (var i = 0u; i < 8u; i++) {
        r.q[i] = (ld(bo + 16u + 32u * (v / 4u) + 4u * i) >> sh) & M2;
    }
    return r;
}

const SUMS: u32 = SUMS_WITH_A;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u / 8u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    let isum = (w.s0 & 15) * s.ql + (w.s1 & 15) * s.qh;
    let msum = (w.s0 >> 4u) * s.al + (w.s1 >> 4u) * s.ah;
    return (da.x * w.d) * f32(isum) - (da.x * w.dmin) * f32(msum);
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    let sc = select(w.s1, w.s0, e < 16u);
    return (w.d * f32(sc & 15)) * q - w.dmin * f32(sc >> 4u);
}
