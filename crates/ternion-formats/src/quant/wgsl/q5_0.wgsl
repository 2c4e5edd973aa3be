// quant/wgsl/q5_0.wgsl — Q5_0 decode (block.wgsl interface). Block: 22 B / 32 elements:
// F16 d, qh (u32 LE at byte 2: bit j = fifth bit of element j), 16 B qs (element j the low
// nibble of qs[j], j + 16 the high nibble); w = d·(q − 16). Activations Q8_0;
// y = f32(Σ (q − 16)·a)·(d·d_a) per block (ggml's vec_dot_q5_0_q8_0: (d·d_a)·Σ, the same
// product).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 22u * u;
    r.d = f16_at(bo);
    let qh = ld(bo + 2u);
    for (var i = 0u; i < 4u; i++) {
        let b = ld(bo + 6u + 4u * i);
        r.q[i] = sub_bytes((b & M4) | spread4(qh >> (4u * i)), 16u);
        r.q[i + 4u] = sub_bytes(((b >> 4u) & M4) | spread4(qh >> (16u + 4u * i)), 16u);
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
