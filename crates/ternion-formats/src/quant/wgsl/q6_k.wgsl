// quant/wgsl/q6_k.wgsl — Q6_K decode (block.wgsl interface). Super-block: 210 B / 256:
// ql[128], qh[64], i8 scales[16], F16 d; unit v = 4h + c covers elements 32v ..: low 4 bits
// from ql[64h + 32(c&1) + l] (nibble c/2), high 2 bits from qh[32h + l] >> 2c; a scale per
// 16 elements (Unit s0: elements 0..15, s1: 16..31); w = d·s·(q − 32). Activations Q8_K;
// y = (d·d_a)·f32(s0·Σ_lo + s1·Σ_hi) per unit.

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let v = u % 8u;
    let h = v / 4u;
    let c = v % 4u;
    let bo = ro + 210u * (u / 8u);
    r.d = f16_at(bo + 208u);
    r.s0 = i8_at(bo + 192u + 8u * h + 2u * c);
    r.s1 = i8_at(bo + 193u + 8u * h + 2u * c);
    let lo_sh = 4u * (c / 2u);
    for (var i = 0u; i < 8u; i++) {
        let ql = (ld(bo + 64u * h + 32u * (c & 1u) + 4u * i) >> lo_sh) & M4;
        let qh = (ld(bo + 128u + 32u * h + 4u * i) >> (2u * c)) & M2;
        r.q[i] = sub_bytes(ql | (qh << 4u), 32u);
    }
    return r;
}

const SUMS: u32 = SUMS_HALVES;

fn unit_scales(db: u32, u: u32) -> vec2<f32> {
    return vec2<f32>(act_d[db + u / 8u], 0.0);
}

fn unit_sum(w: Unit, s: Sums, da: vec2<f32>) -> f32 {
    return unit_sum_halves(w, s, da.x);
}

fn unit_value(w: Unit, e: u32, q: f32) -> f32 {
    return unit_value_halves(w, e, q);
}
