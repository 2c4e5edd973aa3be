// quant/wgsl/q4_0.wgsl — Q4_0 decode (block.wgsl interface). Block: 18 B / 32 elements:
// F16 d, 16 B qs; element j is the low nibble of qs[j], j + 16 the high nibble;
// w = d·(n − 8). Activations Q8_0; y = f32(Σ (n − 8)·a)·(d·d_a) per block.

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 18u * u;
    r.d = f16_at(bo);
    for (var i = 0u; i < 4u; i++) {
        let b = ld(bo + 2u + 4u * i);
        r.q[i] = sub_bytes(b & M4, 8u);
        r.q[i + 4u] = sub_bytes((b >> 4u) & M4, 8u);
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
