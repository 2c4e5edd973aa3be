// quant/wgsl/q8_0.wgsl — Q8_0 decode (block.wgsl interface). Block: 34 B / 32 elements:
// F16 d, 32 × i8 q; w = d·q. Activations Q8_0; y = f32(Σ q·a)·(d·d_a) per block.

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 34u * u;
    r.d = f16_at(bo);
    for (var i = 0u; i < 8u; i++) {
        r.q[i] = ld(bo + 2u + 4u * i);
    }
    return r;
}

const SUMS: u32 = SUMS_WHOLE;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return f32(s.ql + s.qh) * (w.d * da.x);
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return q * w.d;
}
