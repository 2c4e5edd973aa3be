// rope.wgsl — the rotary embedding shared by rope_kv.wgsl and attention_fast.wgsl's fused
// decode (appended to both modules). The including kernel defines `rope_src(which, i)`
// (element i of its q (which 0) or k (which 1) input) and `rope_cs(pos, i)` (cos θ and sin θ
// of pair i at position `pos`: a read of the table rope_table.wgsl filled, so both kernels
// rotate with the same bits and neither computes an angle).

// rope_kv.wgsl's Params: n_rot of head_dim dims rotated; mode 0 = NEOX, 1 = NORM; pps =
// page-table entries per sequence. The angles come from the table (rope_table.wgsl).
struct RopeParams {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_rot: u32,
    mode: u32,
    pps: u32,
    pad0: u32,
    pad1: u32,
}

// What word j (dims 2j, 2j + 1) of a head writes: n words (0, 1 or 2), the first at dims
// i0, i0 + 1 with values v0, the second at i1, i1 + 1 with v1.
struct RopeWords {
    n: u32,
    i0: u32,
    v0: vec2<f32>,
    i1: u32,
    v1: vec2<f32>,
}

// Word j of the head starting at element `base` of input `which`, rotated at position
// `pos`: NORM (mode 1) rotates pair (2j, 2j + 1) for j < n_rot/2; NEOX (mode 0) rotates the
// pairs (2j, 2j + n_rot/2) and (2j + 1, 2j + 1 + n_rot/2) for j < n_rot/4 and writes both
// words, and words n_rot/4 ≤ j < n_rot/2 write nothing; words j ≥ n_rot/2 are copied.
fn rope_words(which: u32, base: u32, j: u32, pos: u32, n_rot: u32, mode: u32) -> RopeWords {
    let half = n_rot / 2u;
    var r: RopeWords;
    if (mode == 1u && j < half) {
        let x = vec2<f32>(rope_src(which, base + 2u * j), rope_src(which, base + 2u * j + 1u));
        let cs = rope_cs(pos, j);
        r.n = 1u;
        r.i0 = 2u * j;
        r.v0 = vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
        return r;
    }
    if (j < n_rot / 4u) {
        let lo = 2u * j;
        let x0 = vec2<f32>(rope_src(which, base + lo), rope_src(which, base + lo + 1u));
        let x1 = vec2<f32>(
            rope_src(which, base + lo + half),
            rope_src(which, base + lo + half + 1u),
        );
        let cs0 = rope_cs(pos, lo);
        let cs1 = rope_cs(pos, lo + 1u);
        let c = vec2<f32>(cs0.x, cs1.x);
        let s = vec2<f32>(cs0.y, cs1.y);
        r.n = 2u;
        r.i0 = lo;
        r.v0 = x0 * c - x1 * s;
        r.i1 = lo + half;
        r.v1 = x0 * s + x1 * c;
        return r;
    }
    if (j < half) {
        return r;
    }
    r.n = 1u;
    r.i0 = 2u * j;
    r.v0 = vec2<f32>(rope_src(which, base + 2u * j), rope_src(which, base + 2u * j + 1u));
    return r;
}
