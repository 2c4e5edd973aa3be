// ternary_sgmat.wgsl — tiled BitLinear for prompt batches on a browser's subgroup matrices
// (WebGPU feature `chromium-experimental-subgroup-matrix`, Dawn and Chrome; int8 16×16×32
// matrices with i32 results, on NVIDIA the tensor cores through Vulkan's cooperative
// matrices): out[t][r] (= or +=) (Σ_k code[r][k]·q[t][k] − Σq[t]) / s[t] · w_scale,
// bit-identical to ternary_mm.wgsl's matmul_tiled (the codes c = 0, 1, 2 and the int8
// activations multiply exactly into i32 sums, |Σ| ≤ 2·127·K; the scaling is the same f32
// expression). Browser builds only (web.rs asks for the feature; naga cannot read it).
//
// Needs subgroup matrices of 16×16×32 i8 with i32 results, `subgroups`, and subgroups of
// exactly 32 lanes (8 a workgroup: subgroup s owns fixed 16×16 output blocks).
//
// Bindings (group 0), as ternary_mm.wgsl's:
//   0 uniform Params { rows, words, w_scale, zero }: output features M, u32 words per weight
//                                         row (K/16), per-tensor I2_S scale, 0 (see `pinned`)
//   1 storage read  w:   array<vec4<u32>>  M × K/64 vec4s: the I2_S codes as in the file
//   2 storage read  act: array<vec4<u32>>  T × K/16 vec4s of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, of i32 Σq
//   4 storage rw    out: array<f32>        T × M, token-major; EPILOGUE 0 stores, 1 adds
//   5 uniform Step { n_tokens, .. }
//   6 storage read  w2, 7 w3: array<vec4<u32>>  FUSED3: the 2nd and 3rd matrices
//   8 storage rw    out2, 9 out3: array<f32>    FUSED3: their outputs
//  10 uniform Parts { m2, m3, scale2, scale3 }  FUSED3: their rows and I2_S scales
// Dispatch: matmul_tiled (ceil(M / 128), ceil(T / 128), 1); with `#if FUSED3` (three
// matrices that read the same activations, q/k/v, in one launch: their row tiles one after
// another along x, stores only) (Σ ceil(Mi / 128), ceil(T / 128), 1); 256 threads per
// workgroup.
//
// A workgroup owns 128 weight rows × 128 tokens and walks K in stages of 64 elements, two
// an I2_S block (bit planes 0, 1 and 2, 3). A stage is staged in workgroup memory: the
// rows' codes as one byte each (wa, [row][k]: word j of a row's block, shifted right by
// 6 − 2g and masked with 0x03030303, holds elements 32g + 4j..+3, so plane g's words land
// at k-words 8·(g % 2) + j of its stage, in k order) and the tokens' int8 activations as
// they are (xb, [token][k]); each staged row is 20 words (the stage's 16 and 4 of padding:
// the eight rows a fragment load reads at once start in distinct banks). Two buffers
// alternate: stage s + 1's global words are read before stage s's products and staged
// after them into the other buffer, one barrier a stage. Staging reads global memory
// coalesced: two adjacent threads a row's 32 code bytes (a block, for both its stages),
// four a token's 64 activation bytes. Subgroup s multiplies rows 32·(s % 4)..+32 by tokens
// 64·(s / 4)..+64: 2×4 accumulators, for each 32-wide k step two code fragments (left,
// row-major) and four activation fragments (right, column-major: a token's k run is a
// column), eight multiply-adds (`kstep`). At the end the accumulators go through wa (each
// subgroup's own two blocks, two accumulators a round), and the lanes scale and store them.
// Rows past M read row M−1 and tokens past T read token T−1; neither is written. The
// fragment loads' offsets and strides count the arrays' i32 words.
//
// Both arrays are blocks of 16 staged rows (tokens), and every fragment load and store
// names its block (`&wa[b]`) with a constant offset and stride inside it: Dawn's
// robustness (Tint's) then knows the access is in bounds and leaves it as it is, where a
// run-time offset into a whole array wraps each load in a bounds test and a zeroed
// fallback (a prompt 1.5× slower on an H200, BENCHMARKS.md, session 25).
//
// Measured against this layout on an H200 under Dawn (BENCHMARKS.md, session 24): 128 ×
// 64 tiles 15 % slower; activation fragments loaded straight from the storage buffer 3×
// slower; 512 threads (16 subgroups of 2×2) 10 % slower; 64-row tiles and block-ahead
// global reads slower.

enable chromium_experimental_subgroup_matrix;

override EPILOGUE: u32 = 0u;
const TM: u32 = 128u;
const TN: u32 = 128u;
// Words per staged row: a stage's 64 bytes and 4 words of padding.
const LDW: u32 = 20u;
// Blocks of 16 staged rows (tokens) in one buffer of each array.
const BLOCKS: u32 = 8u;
const M2: u32 = 0x03030303u;

struct Params { rows: u32, words: u32, w_scale: f32, zero: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> act: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;
#if FUSED3
struct Parts { m2: u32, m3: u32, scale2: f32, scale3: f32 }
@group(0) @binding(10) var<uniform> parts: Parts;
@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> w3: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> out2: array<f32>;
@group(0) @binding(9) var<storage, read_write> out3: array<f32>;

// FUSED3: the matrix of this workgroup's row tile (0: w, 1: w2, 2: w3).
var<private> mat: u32;
#endif

// The rows and I2_S scale of the matrix this workgroup multiplies.
var<private> mat_rows: u32;
var<private> mat_scale: f32;

// Code vec4 `i` of the matrix this workgroup multiplies.
fn code(i: u32) -> vec4<u32> {
#if FUSED3
    if (mat == 1u) {
        return w2[i];
    }
    if (mat == 2u) {
        return w3[i];
    }
#endif
    return w[i];
}

// 2 buffers × 8 blocks of 16 rows × LDW words: a stage's codes, a byte each (buffer h's
// block b at wa[8h + b]); after the walk, the accumulators (subgroup s's in blocks 2s and
// 2s + 1).
var<workgroup> wa: array<array<i32, 320>, 16>;
// 2 buffers × 8 blocks of 16 tokens × LDW words: a stage's int8 activations.
var<workgroup> xb: array<array<i32, 320>, 16>;

// The code fragments of 16 rows (row-major) at k-words 0..8 and 8..16 of wa block `b`.
fn frag_a0(b: u32) -> subgroup_matrix_left<i8, 32, 16> {
    return subgroupMatrixLoad<subgroup_matrix_left<i8, 32, 16>, row_major>(&wa[b], 0u, LDW);
}
fn frag_a8(b: u32) -> subgroup_matrix_left<i8, 32, 16> {
    return subgroupMatrixLoad<subgroup_matrix_left<i8, 32, 16>, row_major>(&wa[b], 8u, LDW);
}

// The activation fragments of 16 tokens (column-major: a token's k run) at k-words 0..8
// and 8..16 of xb block `b`.
fn frag_b0(b: u32) -> subgroup_matrix_right<i8, 16, 32> {
    return subgroupMatrixLoad<subgroup_matrix_right<i8, 16, 32>, col_major>(&xb[b], 0u, LDW);
}
fn frag_b8(b: u32) -> subgroup_matrix_right<i8, 16, 32> {
    return subgroupMatrixLoad<subgroup_matrix_right<i8, 16, 32>, col_major>(&xb[b], 8u, LDW);
}

// A subgroup's 2×4 accumulators: rows 16i.., tokens 16j.. at index 4i + j.
alias Acc = array<subgroup_matrix_result<i32, 16, 16>, 8>;

// One 32-wide k step of a subgroup: code fragments a0, a1 (its two 16-row blocks) by
// activation fragments b0..b3 (its four 16-token blocks) into `c`.
fn kstep(
    a0: subgroup_matrix_left<i8, 32, 16>,
    a1: subgroup_matrix_left<i8, 32, 16>,
    b0: subgroup_matrix_right<i8, 16, 32>,
    b1: subgroup_matrix_right<i8, 16, 32>,
    b2: subgroup_matrix_right<i8, 16, 32>,
    b3: subgroup_matrix_right<i8, 16, 32>,
    c: ptr<function, Acc>,
) {
    (*c)[0] = subgroupMatrixMultiplyAccumulate(a0, b0, (*c)[0]);
    (*c)[1] = subgroupMatrixMultiplyAccumulate(a0, b1, (*c)[1]);
    (*c)[4] = subgroupMatrixMultiplyAccumulate(a1, b0, (*c)[4]);
    (*c)[5] = subgroupMatrixMultiplyAccumulate(a1, b1, (*c)[5]);
    (*c)[2] = subgroupMatrixMultiplyAccumulate(a0, b2, (*c)[2]);
    (*c)[3] = subgroupMatrixMultiplyAccumulate(a0, b3, (*c)[3]);
    (*c)[6] = subgroupMatrixMultiplyAccumulate(a1, b2, (*c)[6]);
    (*c)[7] = subgroupMatrixMultiplyAccumulate(a1, b3, (*c)[7]);
}

// Planes 2h and 2h + 1 of a row's code word (shifts 6 − 4h and 4 − 4h) into words `at`
// and `at` + 8 of wa block `b`.
fn stage_word(wv: u32, h: u32, b: u32, at: u32) {
    let sh = 6u - 4u * h;
    wa[b][at] = bitcast<i32>((wv >> sh) & M2);
    wa[b][at + 8u] = bitcast<i32>((wv >> (sh - 2u)) & M2);
}

// This thread's part of stage `s` (half h = s % 2 of its block) into buffer s % 2: the
// planes of its 4 code words `wv`, its activation vec4s `av0` and `av1`.
fn stage(s: u32, r: Roles, wv: vec4<u32>, av0: vec4<u32>, av1: vec4<u32>) {
    let h = s % 2u;
    let b = h * BLOCKS + r.wblk;
    stage_word(wv.x, h, b, r.wat);
    stage_word(wv.y, h, b, r.wat + 1u);
    stage_word(wv.z, h, b, r.wat + 2u);
    stage_word(wv.w, h, b, r.wat + 3u);
    let ab = h * BLOCKS + r.ablk;
    stage_act(av0, ab, r.aat);
    stage_act(av1, ab + 4u, r.aat);
}

// 16 activation bytes into word `at` of xb block `b`.
fn stage_act(av: vec4<u32>, b: u32, at: u32) {
    xb[b][at] = bitcast<i32>(av.x);
    xb[b][at + 1u] = bitcast<i32>(av.y);
    xb[b][at + 2u] = bitcast<i32>(av.z);
    xb[b][at + 3u] = bitcast<i32>(av.w);
}

// Staging roles: code vec4 li % 2 of row li / 2's block (vec4 wrow of w for block 0; word
// wat of wa block wblk), activation vec4 li % 4 of the stage of token li / 4 (and li / 4
// + 64): act vec4s arow0, arow1 for stage 0, word aat of xb block ablk (and ablk + 4).
struct Roles { wrow: u32, wblk: u32, wat: u32, arow0: u32, arow1: u32, ablk: u32, aat: u32 }

fn roles(li: u32, row0: u32, t0: u32) -> Roles {
    let last = step.n_tokens - 1u;
    let lr = li / 2u;
    let lh = li % 2u;
    let la = li / 4u;
    let lv = li % 4u;
    return Roles(
        min(row0 + lr, mat_rows - 1u) * (p.words / 4u) + lh,
        lr / 16u,
        (lr % 16u) * LDW + 4u * lh,
        min(t0 + la, last) * p.words + lv,
        min(t0 + la + 64u, last) * p.words + lv,
        la / 16u,
        (la % 16u) * LDW + 4u * lv,
    );
}

// Scales and stores (or adds) the 16×16 sums left in wa block `b` (column-major: row m,
// token n at word n·16 + m) for rows r0.., tokens tk0..
fn finish(b: u32, lane: u32, r0: u32, tk0: u32) {
    let last = step.n_tokens - 1u;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let row = r0 + e % 16u;
        let t = tk0 + e / 16u;
        if (row < mat_rows && t <= last) {
            let m = tok_scale[t];
            let d = wa[b][e] - bitcast<i32>(m.y);
            let y = (f32(d) / bitcast<f32>(m.x)) * mat_scale;
            let o = t * mat_rows + row;
#if FUSED3
            if (mat == 1u) {
                out2[o] = y;
                continue;
            }
            if (mat == 2u) {
                out3[o] = y;
                continue;
            }
#endif
            if (EPILOGUE == 1u) {
                out[o] = out[o] + pinned(y, p.zero);
            } else {
                out[o] = y;
            }
        }
    }
}

// Two accumulators through the subgroup's two blocks of wa: stored, then scaled and
// written (rows r0.., tokens tk0 and tk0 + 16..). Every subgroup calls it together.
fn drain2(
    x: subgroup_matrix_result<i32, 16, 16>,
    y: subgroup_matrix_result<i32, 16, 16>,
    sg: u32,
    lane: u32,
    r0: u32,
    tk0: u32,
) {
    let b = 2u * sg;
    workgroupBarrier();
    subgroupMatrixStore<col_major>(&wa[b], 0u, x, 16u);
    subgroupMatrixStore<col_major>(&wa[b + 1u], 0u, y, 16u);
    workgroupBarrier();
    finish(b, lane, r0, tk0);
    finish(b + 1u, lane, r0, tk0 + 16u);
}

@compute @workgroup_size(256)
fn matmul_tiled(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    var tile = wg.x;
    mat_rows = p.rows;
    mat_scale = p.w_scale;
#if FUSED3
    let t1 = (p.rows + TM - 1u) / TM;
    let t2 = (parts.m2 + TM - 1u) / TM;
    mat = 0u;
    if (tile >= t1 + t2) {
        mat = 2u;
        mat_rows = parts.m3;
        mat_scale = parts.scale3;
        tile -= t1 + t2;
    } else if (tile >= t1) {
        mat = 1u;
        mat_rows = parts.m2;
        mat_scale = parts.scale2;
        tile -= t1;
    }
#endif
    let row0 = tile * TM;
    let t0 = wg.y * TN;
    let r = roles(li, row0, t0);
    let rb = 32u * (sg % 4u);
    let tb = 64u * (sg / 4u);
    var c: Acc;

    // Two stages a block (planes 0, 1 and 2, 3); stage s + 1's global words are read
    // before stage s's products and staged after them into the other buffer.
    let stages = p.words / 4u;
    var wv = code(r.wrow);
    var av0 = act[r.arow0];
    var av1 = act[r.arow1];
    stage(0u, r, wv, av0, av1);
    workgroupBarrier();
    for (var s = 0u; s < stages; s++) {
        let nx = s + 1u;
        if (nx < stages) {
            if (nx % 2u == 0u) {
                wv = code(r.wrow + nx);
            }
            av0 = act[r.arow0 + 4u * nx];
            av1 = act[r.arow1 + 4u * nx];
        }
        // This subgroup's blocks of the stage's buffer, then its two 32-wide k steps.
        let ba = (s % 2u) * BLOCKS + rb / 16u;
        let bb = (s % 2u) * BLOCKS + tb / 16u;
        kstep(
            frag_a0(ba), frag_a0(ba + 1u),
            frag_b0(bb), frag_b0(bb + 1u), frag_b0(bb + 2u), frag_b0(bb + 3u),
            &c,
        );
        kstep(
            frag_a8(ba), frag_a8(ba + 1u),
            frag_b8(bb), frag_b8(bb + 1u), frag_b8(bb + 2u), frag_b8(bb + 3u),
            &c,
        );
        if (nx < stages) {
            stage(nx, r, wv, av0, av1);
        }
        workgroupBarrier();
    }

    let r0 = row0 + rb;
    let tk0 = t0 + tb;
    drain2(c[0], c[1], sg, lane, r0, tk0);
    drain2(c[4], c[5], sg, lane, r0 + 16u, tk0);
    drain2(c[2], c[3], sg, lane, r0, tk0 + 32u);
    drain2(c[6], c[7], sg, lane, r0 + 16u, tk0 + 32u);
}
