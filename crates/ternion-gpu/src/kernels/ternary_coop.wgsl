// ternary_coop.wgsl — tiled BitLinear for prompt batches on cooperative matrices (tensor
// cores): out[t][r] (= or +=) (Σ_k (code[r][k] − 1)·q[t][k]) / s[t] · w_scale, bit-identical
// to ternary.wgsl's matmul4. The matrix units multiply each code c (0, 1, 2) as the f16 of
// bits c, i.e. c · 2^-24 (a subnormal: the staging masks the code bits, with no
// subtraction), by the int8 activation q as an f16 (exact): every product and partial sum
// is an integer of magnitude ≤ 2·127·K < 2^24 (K ≤ 65,536: the host's COOP_MAX_K; wider
// rows take the portable tiles) times 2^-24, so the f32 accumulation is exact in any order,
// and the epilogue's `sum · 2^24 − Σq` (exact: `exact`) equals the int8 kernel's
// `Σ code·q − Σq`; the scaling is the same f32 expression.
// (Staging the codes as c − 1 instead, one subtraction a pair more: pp512 4–5 % slower on
// an H200, BENCHMARKS.md, session 22.)
//
// Needs EXPERIMENTAL_COOPERATIVE_MATRIX with 16×16×16 f16·f16 + f32 subgroup matrices,
// SHADER_F16 and SUBGROUP, a subgroup size of 32 (8 subgroups per workgroup, 16 in the
// 512-thread matmul_wide3) and 512-thread workgroups.
//
// Bindings (group 0):
//   0 uniform Params { rows, words, w_scale, zero }: output features M, u32 words per weight
//                                         row (K/16), per-tensor I2_S scale, 0 (see `pinned`)
//   1 storage read  w:   array<vec4<u32>>  M × K/64 vec4s: the I2_S codes as in the file
//   2 storage read  act: array<vec4<u32>>  T × K/16 vec4s of packed int8 (rmsnorm.wgsl)
//   3 storage read  tok_scale: array<vec2<u32>>  per token: bits of the f32 scale s, of i32 Σq
//   4 storage rw    out: array<f32>        T × M, token-major; EPILOGUE 0 stores, 1 adds
//   5 uniform Step { n_tokens, .. }
//   6 storage read  partial: array<f32>    SPLIT, split_sum: the segments' raw sums (≤ (tiles +
//                                         workgroups) × 16,384; see matmul_split)
//   6 storage read  w2:  array<vec4<u32>>  GLU: the up matrix's codes (FUSED3: the 2nd matrix)
//   7 storage rw    tail_sums: array<f32>   GLU: the split tiles' parts' raw sums (≤ SMs × 16,384)
//   8 storage rw    tail_done: array<atomic<u32>>  GLU: parts finished per split tile (≤ SMs / 2)
//  10 uniform Parts { m2, m3, scale2, scale3 }  FUSED3; GLU: scale2 = the up matrix's scale,
//                                         m3 = the adapter's SM count (0: unknown; tail_plan)
// Dispatch: matmul_tiled (ceil(M / 128), ceil(T / 64), 1); matmul_wide (the host's choice
// for steps of more than 64 tokens and M ≥ 1024) (ceil(M / 128), ceil(T / 128), 1);
// matmul_split (`#if SPLIT`, the tiles' K blocks shared out, see stream_chunk)
// (⌈W / chunk⌉, 1, 1), then split_sum (ceil(M / 256), T, 1); matmul_wide_glu (`#if GLU`)
// (ceil(M / 64), ceil(T / 128), 1), or one workgroup per whole tile and split part (see
// tail_plan); 256 threads per workgroup, 512 in matmul_wide3 (wide512).
//
// A workgroup owns 128 weight rows × 64 tokens and walks K in stages of 32 elements (one
// bit plane of an I2_S block: the codes at shift 6 − 2·(s % 4) of block s / 4's 8 words per
// row; activation vec4s 2s, 2s + 1). Each stage is unpacked to f16 in workgroup memory:
// the weights' c · 2^-24 row-major ([row][k], A) and the activations token-major ([token][k],
// B, read as a column-major fragment), each row 32 elements + 8 of padding (80 bytes, so
// the fragment loads' eight 16-byte rows fall in distinct banks), four elements per
// 8-byte store, each word's bytes in the order 0, 2, 1, 3 on both sides (codes4, act4: no
// int → float conversions; a sum over k is the same in any order). Two buffers alternate:
// stage s + 1 is unpacked after stage s's products into the other buffer, one barrier a
// stage. Global memory is read a block (four stages) at a time, before the products of the
// stage that precedes it, and coalesced: two adjacent threads read a weight row's 32 code
// bytes, eight a token's 128 activation bytes, rotated so that each thread holds one
// activation vec4 of every stage (of two of the four in 64-token tiles; act_vec); reading
// one activation vec4 of 32 different tokens per load instruction, as this kernel did
// first, cost 2–5 % of pp512 on an H100 (BENCHMARKS.md, session 13). Subgroup s
// multiplies rows 32·(s % 4)..+32 by tokens 32·(s / 4)..+32: 2×2 accumulators of 16×16, 4
// multiply-adds per 16-wide k step. At the end each accumulator goes through a 16×16 f32
// scratch of its subgroup, and the lanes scale and store it. 48 KiB of workgroup memory
// (the adapter must allow it; context.rs). (64-row tiles, twice the workgroups, measured
// slower at 512 tokens: BENCHMARKS.md.) Rows past M read row M−1 and tokens past T read
// token T−1; neither is written. Layout of the codes: see ternary.wgsl's header.

enable f16;
enable wgpu_cooperative_matrix;

override EPILOGUE: u32 = 0u;
const TM: u32 = 128u;
const TN: u32 = 64u;
const TNW: u32 = 128u;
const LD4: u32 = 10u;
const BUF: u32 = 1280u;
// The bits of two f16 1024 (exponent 10, mantissa 0): an integer below 1024 or'd into a
// half's mantissa makes that half 1024 + it.
const F16_1024: u32 = 0x64006400u;

struct Params { rows: u32, words: u32, w_scale: f32, zero: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> act: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tok_scale: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> step: Step;
// The other matrices' rows and scales (FUSED3; GLU: the up matrix's scale2). Entries that
// do not read it leave binding 10 out of their layout.
struct Parts { m2: u32, m3: u32, scale2: f32, scale3: f32 }
@group(0) @binding(10) var<uniform> parts: Parts;
#if FUSED3
@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> w3: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> out2: array<f32>;
@group(0) @binding(9) var<storage, read_write> out3: array<f32>;

// FUSED3: the matrix of this workgroup's row tile (0: w, 1: w2, 2: w3), its rows and scale.
var<private> mat: u32;
var<private> mat_rows: u32;
var<private> mat_scale: f32;
#endif
#if GLU
// GLU: the up matrix (w2) beside the gate (w) and its scale (parts.scale2), ACT as glu.wgsl.
override ACT: u32 = 0u;
@group(0) @binding(6) var<storage, read> w2: array<vec4<u32>>;
// The last wave's split tiles (see matmul_wide_glu): each part's raw sums, 16,384 floats a
// part (tile token t, tile row r at 128·t + r: gate rows 0..63, up rows 64..127), and per
// split tile the parts finished (0 between launches: the last part sets it back).
@group(0) @binding(7) var<storage, read_write> tail_sums: array<f32>;
@group(0) @binding(8) var<storage, read_write> tail_done: array<atomic<u32>>;

// The part of a split tile this workgroup computes (NO_PART: a whole tile).
const NO_PART: u32 = 0xffffffffu;
var<private> piece: u32 = NO_PART;
// The split tile's first row and token (drain, merge_parts).
var<private> part_row0: u32;
var<private> part_t0: u32;
#endif
#if SPLIT
@group(0) @binding(6) var<storage, read> partial: array<f32>;

// SPLIT: the workgroups matmul_split shares the tiles' blocks among: the adapter's SMs (one
// tile workgroup each: the register file holds one), or 0 where that is unknown (then
// three per tile).
override SMS: u32 = 0u;
// SPLIT: the segment matmul_split's workgroup is on: its sums' first float in `out` (16,384
// a segment, token-major), and the tile's first row and token.
var<private> seg_base: u32;
var<private> seg_row0: u32;
var<private> seg_t0: u32;
#endif

// The I2_S blocks this workgroup walks: from blk0, blk_n of them (matmul_split walks a
// segment of a tile's; every other entry all of them).
var<private> blk0: u32;
var<private> blk_n: u32;
// Rounds of the accumulators' drain through the 8 scratch slots (2 for 16 subgroups).
var<private> drain_rounds: u32 = 1u;

var<workgroup> wa: array<vec4<f16>, 2560>; // 2 buffers × TM rows × LD4 vec4s, [row][k]
var<workgroup> xb: array<vec4<f16>, 2560>; // 2 buffers × TNW tokens × LD4 vec4s, [token][k]
var<workgroup> cs: array<f32, 2048>; // 8 subgroups × 16 × 16

// Two f16 halves of `bits` (read through f32: naga has no 32 → 2 × 16-bit bitcast) less
// `off`, subtracted as f16 pairs: exact for the small integers below. (Subtracting in f32
// before the conversion back, two operations more a pair: pp512 3.7 % slower on an H200,
// BENCHMARKS.md, session 22.)
fn halves(bits: u32, off: f16) -> vec2<f16> {
    return vec2<f16>(unpack2x16float(bits)) - vec2<f16>(off);
}

// The 4 codes c (0, 1, 2) at bits `sh`..`sh`+1 of the bytes of `word` as the f16 of bits
// c, i.e. c · 2^-24 (a subnormal, exact through f32 and back), in the byte order 0, 2, 1,
// 3: a mask, no int → float conversion (a quarter of the ALU rate on NVIDIA) and no
// subtraction (the epilogue takes Σq away instead: `exact`).
fn codes4(word: u32, sh: u32) -> vec4<f16> {
    let y = word >> sh;
    let lo = vec2<f16>(unpack2x16float(y & 0x00030003u));
    let hi = vec2<f16>(unpack2x16float((y >> 8u) & 0x00030003u));
    return vec4<f16>(lo, hi);
}

// The 4 int8 of `word` as f16, in the byte order of codes4: each byte b set as b + 128 in the
// mantissa of the f16 1024, then 1152 taken away (exact).
fn act4(word: u32) -> vec4<f16> {
    let lo = halves(((word & 0x00ff00ffu) ^ 0x00800080u) | F16_1024, 1152.0h);
    let hi = halves((((word >> 8u) & 0x00ff00ffu) ^ 0x00800080u) | F16_1024, 1152.0h);
    return vec4<f16>(lo, hi);
}

// This thread's 16 weights of a stage into wa at `at`: elements 4j..4j+3 are bytes 0, 2, 1,
// 3 of word j of `wv` (block bytes 16·lh..16·lh+15), their codes at bits `sh`..`sh`+1.
fn stage_codes(wv: vec4<u32>, sh: u32, at: u32) {
    // Explicit components: a dynamically indexed vector variable would live in local memory.
    wa[at] = codes4(wv.x, sh);
    wa[at + 1u] = codes4(wv.y, sh);
    wa[at + 2u] = codes4(wv.z, sh);
    wa[at + 3u] = codes4(wv.w, sh);
}

// 16 int8 activations (a packed vec4) into xb at `at` as f16 (act4's order).
fn stage_act(av: vec4<u32>, at: u32) {
    xb[at] = act4(av.x);
    xb[at + 1u] = act4(av.y);
    xb[at + 2u] = act4(av.z);
    xb[at + 3u] = act4(av.w);
}

// The weight fragment of 16 rows from wa vec4 `at` (row-major, LD4 vec4s a row).
fn frag_a(at: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&wa[at], LD4);
}

// The activation fragment of 16 tokens from xb vec4 `at` (column-major, LD4 a token).
fn frag_b(at: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&xb[at], LD4);
}

// The integer Σ_k (code − 1)·q of token t from an accumulated (or summed) Σ c·q·2^-24: the
// sum scaled by 2^24 (exact) less the token's Σq (exact: both integers below 2^24).
fn exact(acc: f32, t: u32) -> f32 {
    return acc * 16777216.0 - f32(bitcast<i32>(tok_scale[t].y));
}

// One accumulator through the subgroup's scratch: store, then scale and write rows
// r0..r0+16 × tokens tk0..tk0+16 (GLU: the gate subgroups combine theirs with the up
// subgroups'). Every subgroup calls it together (barriers inside).
fn drain(c: coop_mat16x16<f32, C>, sg: u32, lane: u32, r0: u32, tk0: u32) {
#if GLU
    if (piece != NO_PART) {
        // A split tile's part: the raw sums straight to tail_sums, token-major (element
        // (tile row m, tile token n) at 128·n + m of the part's 16,384 floats).
        let b = piece * 16384u + (tk0 - part_t0) * 128u + (r0 - part_row0);
        coopStore(c, &tail_sums[b], 128u);
        return;
    }
#endif
    // Eight scratch slots: 16 subgroups (wide512) drain in two rounds.
    for (var h = 0u; h < drain_rounds; h++) {
        if (sg / 8u == h) {
            coopStore(c, &cs[(sg % 8u) * 256u], 16u);
        }
        workgroupBarrier();
#if GLU
        if (sg % 4u < 2u) {
            finish_glu(sg, lane, r0, tk0);
        }
#else
        if (sg / 8u == h) {
            finish(sg % 8u, lane, r0, tk0);
        }
#endif
        workgroupBarrier();
    }
}

#if GLU
// out = act(gate) · up for gate subgroup `sg`'s scratch and up subgroup sg + 2's (the same
// rows of the other matrix, the same tokens), each scaled as finish scales it: glu.wgsl's
// values from the two products the separate launches would store.
fn finish_glu(sg: u32, lane: u32, r0: u32, tk0: u32) {
    let last = step.n_tokens - 1u;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let row = r0 + e % 16u;
        let t = tk0 + e / 16u;
        if (row < p.rows && t <= last) {
            let s = bitcast<f32>(tok_scale[t].x);
            let g = (exact(cs[sg * 256u + e], t) / s) * p.w_scale;
            let u = (exact(cs[(sg + 2u) * 256u + e], t) / s) * parts.scale2;
            out[t * p.rows + row] = gated(g, u, ACT);
        }
    }
}
#endif

// Scales and stores the accumulator in subgroup `sg`'s scratch (column-major: element
// (row m, token n) at n·16 + m).
fn finish(sg: u32, lane: u32, r0: u32, tk0: u32) {
    let last = step.n_tokens - 1u;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let row = r0 + e % 16u;
        let t = tk0 + e / 16u;
        if (row < rows_of() && t <= last) {
#if SPLIT
            // A segment's raw sums (exact in f32); split_sum scales their total.
            out[seg_base + (t - seg_t0) * 128u + row - seg_row0] = cs[sg * 256u + e];
            continue;
#endif
            let m = tok_scale[t];
            let y = (exact(cs[sg * 256u + e], t) / bitcast<f32>(m.x)) * scale_of();
            let o = t * rows_of() + row;
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

// Rows and I2_S scale of the matrix this workgroup multiplies, and vec4 i of its codes.
fn rows_of() -> u32 {
#if FUSED3
    return mat_rows;
#else
    return p.rows;
#endif
}

fn scale_of() -> f32 {
#if FUSED3
    return mat_scale;
#else
    return p.w_scale;
#endif
}

fn code_vec(r: Roles, i: u32) -> vec4<u32> {
#if GLU
    if (r.wm == 1u) {
        return w2[i];
    }
#endif
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

// Staging roles of thread `li` for a tile of `tn` tokens (64 or 128): tile row li / 2
// with block bytes 16·(li % 2)..+16, its matrix wm (GLU: rows 64.. of the tile are up
// rows) and the row's first vec4 wrow; for the activations, lane group li / 8 and slot
// li % 8 (see act_vec).
struct Roles { lr: u32, lh: u32, lg: u32, ls: u32, nm: u32, t0: u32, wm: u32, wrow: u32, sw: bool, sa: bool }

fn roles(li: u32, row0: u32, t0: u32, tn: u32) -> Roles {
    var r: Roles;
    r.lr = li / 2u;
    r.lh = li % 2u;
    r.lg = li / 8u;
    r.ls = li % 8u;
    r.nm = tn / 32u;
    r.t0 = t0;
    r.sw = true;
    r.sa = true;
#if GLU
    r.wm = r.lr / 64u;
    r.wrow = min(row0 + r.lr % 64u, p.rows - 1u) * (p.words / 4u);
#else
    r.wrow = min(row0 + r.lr, rows_of() - 1u) * (p.words / 4u);
#endif
    return r;
}

// A thread's words of an I2_S block (four stages): its block words of the weights, and
// activation vec4s a0..a3 (the first nm of them).
struct Words { w: vec4<u32>, a0: vec4<u32>, a1: vec4<u32>, a2: vec4<u32>, a3: vec4<u32> }

// Activation vec4 of load m of block b: token nm·lg + m of the tile, vec4 (ls + 2m) % 8 of
// the token's 128 bytes of the block. Eight consecutive threads read one token's 128 bytes
// (one cache line), and over its loads a thread holds one vec4 of each of the block's four
// stages when nm = 4 (two of them when nm = 2): stage (ls / 2 + m) % 4, half ls % 2. A
// subgroup's staging stores then go to 16 (nm = 4) consecutive tokens, whose rows fall in
// twice as many banks as tokens 32 apart (each 80-byte row stride times 32 is a multiple of
// the 128 bytes the banks span).
fn act_vec(r: Roles, b: u32, m: u32) -> vec4<u32> {
    let t = min(r.t0 + r.nm * r.lg + m, step.n_tokens - 1u);
    return act[t * p.words + 8u * b + (r.ls + 2u * m) % 8u];
}

// The words of this workgroup's block `rel` (stages 4·rel..+3: bit plane s % 4 of I2_S block
// blk0 + s / 4).
fn load_words(r: Roles, rel: u32) -> Words {
    let b = blk0 + rel;
    var n: Words;
    if (r.sw) {
        n.w = code_vec(r, r.wrow + 2u * b + r.lh);
    }
    if (r.sa) {
        n.a0 = act_vec(r, b, 0u);
        n.a1 = act_vec(r, b, 1u);
        if (r.nm == 4u) {
            n.a2 = act_vec(r, b, 2u);
            n.a3 = act_vec(r, b, 3u);
        }
    }
    return n;
}

// Stage 0 loaded, unpacked and visible to the workgroup; returns block 0's words.
fn first_stage(r: Roles) -> Words {
    let wd = load_words(r, 0u);
    stage(r, 0u, wd);
    workgroupBarrier();
    return wd;
}

// The words stage s + 1 is unpacked from: block (s + 1) / 4's, loaded before stage s's
// products when s + 1 starts a block (stage s's own were unpacked a stage earlier), else
// `wd`.
fn next_words(r: Roles, s: u32, stages: u32, wd: Words) -> Words {
    if (s + 1u < stages && (s + 1u) % 4u == 0u) {
        return load_words(r, (s + 1u) / 4u);
    }
    return wd;
}

// Writes stage `s` from its block's words into buffer s % 2: every thread its 16 weights,
// and the thread holding a vec4 of the stage (load m, see act_vec) its 16 activations.
fn stage(r: Roles, s: u32, wd: Words) {
    let o = (s % 2u) * BUF;
    if (r.sw) {
        stage_codes(wd.w, 6u - 2u * (s % 4u), o + r.lr * LD4 + 4u * r.lh);
    }
    let m = (s + 4u - r.ls / 2u) % 4u;
    if (r.sa && m < r.nm) {
        // Explicit selects: a dynamically indexed vector variable would live in local memory.
        let av = select(select(wd.a0, wd.a1, m == 1u), select(wd.a2, wd.a3, m == 3u), m >= 2u);
        stage_act(av, o + (r.nm * r.lg + m) * LD4 + 4u * (r.ls % 2u));
    }
}

@compute @workgroup_size(256)
fn matmul_tiled(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    blk_n = p.words / 8u;
    let row0 = wg.x * TM;
    let t0 = wg.y * TN;
    tile22(roles(li, row0, t0, TN), row0, t0, sg, lane);
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
    blk_n = p.words / 8u;
    wide(li, wg.x * TM, wg.y * TNW, sg, lane);
}

#if GLU
// How matmul_wide_glu lays `tiles` tiles of K/128 `blocks` over parts.m3 SMs (0: unknown):
// with one workgroup an SM, the r = tiles % SMs tiles of a last, partial wave would take as
// long as a full wave, so they are split along K into p = min(SMs / r, 3) parts that run
// side by side: the first `full` workgroups take whole tiles, the next r·p one part each.
// p = 1 (nothing split) when the SMs are unknown, the tiles fill whole waves, r > SMs / 2 or
// K < 1,024. The host plans its dispatch with the same function (`ops::coop_fused`).
struct Tail { full: u32, r: u32, p: u32 }

fn tail_plan(tiles: u32, blocks: u32) -> Tail {
    let sms = parts.m3;
    if (sms == 0u || blocks < 8u || tiles % sms == 0u) {
        return Tail(tiles, 0u, 1u);
    }
    let r = tiles % sms;
    let p = min(sms / r, 3u);
    if (p < 2u) {
        return Tail(tiles, 0u, 1u);
    }
    return Tail(tiles - r, r, p);
}

// matmul_wide over gate and up rows together: tile rows 0..63 are gate rows 64·x.. (w),
// rows 64..127 the same up rows (w2); subgroups 0, 1, 4, 5 hold gate products, 2, 3, 6, 7
// the matching up products, and out = act(gate) · up (ACT 0: ReLU², 1: SiLU), the bits of
// two matmul_wide launches and glu.wgsl. Tile i (row tile i % X, token tile i / X, X =
// ceil(M / 64)) is workgroup i of the grid in row-major order; a split tile's parts (see
// tail_plan) store raw sums in tail_sums, and the last part to finish adds them (exact
// integers, so the same bits) and stores the tile. Dispatch: (ceil(M / 64), ceil(T / 128),
// 1), or, when tail_plan splits, full + r·p workgroups (x · y of them, the rest return).
@compute @workgroup_size(256)
fn matmul_wide_glu(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let blocks = p.words / 8u;
    let tx = (p.rows + TM / 2u - 1u) / (TM / 2u);
    let plan = tail_plan(tx * ((step.n_tokens + TNW - 1u) / TNW), blocks);
    var tile = wg.y * nwg.x + wg.x;
    if (tile >= plan.full + plan.r * plan.p) {
        return;
    }
    blk0 = 0u;
    blk_n = blocks;
    if (tile >= plan.full) {
        piece = tile - plan.full;
        let per = (blocks + plan.p - 1u) / plan.p;
        blk0 = (piece % plan.p) * per;
        blk_n = min(per, blocks - blk0);
        tile = plan.full + piece / plan.p;
    }
    part_row0 = (tile % tx) * (TM / 2u);
    part_t0 = (tile / tx) * TNW;
    wide(li, part_row0, part_t0, sg, lane);
    if (piece == NO_PART) {
        return;
    }
    // This part's sums are stored (wide): count it; the last of the tile's parts merges.
    storageBarrier();
    let slot = piece / plan.p;
    // The ticket travels through the accumulator scratch (free by now): one more
    // workgroup variable would pass the 48 KiB an NVIDIA driver allows.
    if (li == 0u) {
        cs[0] = f32(atomicAdd(&tail_done[slot], 1u));
    }
    if (u32(workgroupUniformLoad(&cs[0])) + 1u < plan.p) {
        return;
    }
    storageBarrier();
    if (li == 0u) {
        atomicStore(&tail_done[slot], 0u);
    }
    merge_parts(li, slot * plan.p, plan.p);
}

// out = act(gate) · up for the split tile at part_row0, part_t0: each value the sum of
// the `np` (2 or 3) parts' raw sums from part `first` on, scaled as finish_glu scales them.
// Thread li takes tile values li + 256·j (gate row li % 64 of token li / 64 + 4j): reads and
// stores coalesced, eight values' reads issued before their stores (one at a time, this
// merge alone took about as long as a third of the tile's products).
fn merge_parts(li: u32, first: u32, np: u32) {
    for (var j = 0u; j < 32u; j += 8u) {
        let o = li + 256u * j;
        let v0 = part_sums(first, np, o);
        let v1 = part_sums(first, np, o + 256u);
        let v2 = part_sums(first, np, o + 512u);
        let v3 = part_sums(first, np, o + 768u);
        let v4 = part_sums(first, np, o + 1024u);
        let v5 = part_sums(first, np, o + 1280u);
        let v6 = part_sums(first, np, o + 1536u);
        let v7 = part_sums(first, np, o + 1792u);
        store_glu(v0, o);
        store_glu(v1, o + 256u);
        store_glu(v2, o + 512u);
        store_glu(v3, o + 768u);
        store_glu(v4, o + 1024u);
        store_glu(v5, o + 1280u);
        store_glu(v6, o + 1536u);
        store_glu(v7, o + 1792u);
    }
}

// Tile value o's gate and up sums over the parts (no branch: a third part's load is made
// either way and selected away when np = 2; the integers add exactly in any order).
fn part_sums(first: u32, np: u32, o: u32) -> vec2<f32> {
    let b = first * 16384u + (o / 64u) * 128u + o % 64u;
    let b3 = select(b, b + 32768u, np == 3u);
    let g = tail_sums[b] + tail_sums[b + 16384u] + select(0.0, tail_sums[b3], np == 3u);
    let u = tail_sums[b + 64u] + tail_sums[b + 16448u] + select(0.0, tail_sums[b3 + 64u], np == 3u);
    return vec2<f32>(g, u);
}

// out = act(gate) · up of tile value o from its summed gate and up sums `v`.
fn store_glu(v: vec2<f32>, o: u32) {
    let row = part_row0 + o % 64u;
    let t = part_t0 + o / 64u;
    if (row < p.rows && t < step.n_tokens) {
        let s = bitcast<f32>(tok_scale[t].x);
        let g = (exact(v.x, t) / s) * p.w_scale;
        out[t * p.rows + row] = gated(g, (exact(v.y, t) / s) * parts.scale2, ACT);
    }
}
#endif

#if SPLIT
// How matmul_split shares out W = tiles · B blocks (B = K/128 a tile; a tile is 128 rows ×
// 128 tokens, tile i at row tile i % ceil(M / 128), token tile i / ceil(M / 128)): workgroup
// g walks blocks g·chunk.. of the tiles laid end to end, chunk = ⌈W / G⌉, for G = SMS
// workgroups (3 per tile where SMS is 0), so every SM gets the same share whatever the
// tile count (no last wave of a few tiles: "stream-K"). The host dispatches ⌈W / chunk⌉
// (`ops::split_k::stream_plan`, the same arithmetic).
fn stream_chunk(tiles: u32, blocks: u32) -> u32 {
    let g = select(SMS, 3u * tiles, SMS == 0u);
    return (tiles * blocks + g - 1u) / g;
}

// The tiles of this step: row tiles, all tiles.
fn split_tiles() -> vec2<u32> {
    let tx = (p.rows + TM - 1u) / TM;
    return vec2<u32>(tx, tx * ((step.n_tokens + TNW - 1u) / TNW));
}

// matmul_wide over workgroup g's blocks (stream_chunk): each piece of a tile it walks is a
// segment, and segment (g, tile i) stores its raw sums at segment g + i of `out`
// (16,384 floats, token-major: a tile's segments are consecutive, since each workgroup
// after the first that walks a tile starts it); split_sum adds a tile's segments and
// scales them. For matrices whose row tiles alone leave most of the GPU idle (a 2,560-row
// o or down projection: 20 row tiles, 80 tiles for 512 tokens on 132 SMs).
// Dispatch: (⌈W / chunk⌉, 1, 1).
@compute @workgroup_size(256)
fn matmul_split(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let blocks = p.words / 8u;
    let tiles = split_tiles();
    let chunk = stream_chunk(tiles.y, blocks);
    var x = wg.x * chunk;
    let end = min(x + chunk, tiles.y * blocks);
    while (x < end) {
        let i = x / blocks;
        let stop = min((i + 1u) * blocks, end);
        blk0 = x - i * blocks;
        blk_n = stop - x;
        seg_base = (wg.x + i) * 16384u;
        seg_row0 = (i % tiles.x) * TM;
        seg_t0 = (i / tiles.x) * TNW;
        wide(li, seg_row0, seg_t0, sg, lane);
        x = stop;
    }
}

// out[t][r] (= or +=) exact(Σ of the tile's segments' sums) / s[t] · w_scale: the
// segments' sums (integers times 2^-24) add up exactly to the whole-K sum, so the result
// is matmul_wide's bit for bit. Dispatch: (ceil(M / 256), T, 1).
@compute @workgroup_size(256)
fn split_sum(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
) {
    let row = wg.x * 256u + li;
    let t = wg.y;
    if (row >= p.rows) {
        return;
    }
    let blocks = p.words / 8u;
    let tiles = split_tiles();
    let chunk = stream_chunk(tiles.y, blocks);
    let i = (t / TNW) * tiles.x + row / TM;
    let first = (i * blocks) / chunk;
    let last = ((i + 1u) * blocks - 1u) / chunk;
    let at = (t % TNW) * 128u + row % TM;
    var c = 0.0;
    for (var g = first; g <= last; g++) {
        c += partial[(g + i) * 16384u + at];
    }
    let o = t * p.rows + row;
    let y = (exact(c, t) / bitcast<f32>(tok_scale[t].x)) * p.w_scale;
    if (EPILOGUE == 1u) {
        out[o] = out[o] + pinned(y, p.zero);
    } else {
        out[o] = y;
    }
}
#endif

#if FUSED3
// matmul_wide over three matrices that read the same activations (q, k, v), their row tiles
// one after another along x: M1 = p.rows rows of w into out (scale p.w_scale), then
// parts.m2 of w2 into out2 and parts.m3 of w3 into out3, each token-major with its own row
// count; stores only (EPILOGUE 0). Dispatch: (Σ ceil(Mi / 128), ceil(T / 128), 1).
@compute @workgroup_size(512)
fn matmul_wide3(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let t1 = (p.rows + TM - 1u) / TM;
    let t2 = (parts.m2 + TM - 1u) / TM;
    var tile = wg.x;
    blk_n = p.words / 8u;
    mat = 0u;
    mat_rows = p.rows;
    mat_scale = p.w_scale;
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
    wide512(li, tile * TM, wg.y * TNW, sg, lane);
}
#endif

// Subgroup sg's 32 rows × 32 tokens (rows 32·(sg % 4).., tokens 32·(sg / 4)..) of the tile
// at row0, t0, staged by the roles r: 2×2 accumulators, 4 multiply-adds per 16-wide k step
// (matmul_tiled: 8 subgroups, 64 tokens; wide512: 16 subgroups, 128 tokens).
fn tile22(r: Roles, row0: u32, t0: u32, sg: u32, lane: u32) {
    let rb = 32u * (sg % 4u);
    let tb = 32u * (sg / 4u);
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();

    let stages = 4u * blk_n;
    var wd = first_stage(r);
    for (var s = 0u; s < stages; s++) {
        wd = next_words(r, s, stages, wd);
        let o = (s % 2u) * BUF;
        // The stage's first 16 k: fragments, then products.
        let a0 = frag_a(o + rb * LD4);
        let a1 = frag_a(o + (rb + 16u) * LD4);
        let b0 = frag_b(o + tb * LD4);
        let b1 = frag_b(o + (tb + 16u) * LD4);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        // The second 16 k's fragments are read before the next stage is unpacked, so the
        // unpacking overlaps their reads; then their products.
        let e0 = frag_a(o + rb * LD4 + 4u);
        let e1 = frag_a(o + (rb + 16u) * LD4 + 4u);
        let f0 = frag_b(o + tb * LD4 + 4u);
        let f1 = frag_b(o + (tb + 16u) * LD4 + 4u);
        if (s + 1u < stages) {
            stage(r, s + 1u, wd);
        }
        c00 = coopMultiplyAdd(e0, f0, c00);
        c01 = coopMultiplyAdd(e0, f1, c01);
        c10 = coopMultiplyAdd(e1, f0, c10);
        c11 = coopMultiplyAdd(e1, f1, c11);
        workgroupBarrier();
    }

    let r0 = row0 + rb;
    let tk0 = t0 + tb;
    drain(c00, sg, lane, r0, tk0);
    drain(c01, sg, lane, r0, tk0 + 16u);
    drain(c10, sg, lane, r0 + 16u, tk0);
    drain(c11, sg, lane, r0 + 16u, tk0 + 16u);
}

// The 128 × 128 tile at rows row0.., tokens t0.. on 512 threads (matmul_wide3): threads
// 0..255 stage the weights, 256..511 the activations (one activation vec4 of every stage
// each), and 16 subgroups of 2×2 accumulators (tile22) multiply. Against `wide` on an H100
// (512 tokens, 2B-4T): q/k/v 7 % shorter (BENCHMARKS.md, session 20; 7 % again on an H200,
// session 22); the gate/up tiles and, since their K is shared out evenly (matmul_split),
// the o/down pieces run on `wide` (2 % shorter there).
fn wide512(li: u32, row0: u32, t0: u32, sg: u32, lane: u32) {
    var r = roles(li % 256u, row0, t0, TNW);
    r.sw = li < 256u;
    r.sa = li >= 256u;
    drain_rounds = 2u;
    tile22(r, row0, t0, sg, lane);
}

// The 128 × 128 tile at rows row0.., tokens t0.. on 256 threads (matmul_wide,
// matmul_wide_glu and matmul_split).
fn wide(li: u32, row0: u32, t0: u32, sg: u32, lane: u32) {
    let r = roles(li, row0, t0, TNW);
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

    let stages = 4u * blk_n;
    var wd = first_stage(r);
    for (var s = 0u; s < stages; s++) {
        wd = next_words(r, s, stages, wd);
        let o = (s % 2u) * BUF;
        // The stage's first 16 k: fragments, then products.
        let a0 = frag_a(o + rb * LD4);
        let a1 = frag_a(o + (rb + 16u) * LD4);
        let b0 = frag_b(o + tb * LD4);
        let b1 = frag_b(o + (tb + 16u) * LD4);
        let b2 = frag_b(o + (tb + 32u) * LD4);
        let b3 = frag_b(o + (tb + 48u) * LD4);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c02 = coopMultiplyAdd(a0, b2, c02);
        c03 = coopMultiplyAdd(a0, b3, c03);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        c12 = coopMultiplyAdd(a1, b2, c12);
        c13 = coopMultiplyAdd(a1, b3, c13);
        // The second 16 k's fragments are read before the next stage is unpacked, so the
        // unpacking overlaps their reads; then their products.
        let e0 = frag_a(o + rb * LD4 + 4u);
        let e1 = frag_a(o + (rb + 16u) * LD4 + 4u);
        let f0 = frag_b(o + tb * LD4 + 4u);
        let f1 = frag_b(o + (tb + 16u) * LD4 + 4u);
        let f2 = frag_b(o + (tb + 32u) * LD4 + 4u);
        let f3 = frag_b(o + (tb + 48u) * LD4 + 4u);
        if (s + 1u < stages) {
            stage(r, s + 1u, wd);
        }
        c00 = coopMultiplyAdd(e0, f0, c00);
        c01 = coopMultiplyAdd(e0, f1, c01);
        c02 = coopMultiplyAdd(e0, f2, c02);
        c03 = coopMultiplyAdd(e0, f3, c03);
        c10 = coopMultiplyAdd(e1, f0, c10);
        c11 = coopMultiplyAdd(e1, f1, c11);
        c12 = coopMultiplyAdd(e1, f2, c12);
        c13 = coopMultiplyAdd(e1, f3, c13);
        workgroupBarrier();
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
