// read_bw.wgsl — memory read-bandwidth probe for `ternion bench` (the GB/s a decode step
// is compared against). Every thread folds the 16-byte words it reads with XOR and writes
// the result only if it equals a constant no real data produces in practice, so the loads
// cannot be removed but nothing is written.
//
// Bindings (group 0):
//   0 storage read  src:  array<vec4<u32>>   the buffer read (as large as one binding allows)
//   1 storage rw    sink: array<u32>         one word per thread (almost never written)
// Dispatch: (G, 1, 1) workgroups of 256; thread i reads words i, i + 256·G, i + 512·G, ...
// so each sweep of the grid reads one contiguous block.

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let stride = nw.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i < arrayLength(&src); i += stride) {
        acc ^= src[i];
    }
    let r = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (r == 0x9e3779b9u) {
        sink[gid.x] = r;
    }
}
