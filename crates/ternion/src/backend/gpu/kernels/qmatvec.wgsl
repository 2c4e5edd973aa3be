// qmatvec.wgsl — out (= or +=) W · x for weights in a GGUF storage format, read as stored
// in the file (no repacking): F32, F16, BF16 against f32 activations; Q8_0 and Q4_0
// against Q8_0 activations; Q4_K, Q6_K and TQ2_0 against Q8_K activations (quant_act.wgsl),
// the pairing of backend/cpu/linear.rs. FMT selects the format (override constant). The
// `gather` entry point dequantizes whole rows (token embeddings stored in these formats).
//
// Bindings (group 0):
//   0 uniform Params { rows, units, row0, out_stride, row_bytes, act_stride, nb, post }:
//                     rows in this shard, 32-element units per row (4-element for F32/F16/
//                     BF16), first output column of the shard, output row stride, bytes per
//                     weight row, activation words per token (k for float formats, k/4
//                     for packed int8), activation scales per token, f32 bits of the output
//                     scale (1 unless the model has one)
//   1 storage read  w:     array<u32>  this shard's rows, bytes exactly as in the file
//                                      (rows at byte offset row·row_bytes; blocks of 18, 34,
//                                      66 or 210 bytes may start at any even offset, so
//                                      words are read through `ld`, which joins two words)
//   2 storage read  act:   array<u32>  float formats: T × k f32 (as bits); quantized: T × k/4
//                                      words of packed int8
//   3 storage read  act_d: array<f32>  T × nb block scales (float formats bind anything)
//   4 storage rw    out:   array<f32>  T × out_stride; writes row0 .. row0 + rows
//   5 uniform Step { n_tokens, .. }    matmul4 only
//   6 storage read  ids:   array<u32>  gather only: T token ids
// Dispatch: matvec (ceil(rows / (256/TPR)), T, 1); matmul4 (ceil(rows / (256/TPR)),
// ceil(T/4), 1); gather (ceil(units / 256), T, 1) with out_stride = k; one dispatch per
// shard. In matvec/matmul4 a workgroup is 256/TPR rows × TPR lanes; lanes
// stride over the row's units and their partial sums are reduced by subgroupShuffleXor
// (SUBGROUPS, TPR ≤ the minimum subgroup size) or in shared memory. matmul4 decodes each
// weight unit once for up to 4 tokens.
//
// Block layouts (ggml; see quant/*.rs), element offsets within a 256-element super-block:
//   Q8_0 (34 B / 32): F16 d, 32 × i8.                     w = d·q
//   Q4_0 (18 B / 32): F16 d, 16 B: element j low nibble of byte j, j+16 the high nibble.
//                                                         w = d·(n − 8)
//   Q4_K (144 B / 256): F16 d, F16 dmin, 12 B of 6-bit scales/mins, 128 B qs; sub-block
//         j (32 elements) = nibbles (low if j even) of qs[32(j/2) ..].  w = d·s_j·n − dmin·m_j
//   Q6_K (210 B / 256): ql[128], qh[64], i8 scales[16], F16 d; unit v = 4h + c covers
//         elements 32v ..: low 4 bits from ql[64h + 32(c&1) + l] (nibble c/2), high 2 bits
//         from qh[32h + l] >> 2c; scale per 16 elements.       w = d·s·(q − 32)
//   TQ2_0 (66 B / 256): qs[64], F16 d; unit v = 4h + n: codes (qs[32h + l] >> 2n) & 3.
//                                                         w = d·(code − 1)
// Signed int8 lanes are made with a borrow-free per-byte subtraction (`sub_bytes`), so
// dot4I8Packed multiplies the weights and activations directly.
//
// Numerics: integer dots are exact; per unit (32 elements), the integer sum is scaled in the
// CPU's expression (Q8_0/Q4_0: f32(Σ)·(d_w·d_a); Q6_K: (d_w·d_a)·f32(Σ); Q4_K:
// (d_a·d)·f32(Σs·Σnq) − (d_a·dmin)·f32(Σm·Σq); TQ2_0: f32(Σ)·(d_a·d_w)); the CPU sums a
// whole super-block in integers first and all units in a different order, so results agree
// to f32 summation error. Float formats accumulate f32 products in a different order than
// the CPU; BF16 rounds x to BF16 first (RNE, ggml's vec_dot_type) and F16 does when
// ROUND_X (single-token decode, as ggml). unpack2x16float is exact, so no F16 variant.

override FMT: u32 = 0u;
override TPR: u32 = 32u;
override EPILOGUE: u32 = 0u;
override ROUND_X: bool = false;
const WG: u32 = 256u;
const M4: u32 = 0x0f0f0f0fu;
const M2: u32 = 0x03030303u;
const ONES: u32 = 0x01010101u;

const F_F32: u32 = 0u;
const F_F16: u32 = 1u;
const F_BF16: u32 = 2u;
const F_Q8_0: u32 = 3u;
const F_Q4_0: u32 = 4u;
const F_Q4_K: u32 = 5u;
const F_Q6_K: u32 = 6u;
const F_TQ2_0: u32 = 7u;

struct Params {
    rows: u32,
    units: u32,
    row0: u32,
    out_stride: u32,
    row_bytes: u32,
    act_stride: u32,
    nb: u32,
    post: f32,
}
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<u32>;
@group(0) @binding(3) var<storage, read> act_d: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;
@group(0) @binding(6) var<storage, read> ids: array<u32>;

#if SUBGROUPS
fn reduce4(v: vec4<f32>, li: u32) -> vec4<f32> {
    var s = v;
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}
#else
var<workgroup> red4: array<vec4<f32>, WG>;

// Sum over the TPR lanes of a row; the result is valid in lane 0.
fn reduce4(v: vec4<f32>, li: u32) -> vec4<f32> {
    let lane = li % TPR;
    red4[li] = v;
    workgroupBarrier();
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        if (lane < o) {
            red4[li] = red4[li] + red4[li + o];
        }
        workgroupBarrier();
    }
    return red4[li];
}
#endif

// The 4 bytes at byte offset o of w (any alignment).
fn ld(o: u32) -> u32 {
    let i = o >> 2u;
    let s = (o & 3u) * 8u;
    if (s == 0u) {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}

fn ld8(o: u32) -> u32 {
    return (w[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// The F16 at the even byte offset o, as f32.
fn f16_at(o: u32) -> f32 {
    return unpack2x16float((w[o >> 2u] >> ((o & 2u) * 8u)) & 0xffffu).x;
}

fn i8_at(o: u32) -> i32 {
    return bitcast<i32>(ld8(o) << 24u) >> 24u;
}

// Bytes of v (each ≤ 0x7f) minus c (≤ 0x80), as int8 lanes, without borrows between bytes.
fn sub_bytes(v: u32, c: u32) -> u32 {
    return ((v | 0x80808080u) - c * ONES) ^ 0x80808080u;
}

fn bf16_round(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

fn xval(i: u32) -> f32 {
    let v = bitcast<f32>(act[i]);
    if (FMT == F_BF16) {
        return bf16_round(v);
    }
    if (FMT == F_F16 && ROUND_X) {
        return round_f16(v);
    }
    return v;
}

fn xvec(i: u32) -> vec4<f32> {
    return vec4<f32>(xval(i), xval(i + 1u), xval(i + 2u), xval(i + 3u));
}

// Float formats: the 4 weights of unit u (elements 4u .. 4u+3) as f32.
fn wfloat(ro: u32, u: u32) -> vec4<f32> {
    if (FMT == F_F32) {
        let o = ro + 16u * u;
        return vec4<f32>(bitcast<f32>(ld(o)), bitcast<f32>(ld(o + 4u)), bitcast<f32>(ld(o + 8u)), bitcast<f32>(ld(o + 12u)));
    }
    let o = ro + 8u * u;
    let w0 = ld(o);
    let w1 = ld(o + 4u);
    if (FMT == F_F16) {
        return vec4<f32>(unpack2x16float(w0), unpack2x16float(w1));
    }
    return vec4<f32>(bitcast<f32>(w0 << 16u), bitcast<f32>(w0 & 0xffff0000u), bitcast<f32>(w1 << 16u), bitcast<f32>(w1 & 0xffff0000u));
}

fn unit_float(ro: u32, u: u32, a: vec4<u32>, nt: u32) -> vec4<f32> {
    let wv = wfloat(ro, u);
    var y = vec4<f32>(0.0);
    for (var j = 0u; j < nt; j++) {
        y[j] = dot(wv, xvec(a[j] + 4u * u));
    }
    return y;
}

// Σ_i dot4I8Packed(wq[i], act[a0 + i]) over words i0 .. i0+n.
fn idot(wq: array<u32, 8>, a0: u32, i0: u32, n: u32) -> i32 {
    var s = 0;
    for (var i = i0; i < i0 + n; i++) {
        s += dot4I8Packed(wq[i], act[a0 + i]);
    }
    return s;
}

// One decoded 32-element unit of a quantized row: int8 lanes `q` (element 4i+b in byte b
// of word i) and its scales. Q8_0, Q4_0, TQ2_0: w = d·q. Q6_K: w = d·s·q with s = s0 for
// elements 0..15, s1 for 16..31. Q4_K: w = d·s0·q − dmin·s1 (q = the unsigned nibble).
struct Unit {
    q: array<u32, 8>,
    d: f32,
    dmin: f32,
    s0: i32,
    s1: i32,
}

fn decode(ro: u32, u: u32) -> Unit {
    var r: Unit;
    r.s0 = 1;
    r.s1 = 1;
    r.dmin = 0.0;
    switch FMT {
        case F_Q8_0: {
            let bo = ro + 34u * u;
            r.d = f16_at(bo);
            for (var i = 0u; i < 8u; i++) {
                r.q[i] = ld(bo + 2u + 4u * i);
            }
        }
        case F_Q4_0: {
            let bo = ro + 18u * u;
            r.d = f16_at(bo);
            for (var i = 0u; i < 4u; i++) {
                let b = ld(bo + 2u + 4u * i);
                r.q[i] = sub_bytes(b & M4, 8u);
                r.q[i + 4u] = sub_bytes((b >> 4u) & M4, 8u);
            }
        }
        case F_Q4_K: {
            let sb = u % 8u;
            let bo = ro + 144u * (u / 8u);
            r.d = f16_at(bo);
            r.dmin = f16_at(bo + 2u);
            if (sb < 4u) {
                r.s0 = i32(ld8(bo + 4u + sb) & 63u);
                r.s1 = i32(ld8(bo + 8u + sb) & 63u);
            } else {
                let hi = ld8(bo + 8u + sb);
                r.s0 = i32((hi & 0xfu) | ((ld8(bo + sb) >> 6u) << 4u));
                r.s1 = i32((hi >> 4u) | ((ld8(bo + 4u + sb) >> 6u) << 4u));
            }
            let sh = 4u * (sb & 1u);
            for (var i = 0u; i < 8u; i++) {
                r.q[i] = (ld(bo + 16u + 32u * (sb / 2u) + 4u * i) >> sh) & M4;
            }
        }
        case F_Q6_K: {
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
        }
        default: {
            // TQ2_0
            let v = u % 8u;
            let bo = ro + 66u * (u / 8u);
            r.d = f16_at(bo + 64u);
            let sh = 2u * (v % 4u);
            for (var i = 0u; i < 8u; i++) {
                r.q[i] = sub_bytes((ld(bo + 32u * (v / 4u) + 4u * i) >> sh) & M2, 1u);
            }
        }
    }
    return r;
}

// Quantized formats: unit u = elements 32u .. 32u+31 of the row; `a` = the tokens' first
// activation words, `db` their first scale indices.
fn unit_quant(ro: u32, u: u32, a: vec4<u32>, db: vec4<u32>, nt: u32) -> vec4<f32> {
    let w = decode(ro, u);
    var y = vec4<f32>(0.0);
    for (var j = 0u; j < nt; j++) {
        let a0 = a[j] + 8u * u;
        switch FMT {
            case F_Q8_0, F_Q4_0: {
                y[j] = f32(idot(w.q, a0, 0u, 8u)) * (w.d * act_d[db[j] + u]);
            }
            case F_Q4_K: {
                var sq = 0;
                for (var i = 0u; i < 8u; i++) {
                    sq += dot4I8Packed(ONES, act[a0 + i]);
                }
                let da = act_d[db[j] + u / 8u];
                y[j] = (da * w.d) * f32(w.s0 * idot(w.q, a0, 0u, 8u)) - (da * w.dmin) * f32(w.s1 * sq);
            }
            case F_Q6_K: {
                let isum = w.s0 * idot(w.q, a0, 0u, 4u) + w.s1 * idot(w.q, a0, 4u, 4u);
                y[j] = (w.d * act_d[db[j] + u / 8u]) * f32(isum);
            }
            default: {
                y[j] = f32(idot(w.q, a0, 0u, 8u)) * (act_d[db[j] + u / 8u] * w.d);
            }
        }
    }
    return y;
}

fn body(li: u32, wg: vec3<u32>, t0: u32, nt: u32) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let ts = vec4<u32>(t0, t0 + 1u, t0 + 2u, t0 + 3u);
    let a = ts * p.act_stride;
    let db = ts * p.nb;
    var acc = vec4<f32>(0.0);
    if (row < p.rows) {
        let ro = row * p.row_bytes;
        for (var u = lane; u < p.units; u += TPR) {
            if (FMT <= F_BF16) {
                acc += unit_float(ro, u, a, nt);
            } else {
                acc += unit_quant(ro, u, a, db, nt);
            }
        }
    }
    let s = reduce4(acc, li);
    if (lane == 0u && row < p.rows) {
        for (var j = 0u; j < nt; j++) {
            let o = (t0 + j) * p.out_stride + p.row0 + row;
            let y = s[j] * p.post;
            if (EPILOGUE == 1u) {
                out[o] = out[o] + y;
            } else {
                out[o] = y;
            }
        }
    }
}

@compute @workgroup_size(256)
fn matvec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    body(li, wg, wg.y, 1u);
}

@compute @workgroup_size(256)
fn matmul4(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t0 = wg.y * 4u;
    body(li, wg, t0, min(4u, step.n_tokens - t0));
}

// Gather: out[t][..] = dequantized row ids[t] − row0 of this shard (rows of other shards are
// left to their own dispatch). A thread per unit; the CPU's dequantization expressions.
@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u = gid.x;
    let t = gid.y;
    let id = ids[t];
    if (u >= p.units || id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    let ro = (id - p.row0) * p.row_bytes;
    if (FMT <= F_BF16) {
        let v = wfloat(ro, u);
        for (var i = 0u; i < 4u; i++) {
            out[t * p.out_stride + 4u * u + i] = v[i];
        }
        return;
    }
    let w = decode(ro, u);
    for (var e = 0u; e < 32u; e++) {
        let q = f32(bitcast<i32>((w.q[e / 4u] >> (8u * (e % 4u))) << 24u) >> 24u);
        var v: f32;
        switch FMT {
            case F_Q4_K: {
                v = (w.d * f32(w.s0)) * q - w.dmin * f32(w.s1);
            }
            case F_Q6_K: {
                v = (w.d * f32(select(w.s1, w.s0, e < 16u))) * q;
            }
            default: {
                v = q * w.d;
            }
        }
        out[t * p.out_stride + 32u * u + e] = v;
    }
}
