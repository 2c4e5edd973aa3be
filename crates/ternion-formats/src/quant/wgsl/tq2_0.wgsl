// quant/wgsl/tq2_0.wgsl — TQ2_0 decode (block.wgsl interface; TQ1_0 is uploaded repacked to
// it). Block: 66 B / 256: qs[64], F16 d; unit v = 4h + n (v = u % 8): codes
// (qs[32h + l] >> 2n) & 3; w = d·(code − 1). Activations Q8_K; y = f32(Σ)·(d_a·d) per unit.

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let v = u % 8u;
    let bo = ro + 66u * (u / 8u);
    r.d = f16_at(bo + 64u);
    let sh = 2u * (v % 4u);
    for (var i = 0u; i < 8u; i++) {
        r.q[i] = sub_bytes((ld(bo + 32u * (v / 4u) + 4u * i) >> sh) & M2, 1u);
    }
    return r;
}

const SUMS: u32 = SUMS_WHOLE;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u / 8u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return f32(s.ql + s.qh) * (da.x * w.d);
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return q * w.d;
}
