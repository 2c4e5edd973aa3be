// ternary_mm.wgsl — tiled BitLinear for prompt batches (portable: no subgroups, no f16):
// out[t][r] (= or +=) (Σ_k code[r][k]·q[t][k] − Σq[t]) / s[t] · w_scale, bit-identical to
// ternary.wgsl's matmul4 (the integer dot is exact; the scaling is the same f32 expression).
//
// Bindings (group 0):
//   0 uniform Params { rows, words, w_scale, zero }: output features M, u32 words per weight
//                                         row (K/16), per-tensor I2_S scale, 0 (see `pinned`)
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

struct Params { rows: u32, words: u32, w_scale: f32, zero: u32 }
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
    // acc_i: row 4·tr + i against tokens 4·tt + 0..3 (named, not an array: a dynamically
    // indexed array would live in local memory).
    var acc0 = vec4<i32>(0);
    var acc1 = vec4<i32>(0);
    var acc2 = vec4<i32>(0);
    var acc3 = vec4<i32>(0);
    for (var b = 0u; b < blocks; b++) {
        workgroupBarrier();
        // Explicit components and shifts: a dynamically indexed vector variable would live
        // in local memory.
        let wo = lj * 16u + lr / 4u;
        let c = lr % 4u;
        stage_codes(wv0, wo, c);
        stage_codes(wv1, wo + 64u, c);
        let ao = lj * 64u + lr / 4u;
        stage_act(av0, ao, c);
        stage_act(av1, ao + 256u, c);
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
            acc0 += dot4(wq.x, aq);
            acc1 += dot4(wq.y, aq);
            acc2 += dot4(wq.z, aq);
            acc3 += dot4(wq.w, aq);
        }
    }

    // Per-token scale and Σq of this thread's 4 tokens (past the end: the last token's).
    let tb = t0 + 4u * tt;
    let m0 = tok_scale[min(tb, last)];
    let m1 = tok_scale[min(tb + 1u, last)];
    let m2 = tok_scale[min(tb + 2u, last)];
    let m3 = tok_scale[min(tb + 3u, last)];
    let sq = bitcast<vec4<i32>>(vec4<u32>(m0.y, m1.y, m2.y, m3.y));
    let s = bitcast<vec4<f32>>(vec4<u32>(m0.x, m1.x, m2.x, m3.x));
    let r = row0 + 4u * tr;
    store_row(r, (vec4<f32>(acc0 - sq) / s) * p.w_scale, tb, last);
    store_row(r + 1u, (vec4<f32>(acc1 - sq) / s) * p.w_scale, tb, last);
    store_row(r + 2u, (vec4<f32>(acc2 - sq) / s) * p.w_scale, tb, last);
    store_row(r + 3u, (vec4<f32>(acc3 - sq) / s) * p.w_scale, tb, last);
}

// Stores (or adds) y[j] = row `row` of token tb + j, for the rows and tokens that exist.
fn store_row(row: u32, y: vec4<f32>, tb: u32, last: u32) {
    if (row >= p.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if (tb + j <= last) {
            let o = (tb + j) * p.rows + row;
            if (EPILOGUE == 1u) {
                out[o] = out[o] + pinned(y[j], p.zero);
            } else {
                out[o] = y[j];
            }
        }
    }
}

// The four 2-bit planes (shifts 6, 4, 2, 0) of code word j of a row, into k-words j,
// j + 8, j + 16, j + 24: wsh[at + 128·g][c].
fn stage_codes(wv: u32, at: u32, c: u32) {
    wsh[at][c] = (wv >> 6u) & M2;
    wsh[at + 128u][c] = (wv >> 4u) & M2;
    wsh[at + 256u][c] = (wv >> 2u) & M2;
    wsh[at + 384u][c] = wv & M2;
}

// 4 consecutive k-words of a token's activations: ash[at + 16·i][c].
fn stage_act(av: vec4<u32>, at: u32, c: u32) {
    ash[at][c] = av.x;
    ash[at + 16u][c] = av.y;
    ash[at + 32u][c] = av.z;
    ash[at + 48u][c] = av.w;
}

// The 4 dot products of code word `wv` with the 4 tokens' activation words in `aq`.
fn dot4(wv: u32, aq: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(
        dot4I8Packed(wv, aq.x),
        dot4I8Packed(wv, aq.y),
        dot4I8Packed(wv, aq.z),
        dot4I8Packed(wv, aq.w),
    );
}
