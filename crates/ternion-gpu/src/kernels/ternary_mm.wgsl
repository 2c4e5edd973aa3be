// ternary_mm.wgsl — tiled BitLinear for prompt batches (portable: no subgroups, no f16):
// out[t][r] (= or +=) (Σ_k code[r][k]·q[t][k] − Σq[t]) / s[t] · w_scale, bit-identical to
// ternary.wgsl's matmul4 (the integer dot is exact; the scaling is the same f32 expression).
//
// Bindings (group 0):
//   0 uniform Params { rows, words, w_scale, zero }: output features M, u32 words per weight
//                                         row (K/16), per-tensor I2_S scale, 0 (see `pinned`)
//   1 storage read  w:   array<vec4<u32>>  M × K/64 vec4s: the I2_S codes as in the file
//   2 storage read  act: array<vec4<u32>>  T × K/16 vec4s of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, of i32 Σq
//   4 storage rw    out: array<f32>        T × M, token-major; EPILOGUE 0 stores, 1 adds
//   5 uniform Step { n_tokens, .. }
//   6 storage read  w2, 7 w3: array<vec4<u32>>  matmul_narrow3: the 2nd and 3rd matrices;
//                                         matmul_narrow_glu: the up matrix (w2)
//   8 storage rw    out2, 9 out3: array<f32>    matmul_narrow3: their outputs
//  10 uniform Parts { m2, m3, scale2, scale3 }: those matrices' rows and I2_S scales
// Dispatch: matmul_tiled (ceil(M / 64), ceil(T / 64), 1); matmul_narrow and
// matmul_narrow_glu (ceil(M / 32), ceil(T / 32), 1); matmul_narrow3 (Σ ceil(Mi / 32),
// ceil(T / 32), 1); 256 threads per workgroup.
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
// matmul_narrow, for steps of a few tokens (sequences decoded together): the same walk over
// 32 rows × 32 tokens, so a 2,560-row matrix still spreads over 80 workgroups, staged
// row-major and token-major instead: each row's (token's) block as 8 k-quads (vec4s of four
// k-words: codes unpacked to a byte each, or packed int8 activations), rows NS = 9 vec4s
// apart so the eight rows a warp reads at once fall in distinct banks. Staging reads global
// memory coalesced — eight consecutive threads one token's 128 bytes, eight one row's 32
// bytes of codes (four a 16-byte half, each storing one of its bit planes as a k-quad) —
// where k-word-major
// staging had every lane of a warp read a different row (measured: BENCHMARKS.md,
// session 12). Thread (kg, tr, tt) = (li / 64, li % 8, li / 8 % 8) owns rows tr + 8i and
// tokens tt + 8j (i, j < 4) over k-quads 2·kg and 2·kg + 1 of each block; the four
// k-groups' integer sums are added at the end. matmul_narrow3 runs the narrow tiles of three
// matrices that read the same activations (q, k, v) in one launch; matmul_narrow_glu
// stages a tile's gate and up rows together against one staging of the activations and
// stores act(gate) · up (the integers, the scaling and the GLU expression are those of the
// separate launches, so the values are the same bits).
//
// Unpacking (ternary.wgsl's header): u32 word j (0..8) of block b of a row, shifted right
// by 6−2g and masked with 0x03030303, holds the codes of elements 128b + 32g + 4j + 0..3,
// which pair with packed activation word 32b + 8g + j (so a row's code vec4 h, words
// 4h..4h+3, holds k-quad 2g + h of plane g).

override EPILOGUE: u32 = 0u;
const TM: u32 = 64u;
const TN: u32 = 64u;
// matmul_narrow's tile: rows and tokens.
const NM: u32 = 32u;
const KW: u32 = 32u;
const M2: u32 = 0x03030303u;

struct Params { rows: u32, words: u32, w_scale: f32, zero: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> act: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;

// [k-word][row / 4][row % 4]: codes of 4 elements per u32.
var<workgroup> wsh: array<vec4<u32>, 512>;
// [k-word][token / 4][token % 4]: 4 packed int8 activations per u32.
var<workgroup> ash: array<vec4<u32>, 512>;

// A workgroup's tile of `tm` rows × `tn` tokens and a thread's staging row: its first row
// and token, the step's last token, the staging row lr = li % tm and word group
// lj = li / tm, and the word offsets of weight row row0 + lr and token t0 + lr (clamped to
// the last row and token).
struct Tile {
    row0: u32,
    t0: u32,
    last: u32,
    lr: u32,
    lj: u32,
    wrow: u32,
    arow: u32,
}

// Word i of the codes.
fn wl(i: u32) -> u32 {
    return w[i >> 2u][i & 3u];
}

fn tile(li: u32, wg: vec3<u32>, tm: u32, tn: u32) -> Tile {
    let row0 = wg.x * tm;
    let t0 = wg.y * tn;
    let last = step.n_tokens - 1u;
    let lr = li % tm;
    return Tile(
        row0,
        t0,
        last,
        lr,
        li / tm,
        min(row0 + lr, p.rows - 1u) * p.words,
        min(t0 + lr, last) * p.words,
    );
}

@compute @workgroup_size(256)
fn matmul_tiled(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let tr = li % 16u;
    let tt = li / 16u;
    // Staging roles: weight words j and j + 4 of row `lr`; activation vec4s q and q + 4 of
    // token `lr` (a vec4 = k-words 4q..4q+3 of the block).
    let tl = tile(li, wg, TM, TN);
    let row0 = tl.row0;
    let t0 = tl.t0;
    let last = tl.last;
    let lr = tl.lr;
    let lj = tl.lj;
    let wrow = tl.wrow;
    let arow = tl.arow;

    let blocks = p.words / 8u;
    var wv0 = wl(wrow + lj);
    var wv1 = wl(wrow + lj + 4u);
    var av0 = act[arow + lj];
    var av1 = act[arow + lj + 4u];
    var acc = Acc();
    for (var b = 0u; b < blocks; b++) {
        workgroupBarrier();
        // Explicit components and shifts: a dynamically indexed vector variable would live
        // in local memory.
        let wo = lj * 16u + lr / 4u;
        let c = lr % 4u;
        stage_codes(wv0, wo, c, 128u);
        stage_codes(wv1, wo + 64u, c, 128u);
        let ao = lj * 64u + lr / 4u;
        stage_act(av0, ao, c, 16u);
        stage_act(av1, ao + 256u, c, 16u);
        workgroupBarrier();
        if (b + 1u < blocks) {
            let wn = wrow + (b + 1u) * 8u + lj;
            wv0 = wl(wn);
            wv1 = wl(wn + 4u);
            let an = arow + (b + 1u) * 8u + lj;
            av0 = act[an];
            av1 = act[an + 4u];
        }
        for (var k = 0u; k < KW; k++) {
            acc = mac(acc, wsh[k * 16u + tr], ash[k * 16u + tt]);
        }
    }

    let tb = t0 + 4u * tt;
    let r = row0 + 4u * tr;
    let ts = tok_scales(tb, 1u, last);
    store_row(r, acc.r0, ts, tb, 1u, last);
    store_row(r + 1u, acc.r1, ts, tb, 1u, last);
    store_row(r + 2u, acc.r2, ts, tb, 1u, last);
    store_row(r + 3u, acc.r3, ts, tb, 1u, last);
}

// The scale s and Σq of tokens tb + ts·j, j < 4 (past the end: the last token's).
struct TokScales {
    sq: vec4<i32>,
    s: vec4<f32>,
}

fn tok_scales(tb: u32, ts: u32, last: u32) -> TokScales {
    let m0 = tok_scale[min(tb, last)];
    let m1 = tok_scale[min(tb + ts, last)];
    let m2 = tok_scale[min(tb + 2u * ts, last)];
    let m3 = tok_scale[min(tb + 3u * ts, last)];
    return TokScales(
        bitcast<vec4<i32>>(vec4<u32>(m0.y, m1.y, m2.y, m3.y)),
        bitcast<vec4<f32>>(vec4<u32>(m0.x, m1.x, m2.x, m3.x)),
    );
}

// The integer sums `d` of a row against four tokens (their scales `ts`), scaled.
fn scaled(d: vec4<i32>, ts: TokScales, w_scale: f32) -> vec4<f32> {
    return (vec4<f32>(d - ts.sq) / ts.s) * w_scale;
}

// Scales the integer sums `d` of row `row` against tokens tb + step_t·j, j < 4 (their
// scales `ts`) and stores (or adds) those that exist.
fn store_row(row: u32, d: vec4<i32>, ts: TokScales, tb: u32, step_t: u32, last: u32) {
    let y = scaled(d, ts, p.w_scale);
    if (row >= p.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let t = tb + j * step_t;
        if (t <= last) {
            let o = t * p.rows + row;
            if (EPILOGUE == 1u) {
                out[o] = out[o] + pinned(y[j], p.zero);
            } else {
                out[o] = y[j];
            }
        }
    }
}

// The four 2-bit planes (shifts 6, 4, 2, 0) of code word j of a row, into k-words j,
// j + 8, j + 16, j + 24: wsh[at + plane·g][c] (`plane`: vec4s between k-words j and j + 8).
fn stage_codes(wv: u32, at: u32, c: u32, plane: u32) {
    wsh[at][c] = (wv >> 6u) & M2;
    wsh[at + plane][c] = (wv >> 4u) & M2;
    wsh[at + 2u * plane][c] = (wv >> 2u) & M2;
    wsh[at + 3u * plane][c] = wv & M2;
}

// 4 consecutive k-words of a token's activations: ash[at + kw·i][c] (`kw`: vec4s a k-word).
fn stage_act(av: vec4<u32>, at: u32, c: u32, kw: u32) {
    ash[at][c] = av.x;
    ash[at + kw][c] = av.y;
    ash[at + 2u * kw][c] = av.z;
    ash[at + 3u * kw][c] = av.w;
}

// A thread's sums: r_i = row 4·tr + i against tokens 4·tt + 0..3 (named, not an array: a
// dynamically indexed array would live in local memory).
struct Acc {
    r0: vec4<i32>,
    r1: vec4<i32>,
    r2: vec4<i32>,
    r3: vec4<i32>,
}

// `acc` plus one k-word: the 4 rows' code words `wq` against the 4 tokens' activation
// words `aq`.
fn mac(acc: Acc, wq: vec4<u32>, aq: vec4<u32>) -> Acc {
    return Acc(
        acc.r0 + dot4(wq.x, aq),
        acc.r1 + dot4(wq.y, aq),
        acc.r2 + dot4(wq.z, aq),
        acc.r3 + dot4(wq.w, aq),
    );
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

// The fused narrow entries' own bindings: matmul_narrow3's 2nd and 3rd matrices and
// outputs; matmul_narrow_glu's up matrix is w2. Parts { m2, m3, scale2, scale3 }: their rows
// and I2_S scales.
struct Parts { m2: u32, m3: u32, scale2: f32, scale3: f32 }

@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> w3: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> out2: array<f32>;
@group(0) @binding(9) var<storage, read_write> out3: array<f32>;
@group(0) @binding(10) var<uniform> parts: Parts;

// matmul_narrow_glu's gate activation: 0 ReLU², 1 SiLU (glu.wgsl's expressions).
override ACT: u32 = 0u;

// The narrow entries' workgroup memory: up to 64 staged code rows (two matrices' 32) at
// vec4 NS·r, the 32 staged tokens from NA; after the walk, the k-groups' partial sums.
var<workgroup> nsh: array<vec4<u32>, 1024>;
// Staged row and token stride (vec4s: 8 k-quads and one of padding, so the eight rows a
// warp reads at once fall in distinct banks); first staged token.
const NS: u32 = 9u;
const NA: u32 = 576u;

// Code vec4 i of matrix m (0: w, 1: w2, 2: w3).
fn wq(m: u32, i: u32) -> vec4<u32> {
    if (m == 1u) {
        return w2[i];
    }
    if (m == 2u) {
        return w3[i];
    }
    return w[i];
}

// A row set of a narrow tile: rows row0..row0+32 of matrix m (of `rows` rows).
struct RowSet {
    m: u32,
    row0: u32,
    rows: u32,
}

// A thread's sums over the walk: `g` for the first row set, `u` for the second.
struct Walk {
    g: Acc,
    u: Acc,
}

// Thread li's walk over K for tokens t0.. (the last `last`) against `sets` (1 or 2) row
// sets: thread (kg, tr, tt) = (li / 64, li % 8, li / 8 % 8) sums rows tr + 8i of each set
// against tokens tt + 8j over k-quads 2·kg and 2·kg + 1 of each block.
fn narrow_walk(li: u32, t0: u32, last: u32, a: RowSet, b: RowSet, sets: u32) -> Walk {
    let kg = li / 64u;
    let tr = li % 8u;
    let tt = (li / 8u) % 8u;
    let ta = li / 8u;
    let ca = li % 8u;
    let arow = min(t0 + ta, last) * p.words + ca;
    // Code staging: thread li stores bit plane g = li % 4 of code vec4 v = li / 4 of set
    // a (row v / 2, half v % 2), and with two sets the same plane of set b's: four threads
    // load each vec4 and every thread stores one plane a set, so no warp waits at the
    // barrier for a few staging warps (measured: BENCHMARKS.md, session 12). The loads
    // depend on no thread's role (loads under such a branch measured 17 % slower).
    let g = li % 4u;
    let sh = 6u - 2u * g;
    let v = li / 4u;
    let wr = (v / 2u) % NM;
    let wh = v % 2u;
    let wrow_a = min(a.row0 + wr, a.rows - 1u) * (p.words / 4u) + wh;
    let wrow_b = min(b.row0 + wr, b.rows - 1u) * (p.words / 4u) + wh;
    let oa = wr * NS + wh + 2u * g;
    let ob = (NM + wr) * NS + wh + 2u * g;

    let blocks = p.words / 8u;
    var av = act[arow];
    var wa = wq(a.m, wrow_a);
    var wb = wq(b.m, wrow_b);
    var acc = Walk(Acc(), Acc());
    for (var blk = 0u; blk < blocks; blk++) {
        workgroupBarrier();
        nsh[NA + ta * NS + ca] = av;
        nsh[oa] = (wa >> vec4<u32>(sh)) & vec4<u32>(M2);
        if (sets == 2u) {
            nsh[ob] = (wb >> vec4<u32>(sh)) & vec4<u32>(M2);
        }
        workgroupBarrier();
        if (blk + 1u < blocks) {
            av = act[arow + (blk + 1u) * 8u];
            wa = wq(a.m, wrow_a + (blk + 1u) * 2u);
            if (sets == 2u) {
                wb = wq(b.m, wrow_b + (blk + 1u) * 2u);
            }
        }
        for (var q = 2u * kg; q < 2u * kg + 2u; q++) {
            acc.g = macq(acc.g, tr, tt, q);
            if (sets == 2u) {
                acc.u = macq(acc.u, tr + NM, tt, q);
            }
        }
    }
    return acc;
}

// `acc` plus k-quad q of staged rows tr + 8i against staged tokens tt + 8j.
fn macq(acc: Acc, tr: u32, tt: u32, q: u32) -> Acc {
    let c0 = nsh[tr * NS + q];
    let c1 = nsh[(tr + 8u) * NS + q];
    let c2 = nsh[(tr + 16u) * NS + q];
    let c3 = nsh[(tr + 24u) * NS + q];
    let a0 = nsh[NA + tt * NS + q];
    let a1 = nsh[NA + (tt + 8u) * NS + q];
    let a2 = nsh[NA + (tt + 16u) * NS + q];
    let a3 = nsh[NA + (tt + 24u) * NS + q];
    return Acc(
        acc.r0 + vec4<i32>(dotq(c0, a0), dotq(c0, a1), dotq(c0, a2), dotq(c0, a3)),
        acc.r1 + vec4<i32>(dotq(c1, a0), dotq(c1, a1), dotq(c1, a2), dotq(c1, a3)),
        acc.r2 + vec4<i32>(dotq(c2, a0), dotq(c2, a1), dotq(c2, a2), dotq(c2, a3)),
        acc.r3 + vec4<i32>(dotq(c3, a0), dotq(c3, a1), dotq(c3, a2), dotq(c3, a3)),
    );
}

// Σ over four k-words of code words `c` against activation words `a`.
fn dotq(c: vec4<u32>, a: vec4<u32>) -> i32 {
    return dot4I8Packed(c.x, a.x) + dot4I8Packed(c.y, a.y) + dot4I8Packed(c.z, a.z)
        + dot4I8Packed(c.w, a.w);
}

// The four k-groups' sums (exact integers, any order) of row tr + 8·kg of thread
// (kg, tr, tt)'s against its four tokens: partial i of thread (kg, tq) at nsh[256·kg +
// 64·i + tq]. Every thread calls it together (barriers inside).
fn ksum(acc: Acc, li: u32) -> vec4<i32> {
    let kg = li / 64u;
    let tq = li % 64u;
    workgroupBarrier();
    let o = kg * 256u + tq;
    nsh[o] = bitcast<vec4<u32>>(acc.r0);
    nsh[o + 64u] = bitcast<vec4<u32>>(acc.r1);
    nsh[o + 128u] = bitcast<vec4<u32>>(acc.r2);
    nsh[o + 192u] = bitcast<vec4<u32>>(acc.r3);
    workgroupBarrier();
    let i = kg * 64u + tq;
    return bitcast<vec4<i32>>(nsh[i]) + bitcast<vec4<i32>>(nsh[256u + i])
        + bitcast<vec4<i32>>(nsh[512u + i]) + bitcast<vec4<i32>>(nsh[768u + i]);
}

@compute @workgroup_size(256)
fn matmul_narrow(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t0 = wg.y * NM;
    let last = step.n_tokens - 1u;
    let rs = RowSet(0u, wg.x * NM, p.rows);
    let d = ksum(narrow_walk(li, t0, last, rs, rs, 1u).g, li);
    let tb = t0 + (li / 8u) % 8u;
    store_row(rs.row0 + li % 8u + 8u * (li / 64u), d, tok_scales(tb, 8u, last), tb, 8u, last);
}

// matmul_narrow3: the tiles of w (p.rows rows), then w2 (parts.m2), then w3 (parts.m3),
// along x; each stores its matrix's output (out, out2, out3).
@compute @workgroup_size(256)
fn matmul_narrow3(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t0 = wg.y * NM;
    let last = step.n_tokens - 1u;
    let n1 = (p.rows + NM - 1u) / NM;
    let n2 = (parts.m2 + NM - 1u) / NM;
    var rs = RowSet(0u, wg.x * NM, p.rows);
    var w_scale = p.w_scale;
    if (wg.x >= n1 + n2) {
        rs = RowSet(2u, (wg.x - n1 - n2) * NM, parts.m3);
        w_scale = parts.scale3;
    } else if (wg.x >= n1) {
        rs = RowSet(1u, (wg.x - n1) * NM, parts.m2);
        w_scale = parts.scale2;
    }
    let d = ksum(narrow_walk(li, t0, last, rs, rs, 1u).g, li);
    let tb = t0 + (li / 8u) % 8u;
    let y = scaled(d, tok_scales(tb, 8u, last), w_scale);
    let row = rs.row0 + li % 8u + 8u * (li / 64u);
    if (row >= rs.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let t = tb + 8u * j;
        if (t <= last) {
            let o = t * rs.rows + row;
            if (rs.m == 1u) {
                out2[o] = y[j];
            } else if (rs.m == 2u) {
                out3[o] = y[j];
            } else {
                out[o] = y[j];
            }
        }
    }
}

// matmul_narrow_glu: gate rows (w) and the same up rows (w2, scale parts.scale2) of a tile
// together; out = act(gate) · up as glu.wgsl computes it from the two stored products.
@compute @workgroup_size(256)
fn matmul_narrow_glu(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t0 = wg.y * NM;
    let last = step.n_tokens - 1u;
    let row0 = wg.x * NM;
    let acc = narrow_walk(li, t0, last, RowSet(0u, row0, p.rows), RowSet(1u, row0, p.rows), 2u);
    let dg = ksum(acc.g, li);
    let du = ksum(acc.u, li);
    let tb = t0 + (li / 8u) % 8u;
    let ts = tok_scales(tb, 8u, last);
    let g = scaled(dg, ts, p.w_scale);
    let u = scaled(du, ts, parts.scale2);
    let row = row0 + li % 8u + 8u * (li / 64u);
    if (row >= p.rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let t = tb + 8u * j;
        if (t <= last) {
            out[t * p.rows + row] = gated(g[j], u[j], ACT);
        }
    }
}
