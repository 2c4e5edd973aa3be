// f16_coop.wgsl — F16 weight rows × the hidden states of up to 32 tokens → f32 logits on
// cooperative matrices (tensor cores): the LM head of a step of several sequences, each
// weight row read from memory once for all of them (f16_matvec.wgsl's main8 reads it once
// per eight). The hidden states are rounded to F16 (as the single-token path does with
// ROUND_X, and as the reference does for an F16 matrix); products are exact in f32 and
// summed in f32 in the tensor cores' order.
//
// Needs EXPERIMENTAL_COOPERATIVE_MATRIX with 16×16×16 f16·f16 + f32 subgroup matrices,
// SHADER_F16 and SUBGROUP, and a subgroup size of 32 (8 subgroups per workgroup); the host
// takes it only for shards whose row count is a multiple of 16.
//
// Bindings (group 0), as f16_matvec.wgsl:
//   0 uniform Params { rows, k, row0, out_stride }: rows in this shard, row width (multiple
//                     of 64), first output column of the shard, output row stride (vocab)
//   1 storage read  w:   array<vec4<f16>>  this shard's rows, row-major as in the file
//   2 storage read  x:   array<vec4<f32>>  T × k hidden states
//   3 storage rw    out: array<f32>        T × out_stride logits; writes row0 .. row0+rows
//   4 uniform Step { n_tokens, .. }
// Dispatch: rows32 (ceil(rows / 128), ceil(T / 32), 1), 256 threads per workgroup.
//
// A workgroup owns 128 weight rows × 32 tokens and walks k in chunks of 64. Each chunk of
// the hidden states is staged as f16 in workgroup memory, token-major ([token][k], B, a
// column-major fragment; rows of 64 + 8 elements, 144 bytes, so a fragment's eight 16-byte
// rows fall in distinct banks), in two alternating buffers: the next chunk is loaded into
// registers before the current chunk's products and stored after them, one barrier a
// chunk. Subgroup s multiplies rows 16·s..+16, its weight fragments loaded straight from
// memory (row-major, A), by tokens 0..32 (two accumulators). At the end each accumulator
// goes through a 16×16 f32 scratch of its subgroup, and the lanes store the rows and tokens
// that exist. Tokens past the step's last read the last one and are not written.

enable f16;
enable wgpu_cooperative_matrix;

const KC: u32 = 64u;
// vec4<f16> per staged token row (64 elements + 8 of padding) and per buffer.
const XL4: u32 = 18u;
const XBUF: u32 = 576u;

struct Params { rows: u32, k: u32, row0: u32, out_stride: u32 }
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> step: Step;

var<workgroup> xs: array<vec4<f16>, 1152>; // 2 buffers × 32 tokens × XL4, [token][k]
var<workgroup> cs: array<f32, 2048>; // 8 subgroups × 16 × 16

// Thread li's part of a chunk: token li / 8, elements 8·(li % 8)..+7 (two vec4s).
struct Part { a: vec4<f32>, b: vec4<f32> }

fn load_part(xrow: u32, chunk: u32, li: u32) -> Part {
    let i = xrow + (chunk * KC + 8u * (li % 8u)) / 4u;
    return Part(x[i], x[i + 1u]);
}

fn stage_part(v: Part, buf: u32, li: u32) {
    let at = buf * XBUF + (li / 8u) * XL4 + 2u * (li % 8u);
    xs[at] = vec4<f16>(v.a);
    xs[at + 1u] = vec4<f16>(v.b);
}

// Stores accumulator `c` through subgroup sg's scratch (column-major 16 × 16: element (row m,
// token n) at n·16 + m) into rows r0.. and tokens tk0.. that exist.
fn drain(c: coop_mat16x16<f32, C>, sg: u32, lane: u32, r0: u32, tk0: u32) {
    coopStore(c, &cs[sg * 256u], 16u);
    workgroupBarrier();
    let last = step.n_tokens - 1u;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + 32u * i;
        let row = r0 + e % 16u;
        let t = tk0 + e / 16u;
        if (row < p.rows && t <= last) {
            out[t * p.out_stride + p.row0 + row] = cs[sg * 256u + e];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn rows32(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let k4 = p.k / 4u;
    let t0 = wg.y * 32u;
    let xrow = min(t0 + li / 8u, step.n_tokens - 1u) * k4;
    // This subgroup's 16 rows (the shard's rows are a multiple of 16, the host checks; a
    // subgroup past the end multiplies the last 16 again and writes nothing).
    let r0 = wg.x * 128u + 16u * sg;
    let wrow = min(r0, p.rows - 16u) * k4;
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();

    let chunks = p.k / KC;
    var v = load_part(xrow, 0u, li);
    stage_part(v, 0u, li);
    workgroupBarrier();
    for (var c = 0u; c < chunks; c++) {
        if (c + 1u < chunks) {
            v = load_part(xrow, c + 1u, li);
        }
        let o = (c % 2u) * XBUF;
        for (var kq = 0u; kq < KC / 4u; kq += 4u) {
            let a = coopLoadT<coop_mat16x16<f16, A>>(&w[wrow + c * (KC / 4u) + kq], k4);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&xs[o + kq], XL4);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&xs[o + 16u * XL4 + kq], XL4);
            c0 = coopMultiplyAdd(a, b0, c0);
            c1 = coopMultiplyAdd(a, b1, c1);
        }
        if (c + 1u < chunks) {
            stage_part(v, (c + 1u) % 2u, li);
        }
        workgroupBarrier();
    }
    drain(c0, sg, lane, r0, t0);
    drain(c1, sg, lane, r0, t0 + 16u);
}
