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
//   0 uniform Params { rows, words, w_scale, _ }: output features M, u32 words per weight row
//                                         (K/16), per-tensor I2_S scale
//   1 storage read  w:   array<vec4<u32>>  M × K/64 vec4s: the I2_S codes as in the file
//   2 storage read  act: array<vec4<u32>>  T × K/16 vec4s of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, of i32 Σq
//   4 storage rw    out: array<f32>        T × M, token-major; EPILOGUE 0 stores, 1 adds
//   5 uniform Step { n_tokens, .. }
// Dispatch: (ceil(M / 128), ceil(T / 64), 1), 256 threads per workgroup.
//
// A workgroup owns 128 weight rows × 64 tokens and walks K in stages of 64 elements (half
// an I2_S block: codes at shifts 6−4h and 4−4h of the block's 8 words per row, activation
// words 16h..16h+15). Each stage unpacks the weights to f16 −1/0/1 (A, row-major
// [row][k]) and the activations to f16 (B, column-major [token][k]) in workgroup memory,
// rows padded to 72 halves. Subgroup s multiplies rows 32·(s % 4)..+32 by tokens
// 32·(s / 4)..+32: 2×2 accumulators of 16×16, 4 multiply-adds per 16-wide k step. At the
// end each accumulator goes through a 16×16 f32 scratch of its subgroup, and the lanes
// scale and store it. Rows past M read row M−1 and tokens past T read token T−1; neither
// is written. Layout of the codes: see ternary.wgsl's header.

enable f16;
enable wgpu_cooperative_matrix;

override EPILOGUE: u32 = 0u;
const TM: u32 = 128u;
const TN: u32 = 64u;
const KS: u32 = 64u;
const LD: u32 = 72u;

struct Params { rows: u32, words: u32, w_scale: f32, pad: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> act: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> wa: array<f16, 9216>; // TM × LD
var<workgroup> xb: array<f16, 4608>; // TN × LD
var<workgroup> cs: array<f32, 2048>; // 8 subgroups × 16 × 16

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
                out[o] = out[o] + y;
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
        for (var j = 0u; j < 4u; j++) {
            for (var gg = 0u; gg < 2u; gg++) {
                let codes = wv[j] >> (6u - 4u * h - 2u * gg);
                let base = lr * LD + 32u * gg + 16u * lh + 4u * j;
                for (var e = 0u; e < 4u; e++) {
                    wa[base + e] = f16(i32((codes >> (8u * e)) & 3u) - 1);
                }
            }
        }
        for (var c = 0u; c < 4u; c++) {
            let base = lt * LD + 16u * lq + 4u * c;
            let v = bitcast<i32>(av[c]);
            for (var e = 0u; e < 4u; e++) {
                xb[base + e] = f16(extractBits(v, 8u * e, 8u));
            }
        }
        workgroupBarrier();
        if (st + 1u < stages) {
            if (h == 1u) {
                wv = w[wrow + (st + 1u) + lh];
            }
            av = act[arow + 4u * (st + 1u) + lq];
        }
        for (var kk = 0u; kk < KS; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&wa[rb * LD + kk], LD);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&wa[(rb + 16u) * LD + kk], LD);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&xb[tb * LD + kk], LD);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&xb[(tb + 16u) * LD + kk], LD);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
    }

    // Accumulator layout in the scratch: column-major, element (row m, token n) at n·16 + m.
    let r0 = row0 + rb;
    let tk0 = t0 + tb;
    coopStore(c00, &cs[sg * 256u], 16u);
    workgroupBarrier();
    finish(sg, lane, r0, tk0);
    workgroupBarrier();
    coopStore(c01, &cs[sg * 256u], 16u);
    workgroupBarrier();
    finish(sg, lane, r0, tk0 + 16u);
    workgroupBarrier();
    coopStore(c10, &cs[sg * 256u], 16u);
    workgroupBarrier();
    finish(sg, lane, r0 + 16u, tk0);
    workgroupBarrier();
    coopStore(c11, &cs[sg * 256u], 16u);
    workgroupBarrier();
    finish(sg, lane, r0 + 16u, tk0 + 16u);
}
