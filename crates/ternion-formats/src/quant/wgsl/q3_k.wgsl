// quant/wgsl/q3_k.wgsl — Q3_K decode (block.wgsl interface). Super-block: 110 B / 256:
// hmask[32], qs[64], scales[12] (sixteen 6-bit scales), F16 d; unit v = 4h + j
// (v = u % 8): low bits (qs[32h + l] >> 2j) & 3, high bit (hmask[l] >> (4h + j)) & 1,
// q = low − (high ? 0 : 4); scale i = (i < 8 ? scales[i] & 15 : scales[i − 8] >> 4) |
// ((scales[8 + i % 4] >> 2(i / 4)) & 3) << 4, minus 32 (Unit s0 / s1: elements 0..15 /
// 16..31); w = d·s·q. Activations Q8_K; y = (d·d_a)·f32(s0·Σ_lo + s1·Σ_hi) per unit.

fn q3k_scale(so: u32, i: u32) -> i32 {
    var lo = ld8(so + i) & 15u;
    if (i >= 8u) {
        lo = ld8(so + i - 8u) >> 4u;
    }
    let hi = (ld8(so + 8u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return i32(lo | (hi << 4u)) - 32;
}

fn decode(ro: u32, u: u32) -> Unit {
    var r = unit_new();
    let v = u % 8u;
    let h = v / 4u;
    let j = v % 4u;
    let bo = ro + 110u * (u / 8u);
    r.d = f16_at(bo + 108u);
    r.s0 = q3k_scale(bo + 96u, 2u * v);
    r.s1 = q3k_scale(bo + 96u, 2u * v + 1u);
    for (var i = 0u; i < 8u; i++) {
        let low = (ld(bo + 32u + 32u * h + 4u * i) >> (2u * j)) & M2;
        let high = (ld(bo + 4u * i) >> (4u * h + j)) & ONES;
        r.q[i] = sub_bytes(low | (high << 2u), 4u);
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
