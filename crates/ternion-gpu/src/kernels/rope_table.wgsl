// rope_table.wgsl — (cos θ, sin θ) of every rotation pair at every position a KV cache
// holds, filled once when a plan is built; rope_kv.wgsl and attention_fast.wgsl's fused
// decode read it (rope.wgsl `rope_cs`) instead of computing angles in every launch: the
// serial product chain of θ and the polynomials cost the single-token attention ~1 µs a
// layer (BENCHMARKS.md, session 17), and every reader gets the same bits.
//
// Bindings (group 0):
//   0 uniform TableParams { half, theta_scale, has_freqs, n_pos }: pairs per head (n_rot/2),
//                     base^(−2/n_rot) computed on the host in f32 as backend/cpu/rope.rs
//                     does, 1 when pair i's angle is divided by freqs[i], positions
//   1 storage read  freqs: array<f32>        half frequency divisors (Llama-3 rope_freqs;
//                                            any buffer when has_freqs = 0)
//   2 storage rw    tab:   array<vec2<f32>>  n_pos × half: (cos θ, sin θ) of pair i at
//                                            position pos in element pos·half + i
// Dispatch (ceil(half / 64), min(n_pos, 65535), 1): thread (i, y) fills pair i of
// positions y, y + 65535·…, one position a grid row at a time.
//
// Numerics:
// - θ of pair i is f32(pos) multiplied i times by theta_scale, in f32 (correctly rounded
//   products, as on the CPU), and the division by freqs[i] is correctly rounded (div_rn,
//   common.wgsl), so the angles are bit-identical to the reference.
// - cos/sin do not use the builtins (WGSL only promises 2^-11 absolute error on [−π, π] and
//   nothing beyond): θ is reduced by π/2 with a three-part Cody–Waite constant (cephes
//   sinf's, accurate for θ < 8192, i.e. positions below 8192; slowly worse beyond) and
//   evaluated with cephes' polynomials on [−π/4, π/4]: a few ulp from libm's cosf/sinf.

struct TableParams { half: u32, theta_scale: f32, has_freqs: u32, n_pos: u32 }

@group(0) @binding(0) var<uniform> p: TableParams;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(0) @binding(2) var<storage, read_write> tab: array<vec2<f32>>;

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
fn rope_theta(pos: u32, i: u32) -> f32 {
    var theta = f32(pos);
    for (var j = 0u; j < i; j++) {
        theta *= p.theta_scale;
    }
    if (p.has_freqs == 1u) {
        return div_rn(theta, freqs[i]);
    }
    return theta;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x;
    if (i >= p.half) {
        return;
    }
    for (var pos = gid.y; pos < p.n_pos; pos += nw.y) {
        tab[pos * p.half + i] = cos_sin(rope_theta(pos, i));
    }
}
