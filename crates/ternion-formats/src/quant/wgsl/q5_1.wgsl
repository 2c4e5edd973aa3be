// formats/q5_1.wgsl — Q5_1 decode (block.wgsl interface). Block: 24 B / 32 elements:
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

fn unit_dot(w: Unit, a0: u32, db: u32, u: u32) -> f32 {
    return (w.d * act_d[db + 2u * u]) * f32(idot(w.q, a0, 0u, 8u)) + w.dmin * act_d[db + 2u * u + 1u];
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return q * w.d + w.dmin;
}
