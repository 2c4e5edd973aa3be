// embed.wgsl — token embedding gather: rows of the F16 embedding table → f32 hidden states.
//
// Bindings (group 0):
//   0 uniform Params { dim, row0, rows, _ }: row width (even), first table row of this shard,
//                                            rows in this shard
//   1 storage read  ids:   array<u32>        token ids, one per token
//   2 storage read  table: F16 rows of `dim` halves, this shard only (rows row0 .. row0+rows);
//                          read as vec2<f16> (variant F16) or as u32 pairs + unpack2x16float
//   3 storage rw    out:   array<vec2<f32>>  T × dim f32
// Dispatch: (ceil(dim/2 / 256), T, 1), once per shard of the table; a thread converts one
// pair of halves, and only threads whose token id falls in this shard write.
// Layout: the table is the GGUF tensor as stored (row-major, little-endian F16).
#if F16
enable f16;
#endif

struct Params { dim: u32, row0: u32, rows: u32, pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
#if F16
@group(0) @binding(2) var<storage, read> table: array<vec2<f16>>;
#else
@group(0) @binding(2) var<storage, read> table: array<u32>;
#endif
@group(0) @binding(3) var<storage, read_write> out: array<vec2<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    let half_dim = p.dim / 2u;
    if (i >= half_dim) {
        return;
    }
    let id = ids[t];
    if (id < p.row0 || id - p.row0 >= p.rows) {
        return;
    }
    let src = (id - p.row0) * half_dim + i;
#if F16
    let v = vec2<f32>(table[src]);
#else
    let v = unpack2x16float(table[src]);
#endif
    out[t * half_dim + i] = v;
}
