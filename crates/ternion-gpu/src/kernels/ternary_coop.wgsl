// ternary_coop.wgsl — tiled BitLinear for prompt batches on cooperative matrices (tensor
// cores): out[t][r] (= or +=) (Σ_k (code[r][k] − 1)·q[t][k]) / s[t] · w_scale, bit-identical
// to ternary.wgsl's matmul4. The ternary weights (−1, 0, 1) and the int8 activations are
// exact in f16, every product and partial sum is an integer of magnitude ≤ K·127 < 2^24
// (K ≤ 132k), so the f32 accumulation is exact in any order and equals the int8 kernel's
// `Σ code·q − Σq`; the scaling is the same f32 expression.
//
// Needs EXPERIMENTAL_COOPERATIVE_MATRIX with 16×16×16 f16·f16 + f32 subgroup matrices,
// SHADER_F16 and SUBGROUP, and a subgroup size of 32 (8 subgroups per workgroup).
//
// Bindings (group 0):
//   0 uniform Params { rows, words, w_scale, zero }: output features M, u32 words per weight
//                                         row (K/16), per-tensor I2_S scale, 0 (see `pinned`)
//   1 storage read  w:   array<vec4<u32>>  M × K/64 vec4s: the I2_S codes as in the file
//   2 storage read  act: array<vec4<u32>>  T × K/16 vec4s of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, of i32 Σq
//   4 storage rw    out: array<f32>        T × M, token-major; EPILOGUE 0 stores, 1 adds
//   5 uniform Step { n_tokens, .. }
// Dispatch: matmul_tiled (ceil(M / 128), ceil(T / 64), 1); matmul_wide (the host's choice
// for steps of more than 64 tokens and M ≥ 1024) (ceil(M / 128), ceil(T / 128), 1); 256
// threads per workgroup.
//
// A workgroup owns 128 weight rows × 64 tokens and walks K in stages of 64 elements (half
// an I2_S block: codes at shifts 6−4h and 4−4h of the block's 8 words per row, activation
// words 16h..16h+15). Each stage unpacks the weights to f16 −1/0/1 (A, column-major
// [k][row], rows padded to 136) and the activations to f16 (B, row-major [k][token],
// padded to 72) in workgroup memory: a store instruction's 32 lanes (consecutive rows or
// tokens) write 64 consecutive bytes, free of bank conflicts. Subgroup s multiplies rows
// 32·(s % 4)..+32 by tokens 32·(s / 4)..+32: 2×2 accumulators of 16×16, 4 multiply-adds
// per 16-wide k step. At the end each accumulator goes through a 16×16 f32 scratch of its
// subgroup, and the lanes scale and store it. (64-row tiles, twice the workgroups,
// measured slower at 512 tokens: BENCHMARKS.md.) Rows past M read row M−1 and tokens past
// T read token T−1; neither is written. Layout of the codes: see ternary.wgsl's header.

enable f16;
enable wgpu_cooperative_matrix;

override EPILOGUE: u32 = 0u;
const TM: u32 = 128u;
const TN: u32 = 64u;
const KS: u32 = 64u;
const LDA: u32 = 136u;
const LDB: u32 = 72u;
const TNW: u32 = 128u;
const LDBW: u32 = 136u;

struct Params { rows: u32, words: u32, w_scale: f32, zero: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> act: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> wa: array<f16, 8704>; // KS × LDA, [k][row]
var<workgroup> xb: array<f16, 8704>; // KS × LDB (matmul_wide: KS × LDBW), [k][token]
var<workgroup> cs: array<f32, 2048>; // 8 subgroups × 16 × 16

// The codes at bits 2..3 of each byte of `codes` (elements 4j..4j+3 of the stage's first
// 32) to wa k-rows at..at + 4 and those at bits 0..1 (the next 32) to k-rows at + 32..,
// as f16 −1 / 0 / 1. `codes` is a block word shifted right by 4 − 4·(stage half).
fn unpack_codes(codes: u32, at: u32) {
    let lo = vec4<i32>(bitcast<vec4<i32>>((vec4<u32>(codes >> 2u) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(3u)));
    let hi = vec4<i32>(bitcast<vec4<i32>>((vec4<u32>(codes) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(3u)));
    let a = vec4<f16>(lo - 1);
    let b = vec4<f16>(hi - 1);
    wa[at] = a.x;
    wa[at + LDA] = a.y;
    wa[at + 2u * LDA] = a.z;
    wa[at + 3u * LDA] = a.w;
    wa[at + 32u * LDA] = b.x;
    wa[at + 33u * LDA] = b.y;
    wa[at + 34u * LDA] = b.z;
    wa[at + 35u * LDA] = b.w;
}

// The 4 int8 activations of packed word `v` as f16 into xb k-rows at..at + 4 (`ld` halves
// per k-row).
fn unpack_act(v: u32, at: u32, ld: u32) {
    let q = vec4<f16>(unpack4xI8(v));
    xb[at] = q.x;
    xb[at + ld] = q.y;
    xb[at + 2u * ld] = q.z;
    xb[at + 3u * ld] = q.w;
}

// One accumulator through the subgroup's scratch: store, then scale and write rows
// r0..r0+16 × tokens tk0..tk0+16. Every subgroup calls it together (barriers inside).
fn drain(c: coop_mat16x16<f32, C>, sg: u32, lane: u32, r0: u32, tk0: u32) {
    coopStore(c, &cs[sg * 256u], 16u);
    workgroupBarrier();
    finish(sg, lane, r0, tk0);
    workgroupBarrier();
}

// Stage `st`'s weight codes of this thread (row column `lr`, block words 4·lh..4·lh+3 in
// `wv`) into wa.
fn stage_codes(wv: vec4<u32>, st: u32, lr: u32, lh: u32) {
    // Explicit components: a dynamically indexed vector variable would live in local memory.
    let sh = 4u - 4u * (st % 2u);
    let wb = 16u * lh * LDA + lr;
    unpack_codes(wv.x >> sh, wb);
    unpack_codes(wv.y >> sh, wb + 4u * LDA);
    unpack_codes(wv.z >> sh, wb + 8u * LDA);
    unpack_codes(wv.w >> sh, wb + 12u * LDA);
}

// Activation vec4 `q` of a stage (k 16·q..16·q+15) of token column `lt` into xb.
fn stage_act(av: vec4<u32>, q: u32, lt: u32, ld: u32) {
    let xo = 16u * q * ld + lt;
    unpack_act(av.x, xo, ld);
    unpack_act(av.y, xo + 4u * ld, ld);
    unpack_act(av.z, xo + 8u * ld, ld);
    unpack_act(av.w, xo + 12u * ld, ld);
}

// Scales and stores accumulator (fr, fc) of subgroup `sg` from its scratch.
fn finish(sg: u32, lane: u32, r0: u32, tk0: u32) {
    let last = step.n_tokens - 1u;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let row = r0 + e % 16u;
        let t = tk0 + e / 16u;
        if (row < p.rows && t <= last) {
            let m = tok_scale[t];
            let y = (cs[sg * 256u + e] / bitcast<f32>(m.x)) * p.w_scale;
            let o = t * p.rows + row;
            if (EPILOGUE == 1u) {
                out[o] = out[o] + pinned(y, p.zero);
            } else {
                out[o] = y;
            }
        }
    }
}

@compute @workgroup_size(256)
fn matmul_tiled(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let row0 = wg.x * TM;
    let t0 = wg.y * TN;
    let last = step.n_tokens - 1u;

    // Staging roles: weight row `lr`, words 4·lh..4·lh+3 of each block; token `lt`,
    // activation vec4 `lq` (k 16·lq..16·lq+15) of each stage.
    let lr = li % TM;
    let lh = li / TM;
    let lt = li % TN;
    let lq = li / TN;
    let wrow = min(row0 + lr, p.rows - 1u) * (p.words / 4u);
    let arow = min(t0 + lt, last) * p.words;

    let rb = 32u * (sg % 4u);
    let tb = 32u * (sg / 4u);
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();

    let stages = p.words / 4u;
    var wv = w[wrow + lh];
    var av = act[arow + lq];
    for (var st = 0u; st < stages; st++) {
        let h = st % 2u;
        workgroupBarrier();
        stage_codes(wv, st, lr, lh);
        stage_act(av, lq, lt, LDB);
        workgroupBarrier();
        if (st + 1u < stages) {
            if (h == 1u) {
                wv = w[wrow + (st + 1u) + lh];
            }
            av = act[arow + 4u * (st + 1u) + lq];
        }
        for (var kk = 0u; kk < KS; kk += 16u) {
            let a0 = coopLoad<coop_mat16x16<f16, A>>(&wa[kk * LDA + rb], LDA);
            let a1 = coopLoad<coop_mat16x16<f16, A>>(&wa[kk * LDA + rb + 16u], LDA);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&xb[kk * LDB + tb], LDB);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&xb[kk * LDB + tb + 16u], LDB);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
    }

    // Accumulator layout in the scratch: column-major, element (row m, token n) at n·16 + m.
    let r0 = row0 + rb;
    let tk0 = t0 + tb;
    drain(c00, sg, lane, r0, tk0);
    drain(c01, sg, lane, r0, tk0 + 16u);
    drain(c10, sg, lane, r0 + 16u, tk0);
    drain(c11, sg, lane, r0 + 16u, tk0 + 16u);
}

// matmul_tiled for steps of more than 64 tokens: 128 rows × 128 tokens per workgroup,
// subgroup s on rows 32·(s % 4)..+32 × tokens 64·(s / 4)..+64 (2 × 4 accumulators, 8
// multiply-adds per 6 fragment loads), half the workgroup-memory traffic per product of
// the 64-token tile. Dispatch: (ceil(M / 128), ceil(T / 128), 1).
@compute @workgroup_size(256)
fn matmul_wide(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let row0 = wg.x * TM;
    let t0 = wg.y * TNW;
    let last = step.n_tokens - 1u;

    // Staging roles: weight row `lr`, words 4·lh..4·lh+3 of each block; token `lt`,
    // activation vec4s 2·lh and 2·lh + 1 of each stage.
    let lr = li % TM;
    let lh = li / TM;
    let lt = li % TNW;
    let wrow = min(row0 + lr, p.rows - 1u) * (p.words / 4u);
    let arow = min(t0 + lt, last) * p.words;

    let rb = 32u * (sg % 4u);
    let tb = 64u * (sg / 4u);
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();

    let stages = p.words / 4u;
    var wv = w[wrow + lh];
    var av0 = act[arow + 2u * lh];
    var av1 = act[arow + 2u * lh + 1u];
    for (var st = 0u; st < stages; st++) {
        workgroupBarrier();
        stage_codes(wv, st, lr, lh);
        stage_act(av0, 2u * lh, lt, LDBW);
        stage_act(av1, 2u * lh + 1u, lt, LDBW);
        workgroupBarrier();
        if (st + 1u < stages) {
            if (st % 2u == 1u) {
                wv = w[wrow + (st + 1u) + lh];
            }
            av0 = act[arow + 4u * (st + 1u) + 2u * lh];
            av1 = act[arow + 4u * (st + 1u) + 2u * lh + 1u];
        }
        for (var kk = 0u; kk < KS; kk += 16u) {
            let a0 = coopLoad<coop_mat16x16<f16, A>>(&wa[kk * LDA + rb], LDA);
            let a1 = coopLoad<coop_mat16x16<f16, A>>(&wa[kk * LDA + rb + 16u], LDA);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&xb[kk * LDBW + tb], LDBW);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&xb[kk * LDBW + tb + 16u], LDBW);
            let b2 = coopLoadT<coop_mat16x16<f16, B>>(&xb[kk * LDBW + tb + 32u], LDBW);
            let b3 = coopLoadT<coop_mat16x16<f16, B>>(&xb[kk * LDBW + tb + 48u], LDBW);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
        }
    }

    let r0 = row0 + rb;
    drain(c00, sg, lane, r0, t0 + tb);
    drain(c01, sg, lane, r0, t0 + tb + 16u);
    drain(c02, sg, lane, r0, t0 + tb + 32u);
    drain(c03, sg, lane, r0, t0 + tb + 48u);
    drain(c10, sg, lane, r0 + 16u, t0 + tb);
    drain(c11, sg, lane, r0 + 16u, t0 + tb + 16u);
    drain(c12, sg, lane, r0 + 16u, t0 + tb + 32u);
    drain(c13, sg, lane, r0 + 16u, t0 + tb + 48u);
}
