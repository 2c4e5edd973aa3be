// rope_kv.wgsl — rotary embedding of q and k for T tokens, each at its own position in its
// own sequence (toks), in ggml's NEOX pairing (i with i + n_rot/2) or NORM pairing (2i with
// 2i + 1), then the layer's paged KV-cache store: rotated k and v rounded to F16 into the row
// of the token's (sequence, position). n_rot = 0 is a plain KV store (GPT-2).
//
// Bindings (group 0):
//   0 uniform Params { n_head, n_head_kv, head_dim, n_rot, theta_scale, mode, has_freqs, pps }:
//                     theta_scale = base^(−2/n_rot) computed on the host in f32 exactly as
//                     backend/cpu/rope.rs does; head_dim even, n_rot a multiple of 4;
//                     mode 0 = NEOX, 1 = NORM; has_freqs: divide pair i's angle by freqs[i];
//                     pps = page-table entries per sequence
//   1 uniform Step { n_tokens, .. }
//   2 storage rw    q:       array<f32>         T × n_head·head_dim, rotated in place
//   3 storage read  k:       array<f32>         T × kv_dim (kv_dim = n_head_kv·head_dim)
//   4 storage read  v:       array<f32>         T × kv_dim
//   5 storage rw    k_cache: array<u32>         pages × PAGE rows of kv_dim F16, two halves per
//                                              word (element 2i in the low half); the row of
//                                              (seq s, position i) is
//                                              pages[s·pps + i / PAGE]·PAGE + i % PAGE
//   6 storage rw    v_cache: array<u32>         same layout
//   7 storage read  freqs:   array<f32>         n_rot/2 frequency divisors (Llama-3
//                                              rope_freqs; any buffer when has_freqs = 0)
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
// Numerics:
// - θ of pair i is f32(pos) multiplied i times by theta_scale, in f32 (correctly rounded
//   products, as on the CPU), and the division by freqs[i] is correctly rounded (div_rn,
//   common.wgsl), so the angles are bit-identical to the reference.
// - cos/sin do not use the builtins (WGSL only promises 2^-11 absolute error on [−π, π] and
//   nothing beyond): θ is reduced by π/2 with a three-part Cody–Waite constant (cephes
//   sinf's, accurate for θ < 8192, i.e. positions below 8192; slowly worse beyond) and
//   evaluated with cephes' polynomials on [−π/4, π/4]: a few ulp from libm's cosf/sinf.
// - F16 rounding is done in integer arithmetic, round-to-nearest-even (like half::f16),
//   because WGSL leaves the rounding of f32→f16 conversions to the implementation.

struct Params {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_rot: u32,
    theta_scale: f32,
    mode: u32,
    has_freqs: u32,
    pps: u32,
}
struct Step { n_tokens: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read> k: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(7) var<storage, read> freqs: array<f32>;
@group(0) @binding(8) var<storage, read> toks: array<vec2<u32>>;
@group(0) @binding(9) var<storage, read> pages: array<u32>;

// Positions per KV page (kv.rs PAGE_POSITIONS).
const PAGE: u32 = 32u;

fn pack_f16(a: f32, b: f32) -> u32 {
    return f16_bits(a) | (f16_bits(b) << 16u);
}

// (cos θ, sin θ) with Cody–Waite reduction by π/2 (see the header).
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
fn theta_of(pos: u32, i: u32) -> f32 {
    var theta = f32(pos);
    for (var j = 0u; j < i; j++) {
        theta *= p.theta_scale;
    }
    if (p.has_freqs == 1u) {
        return div_rn(theta, freqs[i]);
    }
    return theta;
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
        v_cache[crow + e / 2u] = pack_f16(v[src], v[src + 1u]);
        return;
    }
    let is_q = head < p.n_head;
    var base: u32;
    if (is_q) {
        base = t * p.n_head * p.head_dim + head * p.head_dim;
    } else {
        base = t * kv_dim + (head - p.n_head) * p.head_dim;
    }
    let half = p.n_rot / 2u;
    if (p.mode == 1u && j < half) {
        // NORM: the pair (2j, 2j + 1) is this thread's word.
        var x: vec2<f32>;
        if (is_q) {
            x = vec2<f32>(q[base + 2u * j], q[base + 2u * j + 1u]);
        } else {
            x = vec2<f32>(k[base + 2u * j], k[base + 2u * j + 1u]);
        }
        let cs = cos_sin(theta_of(pos, j));
        let y = vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
        if (is_q) {
            q[base + 2u * j] = y.x;
            q[base + 2u * j + 1u] = y.y;
        } else {
            k_cache[crow + (head - p.n_head) * hw + j] = pack_f16(y.x, y.y);
        }
        return;
    }
    var a: vec2<f32>;
    var b: vec2<f32>;
    var lo: u32;
    if (j < p.n_rot / 4u) {
        // Pairs (2j, 2j + half) and (2j + 1, 2j + 1 + half).
        lo = 2u * j;
        var x0: vec2<f32>;
        var x1: vec2<f32>;
        if (is_q) {
            x0 = vec2<f32>(q[base + lo], q[base + lo + 1u]);
            x1 = vec2<f32>(q[base + lo + half], q[base + lo + half + 1u]);
        } else {
            x0 = vec2<f32>(k[base + lo], k[base + lo + 1u]);
            x1 = vec2<f32>(k[base + lo + half], k[base + lo + half + 1u]);
        }
        let cs0 = cos_sin(theta_of(pos, lo));
        let cs1 = cos_sin(theta_of(pos, lo + 1u));
        let c = vec2<f32>(cs0.x, cs1.x);
        let s = vec2<f32>(cs0.y, cs1.y);
        a = x0 * c - x1 * s;
        b = x0 * s + x1 * c;
        if (is_q) {
            q[base + lo] = a.x;
            q[base + lo + 1u] = a.y;
            q[base + lo + half] = b.x;
            q[base + lo + half + 1u] = b.y;
            return;
        }
        let cbase = crow + (head - p.n_head) * hw;
        k_cache[cbase + lo / 2u] = pack_f16(a.x, a.y);
        k_cache[cbase + (lo + half) / 2u] = pack_f16(b.x, b.y);
        return;
    }
    if (j < half) {
        return;
    }
    // Unrotated dims 2j, 2j + 1: q stays as is; k is copied to the cache.
    if (!is_q) {
        let cbase = crow + (head - p.n_head) * hw;
        k_cache[cbase + j] = pack_f16(k[base + 2u * j], k[base + 2u * j + 1u]);
    }
}
