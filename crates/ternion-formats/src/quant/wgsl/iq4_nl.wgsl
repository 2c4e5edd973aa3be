// quant/wgsl/iq4_nl.wgsl — IQ4_NL decode (block.wgsl interface). Block: 18 B / 32 elements:
// F16 d, 16 B qs; element j is the low nibble of qs[j], j + 16 the high nibble;
// w = d·KV[n] with ggml's kvalues_iq4nl grid. Activations Q8_0;
// y = f32(Σ KV[n]·a)·(d·d_a) per block (ggml's vec_dot_iq4_nl_q8_0: (d_a·d)·Σ, the same
// product).

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let bo = ro + 18u * u;
    r.d = f16_at(bo);
    for (var i = 0u; i < 4u; i++) {
        let b = ld(bo + 2u + 4u * i);
        r.q[i] = kv4(b & M4);
        r.q[i + 4u] = kv4((b >> 4u) & M4);
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
    return w.d * q;
}
