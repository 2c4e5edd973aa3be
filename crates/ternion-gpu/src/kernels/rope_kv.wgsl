// rope_kv.wgsl — rotary embedding of q and k for T tokens, each at its own position in its
// own sequence (toks), in ggml's NEOX pairing (i with i + n_rot/2) or NORM pairing (2i with
// 2i + 1), then the layer's paged KV-cache store: rotated k and v (rounded to F16 unless the
// cache is F32: kv_type.wgsl) into the row of the token's (sequence, position). n_rot = 0 is a plain KV store (GPT-2).
//
// Bindings (group 0):
//   0 uniform Params { n_head, n_head_kv, head_dim, n_rot, mode, pps, _, _ }: head_dim
//                     even, n_rot a multiple of 4; mode 0 = NEOX, 1 = NORM; pps =
//                     page-table entries per sequence
//   1 uniform Step { n_tokens, .. }
//   2 storage rw    q:       array<f32>         T × n_head·head_dim, rotated in place
//   3 storage read  k:       array<f32>         T × kv_dim (kv_dim = n_head_kv·head_dim)
//   4 storage read  v:       array<f32>         T × kv_dim
//   5 storage rw    k_cache: array<KvWord>      pages × PAGE rows of kv_dim elements, two a
//                                              word (kv_type.wgsl); the row of
//                                              (seq s, position i) is
//                                              pages[s·pps + i / PAGE]·PAGE + i % PAGE
//   6 storage rw    v_cache: array<KvWord>      same layout
//   7 storage read  rope_tab: array<vec2<f32>>  (cos θ, sin θ) of pair i at position pos
//                                              in element pos·n_rot/2 + i (rope_table.wgsl)
//   8 storage read  toks:    array<vec2<u32>>   T × (position, sequence slot; top bit: a flag
//                                              for attention.wgsl)
//   9 storage read  pages:   array<u32>         slots × pps page ids (the page tables)
// Dispatch: (ceil(items / 256), T, 1) with items = (n_head + 2·n_head_kv) · head_dim/2: per
// token, one thread per word (pair of adjacent dims) of every q head, every k head, then
// every v head. NEOX: in a rotated head, thread j < n_rot/4 rotates the pairs (2j, 2j+n_rot/2)
// and (2j+1, 2j+1+n_rot/2) and writes both words; threads n_rot/4 ≤ j < n_rot/2 have
// nothing to do. NORM: thread j < n_rot/2 rotates its own pair (2j, 2j+1). Threads
// j ≥ n_rot/2 copy the unrotated dims.
//
// The rotation itself is rope.wgsl's (shared with attention_fast.wgsl's fused decode).
//
// Numerics:
// - The angles and their cos/sin are rope_table.wgsl's (see its header).
// - F16 rounding is done in integer arithmetic, round-to-nearest-even (like half::f16),
//   because WGSL leaves the rounding of f32→f16 conversions to the implementation.

struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<KvWord>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<KvWord>;
@group(0) @binding(7) var<storage, read> rope_tab: array<vec2<f32>>;
@group(0) @binding(8) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(9) var<storage, read> pages: array<u32>;

// Positions per KV page (kv.rs PAGE_POSITIONS).
const PAGE: u32 = 32u;

// (cos θ, sin θ) of pair i at `pos` for rope.wgsl's `rope_words`.
fn rope_cs(pos: u32, i: u32) -> vec2<f32> {
    return rope_tab[pos * (p.n_rot / 2u) + i];
}

// Element i of head input `which` (0: q, 1: k), for rope.wgsl's `rope_words`.
fn rope_src(which: u32, i: u32) -> f32 {
    if (which == 0u) {
        return q[i];
    }
    return k[i];
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let hw = p.head_dim / 2u;
    let item = gid.x;
    let n_items = (p.n_head + 2u * p.n_head_kv) * hw;
    if (item >= n_items || t >= step.n_tokens) {
        return;
    }
    let head = item / hw;
    let j = item % hw;
    let kv_dim = p.n_head_kv * p.head_dim;
    let tk = toks[t];
    let pos = tk.x;
    // The top bit of the slot flags decode numerics for attention.wgsl.
    let slot = tk.y & 0x7fffffffu;
    let crow = (pages[slot * p.pps + pos / PAGE] * PAGE + pos % PAGE) * kv_dim / 2u;
    if (head >= p.n_head + p.n_head_kv) {
        // v: copy one word.
        let e = (head - p.n_head - p.n_head_kv) * p.head_dim + 2u * j;
        let src = t * kv_dim + e;
        v_cache[crow + e / 2u] = kv_pack(v[src], v[src + 1u]);
        return;
    }
    let is_q = head < p.n_head;
    if (is_q) {
        // Rotated in place (a copied word is written back unchanged).
        let base = t * p.n_head * p.head_dim + head * p.head_dim;
        let r = rope_words(0u, base, j, pos, p.n_rot, p.mode);
        if (r.n >= 1u) {
            q[base + r.i0] = r.v0.x;
            q[base + r.i0 + 1u] = r.v0.y;
        }
        if (r.n == 2u) {
            q[base + r.i1] = r.v1.x;
            q[base + r.i1 + 1u] = r.v1.y;
        }
        return;
    }
    let base = t * kv_dim + (head - p.n_head) * p.head_dim;
    let r = rope_words(1u, base, j, pos, p.n_rot, p.mode);
    let cbase = crow + (head - p.n_head) * hw;
    if (r.n >= 1u) {
        k_cache[cbase + r.i0 / 2u] = kv_pack(r.v0.x, r.v0.y);
    }
    if (r.n == 2u) {
        k_cache[cbase + r.i1 / 2u] = kv_pack(r.v1.x, r.v1.y);
    }
}
