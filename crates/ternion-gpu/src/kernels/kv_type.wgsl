// kv_type.wgsl — the KV cache's element type (KvType), appended after preprocessing to the
// kernels that store or read the cache: rope_kv.wgsl, attention.wgsl, attention_fast.wgsl
// and window_attention.wgsl (attention_prompt.wgsl runs over F16 caches only: ops/paged.rs).
// The kernels address the cache in words of two adjacent elements of a row (element 2i
// first) and never see the element type otherwise: F16 packs a word into one u32 (element
// 2i in the low half), KV_F32 holds it as a vec2<f32> (twice the bytes, the same indices).
// No bindings, no entry points.
//
// Numerics (backend/cpu/attention.rs): over an F16 cache the queries, and the probabilities
// of a decode row, are rounded to F16 (`kv_round`); over an F32 cache nothing is rounded, as
// ggml keeps Q and the probabilities in f32 against F32 keys and values.

#if KV_F32
// One word: two elements.
alias KvWord = vec2<f32>;
// A key word and a value word.
alias KvWord2 = array<vec2<f32>, 2>;
// Four consecutive words (attention_fast.wgsl's 16-byte F16 key loads).
alias KvWord4 = array<vec2<f32>, 4>;

// Elements a (first) and b as a word.
fn kv_pack(a: f32, b: f32) -> KvWord {
    return vec2<f32>(a, b);
}

// The two elements of a word.
fn kv_unpack(w: KvWord) -> vec2<f32> {
    return w;
}

// x as the attention sees a query or a decode probability against this cache.
fn kv_round(x: f32) -> f32 {
    return x;
}
#else
alias KvWord = u32;
alias KvWord2 = vec2<u32>;
alias KvWord4 = vec4<u32>;

// The bits of two f32 rounded to F16 (round to nearest even), element a in the low half.
fn kv_pack(a: f32, b: f32) -> KvWord {
    return f16_bits(a) | (f16_bits(b) << 16u);
}

fn kv_unpack(w: KvWord) -> vec2<f32> {
    return unpack2x16float(w);
}

fn kv_round(x: f32) -> f32 {
    return round_f16(x);
}
#endif
