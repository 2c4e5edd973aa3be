// ternary_mm.wgsl — tiled BitLinear for prompt batches (portable: no subgroups, no f16):
// out[t][r] (= or +=) (Σ_k code[r][k]·q[t][k] − Σq[t]) / s[t] · w_scale, bit-identical to
// ternary.wgsl's matmul4 (the integer dot is exact; the scaling is the same f32 expression).
//
// Bindings (group 0):
//   0 uniform Params { rows, words, w_scale, _ }: output features M, u32 words per weight row
//                                         (K/16), per-tensor I2_S scale
//   1 storage read  w:   array<u32>        M × K/16 words: the I2_S codes as in the file
//   2 storage read  act: array<vec4<u32>>  T × K/16 vec4s of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, of i32 Σq
//   4 storage rw    out: array<f32>        T × M, token-major; EPILOGUE 0 stores, 1 adds
//   5 uniform Step { n_tokens, .. }
// Dispatch: (ceil(M / 64), ceil(T / 64), 1), 256 threads per workgroup.
//
// A workgroup owns a tile of 64 weight rows × 64 tokens and walks K one I2_S block (128
// elements) at a time. Per block it stages in workgroup memory the tile's weights unpacked
// to one u32 of four 2-bit codes (as bytes 0..2) per 4 elements, and the tokens' packed
// int8 activations, both laid out k-word-major so that a thread reads the 4 rows (4
// tokens) it owns as one vec4. Thread (tr, tt) = (li % 16, li / 16) owns rows 4·tr..+3 and
// tokens 4·tt..+3: 16 dot4I8Packed per k-word against 2 vec4 loads from workgroup memory.
// The next block's global words are fetched into registers before the current block's
// products, so the loads overlap the arithmetic. Rows past M read row M−1 and tokens past T
// read token T−1; neither is written.
//
// Unpacking (ternary.wgsl's header): u32 word j (0..8) of block b of a row, shifted right
// by 6−2g and masked with 0x03030303, holds the codes of elements 128b + 32g + 4j + 0..3,
// which pair with packed activation word 32b + 8g + j.

override EPILOGUE: u32 = 0u;
const TM: u32 = 64u;
const TN: u32 = 64u;
const KW: u32 = 32u;
const M2: u32 = 0x03030303u;

struct Params { rows: u32, words: u32, w_scale: f32, pad: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> act: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;

// [k-word][row / 4][row % 4]: codes of 4 elements per u32.
var<workgroup> wsh: array<vec4<u32>, 512>;
// [k-word][token / 4][token % 4]: 4 packed int8 activations per u32.
var<workgroup> ash: array<vec4<u32>, 512>;

@compute @workgroup_size(256)
fn matmul_tiled(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let tr = li % 16u;
    let tt = li / 16u;
    let row0 = wg.x * TM;
    let t0 = wg.y * TN;
    let last = step.n_tokens - 1u;

    // Staging roles: weight words j and j + 4 of row `lr`; activation vec4s q and q + 4 of
    // token `lt` (a vec4 = k-words 4q..4q+3 of the block).
    let lr = li % TM;
    let lj = li / TM;
    let wrow = min(row0 + lr, p.rows - 1u) * p.words;
    let arow = min(t0 + lr, last) * p.words;

    let blocks = p.words / 8u;
    var wv0 = w[wrow + lj];
    var wv1 = w[wrow + lj + 4u];
    var av0 = act[arow + lj];
    var av1 = act[arow + lj + 4u];
    var acc: array<vec4<i32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<i32>(0);
    }
    for (var b = 0u; b < blocks; b++) {
        workgroupBarrier();
        for (var g = 0u; g < 4u; g++) {
            let sh = 6u - 2u * g;
            wsh[(8u * g + lj) * 16u + lr / 4u][lr % 4u] = (wv0 >> sh) & M2;
            wsh[(8u * g + lj + 4u) * 16u + lr / 4u][lr % 4u] = (wv1 >> sh) & M2;
        }
        for (var c = 0u; c < 4u; c++) {
            ash[(4u * lj + c) * 16u + lr / 4u][lr % 4u] = av0[c];
            ash[(4u * (lj + 4u) + c) * 16u + lr / 4u][lr % 4u] = av1[c];
        }
        workgroupBarrier();
        if (b + 1u < blocks) {
            let wn = wrow + (b + 1u) * 8u + lj;
            wv0 = w[wn];
            wv1 = w[wn + 4u];
            let an = arow + (b + 1u) * 8u + lj;
            av0 = act[an];
            av1 = act[an + 4u];
        }
        for (var k = 0u; k < KW; k++) {
            let wq = wsh[k * 16u + tr];
            let aq = ash[k * 16u + tt];
            for (var i = 0u; i < 4u; i++) {
                acc[i] += vec4<i32>(
                    dot4I8Packed(wq[i], aq.x),
                    dot4I8Packed(wq[i], aq.y),
                    dot4I8Packed(wq[i], aq.z),
                    dot4I8Packed(wq[i], aq.w),
                );
            }
        }
    }

    for (var j = 0u; j < 4u; j++) {
        let t = t0 + 4u * tt + j;
        if (t > last) {
            break;
        }
        let m = tok_scale[t];
        let s = bitcast<f32>(m.x);
        let sq = bitcast<i32>(m.y);
        for (var i = 0u; i < 4u; i++) {
            let row = row0 + 4u * tr + i;
            if (row < p.rows) {
                let y = (f32(acc[i][j] - sq) / s) * p.w_scale;
                let o = t * p.rows + row;
                if (EPILOGUE == 1u) {
                    out[o] = out[o] + y;
                } else {
                    out[o] = y;
                }
            }
        }
    }
}
