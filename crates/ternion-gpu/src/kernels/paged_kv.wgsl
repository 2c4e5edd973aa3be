// paged_kv.wgsl — declarations shared by the kernels over the paged F16 KV cache
// (appended to attention.wgsl, attention_fast.wgsl, attention_prompt.wgsl and
// window_attention.wgsl by the pipeline cache). No bindings, no entry points.

// Positions per KV page (kv.rs PAGE_POSITIONS).
const PAGE: u32 = 32u;
// A score below every real one (masked keys, empty maxima).
const NEG: f32 = -3.0e38;
// toks[t].y: the sequence slot, and this flag for a single-token step of its sequence
// that keeps the decode numerics inside a multi-token step (`decode_row`).
const DECODE_ROW: u32 = 0x80000000u;
const SLOT_MASK: u32 = 0x7fffffffu;

// The causal attention kernels' uniform (ops/attention.rs): heads, kv heads, head width,
// context capacity, 1/√head_dim, chunks of the decode split, page-table entries per slot.
struct AttnParams {
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_ctx: u32,
    scale: f32,
    max_chunks: u32,
    pps: u32,
    pad1: u32,
}
