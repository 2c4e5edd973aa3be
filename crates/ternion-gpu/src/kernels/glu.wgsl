// glu.wgsl — the gated feed-forward product: gate = act(gate) · up, elementwise, in place.
//   ACT 0: ReLU², (relu(g)·relu(g))·u  (BitNet b1.58, `bitnet-b1.58`)
//   ACT 1: SiLU,  (g / (1 + exp(−g)))·u (1bitLLM BitNet, `bitnet`)
//   ACT 2: GELU,  gelu_tanh(g)·u (Gemma 3's GEGLU), as rowops.wgsl's `gelu`: F16-rounded
//          input and result, 0 at or below −10 and g at or above 10
//
// Bindings (group 0):
//   0 uniform Params { n, _, _, _ }: elements per token (n_ff)
//   1 storage rw    gate: array<f32>   T × n
//   2 storage read  up:   array<f32>   T × n
// Dispatch: (ceil(n / 256), T, 1), a thread per element.
// Numerics: ReLU² is exact (the same f32 operations as the CPU); SiLU differs by the GPU's
// exp (a few ulp); GELU is within one F16 ulp of the CPU's ggml table (rowops.wgsl).

override ACT: u32 = 0u;

struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= p.n) {
        return;
    }
    let i = gid.y * p.n + gid.x;
    let g = gate[i];
    if (ACT == 2u) {
        gate[i] = gelu_ggml(g) * up[i];
    } else {
        gate[i] = gated(g, up[i], ACT);
    }
}
