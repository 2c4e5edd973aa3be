// ternary.wgsl — BitLinear: I2_S ternary weights × per-token int8 activations → f32,
// y = (Σ code·q − Σq) / s · w_scale  (= Σ t·q / s · w_scale with t = code − 1;
// docs/FORMATS.md#i2_s).
//
// Bindings (group 0):
//   0 uniform Params { rows, words, w_scale, up_scale }: output features M, u32 words per
//                     weight row (K/16), per-tensor I2_S scale (and the up matrix's, matvec_glu;
//                     0 for matvec and matmul4, whose residual add pins y with it)
//   1 storage read  w:    array<u32>        M × K/16 words: the I2_S codes exactly as in the
//                                          file (no repacking; the 32-byte tail is not bound)
//   2 storage read  act:  array<u32>        T × K/4 words of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, bits of i32 Σq
//   4 storage rw    out:  array<f32>        T × M; EPILOGUE 0 stores, 1 adds (residual)
//   5 uniform Step { n_tokens, .. }          matmul4 only
//   6 storage read  w_up: array<u32>        matvec_glu: the up projection; matvec3: the 2nd matrix
//  10 storage read  w3:   array<u32>        matvec3 only: the 3rd matrix
//  11 storage rw    out2: array<f32>        matvec3 only: T × M2
//  12 storage rw    out3: array<f32>        matvec3 only: T × M3
//  13 uniform Parts { m1, m2, scale2, scale3 } matvec3 only (p.rows = M1 + M2 + M3 total rows)
// Dispatch: matvec and matvec_glu (ceil(M / (256/TPR)), T, 1); matmul4 (ceil(M / (256/TPR)),
// ceil(T/4), 1). matvec_glu is the fused gated FFN: row r of gate (w) and of up (w_up) against
// the same activations, then out = act(g)·u with glu.wgsl's formulas (ACT 0: relu², 1: SiLU),
// so gate, up and their product never go through memory. matvec3 runs three matrices that
// share the activations (q, k, v) as one launch over their stacked rows, each row stored
// into its own output.
// A workgroup is 256 threads = 256/TPR rows × TPR lanes; lanes stride over the row's words
// and their partial sums are reduced by subgroupShuffleXor (variant SUBGROUPS, which the
// host only picks when TPR ≤ the adapter's minimum subgroup size) or in shared memory.
//
// Layout, and why no repacking is needed: in an I2_S block of 128 elements (32 bytes),
// byte i holds elements i, i+32, i+64, i+96 at shifts 6, 4, 2, 0. So u32 word j (0..8) of
// block b, shifted right by 6−2g and masked with 0x03030303, holds in its bytes 0..3 the
// codes (0, 1, 2) of elements 128b + 32g + 4j + 0..3 — exactly the 4 int8 activations of
// packed activation word 32b + 8g + j. dot4I8Packed multiplies them directly (codes are
// small non-negative int8), and Σq from the quantizer turns Σ code·q into Σ (code−1)·q.
// The integer sum is exact; the scaling is f32 in the reference's order.

override TPR: u32 = 32u;
override EPILOGUE: u32 = 0u;
override ACT: u32 = 0u;
const WG: u32 = 256u;
const M2: u32 = 0x03030303u;

struct Params { rows: u32, words: u32, w_scale: f32, up_scale: f32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<u32>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;
@group(0) @binding(6) var<storage, read> w_up: array<u32>;
@group(0) @binding(10) var<storage, read> w3: array<u32>;
@group(0) @binding(11) var<storage, read_write> out2: array<f32>;
@group(0) @binding(12) var<storage, read_write> out3: array<f32>;
struct Parts { m1: u32, m2: u32, scale2: f32, scale3: f32 }
@group(0) @binding(13) var<uniform> parts: Parts;

#if SUBGROUPS
fn reduce1(v: i32, li: u32) -> i32 {
    var s = v;
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}

fn reduce4(v: vec4<i32>, li: u32) -> vec4<i32> {
    var s = v;
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}
#else
var<workgroup> red1: array<i32, WG>;
var<workgroup> red4: array<vec4<i32>, WG>;

// Sum over the TPR lanes of a row; the result is valid in lane 0.
fn reduce1(v: i32, li: u32) -> i32 {
    let lane = li % TPR;
    red1[li] = v;
    workgroupBarrier();
    for (var o = TPR / 2u; o > 0u; o >>= 1u) {
        if (lane < o) {
            red1[li] = red1[li] + red1[li + o];
        }
        workgroupBarrier();
    }
    return red1[li];
}

fn reduce4(v: vec4<i32>, li: u32) -> vec4<i32> {
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

// Σ code·q of weight word `wv` against the 4 activation words it pairs with.
fn word_dot(wv: u32, a0: u32) -> i32 {
    return dot4I8Packed((wv >> 6u) & M2, act[a0])
        + dot4I8Packed((wv >> 4u) & M2, act[a0 + 8u])
        + dot4I8Packed((wv >> 2u) & M2, act[a0 + 16u])
        + dot4I8Packed(wv & M2, act[a0 + 24u]);
}

// First activation word paired with weight word i of a row, for the token at `abase`.
fn act_word(abase: u32, i: u32) -> u32 {
    return abase + (i >> 3u) * 32u + (i & 7u);
}

// The f32 output of integer dot `d` of token t for a matrix of scale `scale`.
fn scaled(t: u32, d: i32, scale: f32) -> f32 {
    let m = tok_scale[t];
    return (f32(d - bitcast<i32>(m.y)) / bitcast<f32>(m.x)) * scale;
}

fn finish(t: u32, row: u32, d: i32) {
    let y = scaled(t, d, p.w_scale);
    let o = t * p.rows + row;
    if (EPILOGUE == 1u) {
        // p.up_scale is 0 for matvec and matmul4 (common.wgsl `pinned`).
        out[o] = out[o] + pinned(y, bitcast<u32>(p.up_scale));
    } else {
        out[o] = y;
    }
}

@compute @workgroup_size(256)
fn matvec(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let t = wg.y;
    var acc = 0;
    if (row < p.rows) {
        let wbase = row * p.words;
        let abase = t * p.words * 4u;
        for (var i = lane; i < p.words; i += TPR) {
            acc += word_dot(w[wbase + i], act_word(abase, i));
        }
    }
    let d = reduce1(acc, li);
    if (lane == 0u && row < p.rows) {
        finish(t, row, d);
    }
}

@compute @workgroup_size(256)
fn matmul4(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let t0 = wg.y * 4u;
    let last = step.n_tokens - 1u;
    // Tokens past the end repeat the last one; their results are not written.
    let stride = p.words * 4u;
    let a = vec4<u32>(min(t0, last), min(t0 + 1u, last), min(t0 + 2u, last), min(t0 + 3u, last)) * stride;
    var acc = vec4<i32>(0);
    if (row < p.rows) {
        let wbase = row * p.words;
        for (var i = lane; i < p.words; i += TPR) {
            let wv = w[wbase + i];
            acc += vec4<i32>(
                word_dot(wv, act_word(a.x, i)),
                word_dot(wv, act_word(a.y, i)),
                word_dot(wv, act_word(a.z, i)),
                word_dot(wv, act_word(a.w, i)),
            );
        }
    }
    let d = reduce4(acc, li);
    if (lane == 0u && row < p.rows) {
        for (var j = 0u; j < 4u; j++) {
            if (t0 + j <= last) {
                finish(t0 + j, row, d[j]);
            }
        }
    }
}

@compute @workgroup_size(256)
fn matvec_glu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let t = wg.y;
    var acc = vec4<i32>(0);
    if (row < p.rows) {
        let wbase = row * p.words;
        let abase = t * p.words * 4u;
        for (var i = lane; i < p.words; i += TPR) {
            let a0 = act_word(abase, i);
            acc.x += word_dot(w[wbase + i], a0);
            acc.y += word_dot(w_up[wbase + i], a0);
        }
    }
    let d = reduce4(acc, li);
    if (lane == 0u && row < p.rows) {
        let g = scaled(t, d.x, p.w_scale);
        let u = scaled(t, d.y, p.up_scale);
        var y: f32;
        if (ACT == 0u) {
            let r = max(g, 0.0);
            y = (r * r) * u;
        } else {
            y = (g / (1.0 + exp(-g))) * u;
        }
        out[t * p.rows + row] = y;
    }
}

@compute @workgroup_size(256)
fn matvec3(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % TPR;
    let row = wg.x * (WG / TPR) + li / TPR;
    let t = wg.y;
    let abase = t * p.words * 4u;
    // Which matrix this row belongs to, and its row there.
    var part = 0u;
    var r = row;
    if (row >= parts.m1 + parts.m2) {
        part = 2u;
        r = row - parts.m1 - parts.m2;
    } else if (row >= parts.m1) {
        part = 1u;
        r = row - parts.m1;
    }
    var acc = 0;
    if (row < p.rows) {
        let wbase = r * p.words;
        for (var i = lane; i < p.words; i += TPR) {
            let a0 = act_word(abase, i);
            if (part == 0u) {
                acc += word_dot(w[wbase + i], a0);
            } else if (part == 1u) {
                acc += word_dot(w_up[wbase + i], a0);
            } else {
                acc += word_dot(w3[wbase + i], a0);
            }
        }
    }
    let d = reduce1(acc, li);
    if (lane == 0u && row < p.rows) {
        if (part == 0u) {
            out[t * parts.m1 + r] = scaled(t, d, p.w_scale);
        } else if (part == 1u) {
            out2[t * parts.m2 + r] = scaled(t, d, parts.scale2);
        } else {
            out3[t * (p.rows - parts.m1 - parts.m2) + r] = scaled(t, d, parts.scale3);
        }
    }
}
