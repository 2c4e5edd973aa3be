// rope.wgsl — the rotary embedding shared by rope_kv.wgsl and attention_fast.wgsl's fused
// decode (appended to both modules). The including kernel defines `rope_src(which, i)`
// (element i of its q (which 0) or k (which 1) input) and `theta_of(pos, i)` (the angle of
// pair i: `rope_theta`, or a table of it the workgroup filled), and binds `freqs` (n_rot/2
// frequency divisors, read only when has_freqs = 1). Numerics: see rope_kv.wgsl's header — θ of pair
// i is f32(pos) multiplied i times by theta_scale, divided by freqs[i] correctly rounded;
// cos/sin by Cody–Waite reduction and cephes polynomials, so both kernels give the same
// bits.

// rope_kv.wgsl's Params: n_rot of head_dim dims rotated; theta_scale = base^(−2/n_rot);
// mode 0 = NEOX, 1 = NORM; has_freqs: divide pair i's angle by freqs[i]; pps = page-table
// entries per sequence.
struct RopeParams {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_rot: u32,
    theta_scale: f32,
    mode: u32,
    has_freqs: u32,
    pps: u32,
}

// (cos θ, sin θ) with Cody–Waite reduction by π/2.
fn cos_sin(theta: f32) -> vec2<f32> {
    let kf = round(theta * 0.63661977236758134);
    var r = theta - kf * 1.5703125;
    r = r - kf * 4.837512969970703125e-4;
    r = r - kf * 7.549789948768648e-8;
    let r2 = r * r;
    // sin r and cos r on [−π/4, π/4] (cephes sinf/cosf coefficients).
    let s = r + r * r2 * (-1.6666654611e-1 + r2 * (8.3321608736e-3 + r2 * -1.9515295891e-4));
    let c = (r2 * r2 * (4.166664568298827e-2 + r2 * (-1.388731625493765e-3 + r2 * 2.443315711809948e-5)) - 0.5 * r2) + 1.0;
    let quadrant = i32(kf) & 3;
    switch quadrant {
        case 0: { return vec2<f32>(c, s); }
        case 1: { return vec2<f32>(-s, c); }
        case 2: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}

// θ of rotation pair i at position `pos`, in the reference's order of f32 products, divided
// by the pair's frequency factor when there are any.
fn rope_theta(pos: u32, i: u32, theta_scale: f32, has_freqs: u32) -> f32 {
    var theta = f32(pos);
    for (var j = 0u; j < i; j++) {
        theta *= theta_scale;
    }
    if (has_freqs == 1u) {
        return div_rn(theta, freqs[i]);
    }
    return theta;
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
        let cs = cos_sin(theta_of(pos, j));
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
        let cs0 = cos_sin(theta_of(pos, lo));
        let cs1 = cos_sin(theta_of(pos, lo + 1u));
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
