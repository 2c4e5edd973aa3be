// formats/block.wgsl — qmatvec.wgsl include shared by the block formats (int8 activations
// from quant_act.wgsl), followed by the format's own include, which defines
//   decode(ro, u) -> Unit               unit u (elements 32u .. 32u+31) of the row at ro
//   unit_scales(db, u) -> vec2<f32>     the activation scale(s) of unit u of a token whose
//                                       first scale word is db (Q8_0: d_a; Q8_1: d_a, s_a;
//                                       Q8_K: the super-block's d_a)
//   unit_sum(w, s, da) -> f32           the unit's product with one token from its integer
//                                       sums `s` (Sums) and scales `da`
//   const SUMS: u32                     which sums unit_sum reads (SUMS_* below)
//   unit_value(w, e, q) -> f32          element e of the unit, q its int8 lane as f32
// in the CPU reference's expressions. `unit_dot` (below) joins them for one token.

const M4: u32 = 0x0f0f0f0fu;
const M2: u32 = 0x03030303u;
const ONES: u32 = 0x01010101u;

// One decoded 32-element unit: int8 lanes `q` (element 4i+b in byte b of word i) and its
// scales, whose meaning each format's header gives.
struct Unit {
    q: array<u32, 8>,
    d: f32,
    dmin: f32,
    s0: i32,
    s1: i32,
}

// Bytes of v (each ≤ 0x7f) minus c (≤ 0x80), as int8 lanes, without borrows between bytes.
fn sub_bytes(v: u32, c: u32) -> u32 {
    return ((v | 0x80808080u) - c * ONES) ^ 0x80808080u;
}

// Bits 0..3 of h moved to bit 4 of bytes 0..3 (the fifth bits of Q5_0/Q5_1 codes).
fn spread4(h: u32) -> u32 {
    return ((h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u)) << 4u;
}

// Integer sums of a unit against one token: Σ q·a over elements 0..15 (ql) and 16..31
// (qh), and Σ a over the same halves (al, ah; formats with mins read them).
struct Sums {
    ql: i32,
    qh: i32,
    al: i32,
    ah: i32,
}

// Σ_i dot4I8Packed(wq[i], act[a0 + i]) over words i0 .. i0+n.
fn idot(wq: array<u32, 8>, a0: u32, i0: u32, n: u32) -> i32 {
    var s = 0;
    for (var i = i0; i < i0 + n; i++) {
        s += dot4I8Packed(wq[i], act[a0 + i]);
    }
    return s;
}

// Σ_i dot4I8Packed(ONES, act[a0 + i]) over words i0 .. i0+n.
fn asum(a0: u32, i0: u32, n: u32) -> i32 {
    var s = 0;
    for (var i = i0; i < i0 + n; i++) {
        s += dot4I8Packed(ONES, act[a0 + i]);
    }
    return s;
}

// Which sums a format's `unit_sum` reads (its `SUMS`): Σ q·a of the whole unit (in ql,
// qh = 0), of each half, or of each half with Σ a.
const SUMS_WHOLE: u32 = 0u;
const SUMS_HALVES: u32 = 1u;
const SUMS_WITH_A: u32 = 2u;

// Unit w against the token whose activation words of this unit start at a0, computing
// only the sums the format reads.
fn unit_dot(w: Unit, a0: u32, db: u32, u: u32) -> f32 {
    var s: Sums;
    if (SUMS == SUMS_WHOLE) {
        s.ql = idot(w.q, a0, 0u, 8u);
    } else {
        s.ql = idot(w.q, a0, 0u, 4u);
        s.qh = idot(w.q, a0, 4u, 4u);
        if (SUMS == SUMS_WITH_A) {
            s.al = asum(a0, 0u, 4u);
            s.ah = asum(a0, 4u, 4u);
        }
    }
    return unit_sum(w, s, unit_scales(db, u));
}

// The 6-bit (scale, min) of sub-block j of a Q4_K/Q5_K super-block whose 12 scale bytes
// start at byte so: j < 4: low 6 bits of bytes j and j + 4; j ≥ 4: the nibbles of byte
// j + 4 with the top two bits of bytes j − 4 and j as high bits.
fn scale_min_k4(so: u32, j: u32) -> vec2<i32> {
    if (j < 4u) {
        return vec2<i32>(i32(ld8(so + j) & 63u), i32(ld8(so + 4u + j) & 63u));
    }
    let hi = ld8(so + 4u + j);
    return vec2<i32>(i32((hi & 0xfu) | ((ld8(so + j - 4u) >> 6u) << 4u)), i32((hi >> 4u) | ((ld8(so + j) >> 6u) << 4u)));
}

// Q4_K/Q5_K unit product: (d_a·d)·f32(scale·Σ q·a) − (d_a·dmin)·f32(min·Σ a), with the
// scale in w.s0 and the min in w.s1.
fn unit_sum_scale_min(w: Unit, s: Sums, da: f32) -> f32 {
    return (da * w.d) * f32(w.s0 * (s.ql + s.qh)) - (da * w.dmin) * f32(w.s1 * (s.al + s.ah));
}

// ggml's kvalues_iq4nl (IQ4_NL, IQ4_XS) as int8 bytes.
var<private> KV: array<u32, 16> = array<u32, 16>(
    0x81u, 0x98u, 0xadu, 0xbfu, 0xcfu, 0xddu, 0xeau, 0xf6u,
    0x01u, 0x0du, 0x19u, 0x26u, 0x35u, 0x45u, 0x59u, 0x71u
);

// The grid bytes of the 4 codes in bytes of c (each ≤ 15).
fn kv4(c: u32) -> u32 {
    return KV[c & 0xfu] | (KV[(c >> 8u) & 0xfu] << 8u) | (KV[(c >> 16u) & 0xfu] << 16u) | (KV[c >> 24u] << 24u);
}

// Q3_K/Q6_K unit product: a scale per 16 elements (w.s0 for elements 0..15, w.s1 for
// 16..31): (d·d_a)·f32(s0·Σ_lo + s1·Σ_hi).
fn unit_sum_halves(w: Unit, s: Sums, da: f32) -> f32 {
    return (w.d * da) * f32(w.s0 * s.ql + w.s1 * s.qh);
}

// Element e of such a unit: (d·s)·q.
fn unit_value_halves(w: Unit, e: u32, q: f32) -> f32 {
    return (w.d * f32(select(w.s1, w.s0, e < 16u))) * q;
}

// A Unit with unit scales and no offset, for decoders to fill.
fn unit_new() -> Unit {
    var r: Unit;
    r.s0 = 1;
    r.s1 = 1;
    r.dmin = 0.0;
    return r;
}

fn unit(ro: u32, u: u32, a: vec4<u32>, db: vec4<u32>, nt: u32) -> vec4<f32> {
    let w = decode(ro, u);
    var y = vec4<f32>(0.0);
    for (var j = 0u; j < nt; j++) {
        y[j] = unit_dot(w, a[j] + 8u * u, db[j], u);
    }
    return y;
}

fn gather_unit(ro: u32, u: u32, t: u32) {
    let w = decode(ro, u);
    for (var e = 0u; e < 32u; e++) {
        let q = f32(bitcast<i32>((w.q[e / 4u] >> (8u * (e % 4u))) << 24u) >> 24u);
        out[t * p.out_stride + 32u * u + e] = unit_value(w, e, q);
    }
}
