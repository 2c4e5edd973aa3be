//! The AVX-512 VNNI kernels of the repacked ternary, Q8_0 and Q4_0 weights behind a
//! capability token: a [`Vnni`] exists only where [`Level::detect`] chose
//! [`Level::Avx512`], so its methods are safe to call.
//!
//! They read weights in the 16-row interleaved layout of docs/FORMATS.md ("CPU ternary
//! layout"): a group of [`GROUP_ROWS`] rows is a run of [`Chunk`]s; for the 2-bit codes,
//! chunk c holds elements 16c..16c+16 of the 16 rows, and its byte 4r + i holds the codes
//! (t + 1, 0..=3) of row r at elements 16c + 4s + i in bits 2s..2s+1 (s = 0..3); the other
//! layouts are [`Codes`]. The prompt's activations come in token tiles
//! ([`interleave_tokens`]).

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::{avx2_tile, avx512, avx512_bits, avx512_q8, Level};
use crate::quant::GgmlType;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 16;
/// Elements of each row held by one chunk.
pub const CHUNK_ELEMS: usize = 16;
/// Elements per block of the per-block-scaled formats (TQ2_0, TQ1_0: Q8_K blocks).
pub const SCALE_BLOCK: usize = 256;

/// 64 bytes of codes: 16 elements of each of 16 rows (aligned to a cache line).
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Chunk(pub [u8; 64]);

/// Token rows of Q8_K activations: `q` (rows of the product's width), per token and block
/// the scale `d` and Σq `bsum` (token-major).
#[derive(Clone, Copy)]
pub struct Q8kRows<'a> {
    /// Int8 values (laid out by [`interleave_tokens`]).
    pub q: &'a [i8],
    /// Block scales (laid out by [`interleave_blocks`]).
    pub d: &'a [f32],
    /// Block sums of `q` (laid out by [`interleave_blocks`]).
    pub bsum: &'a [i32],
}

/// How a group's chunks hold the codes of its 16 rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codes {
    /// 2-bit codes, [`CHUNK_ELEMS`] elements of each row per chunk (the layout above).
    TwoBit,
    /// One bit per weight (set: code 2, i.e. +1; clear: code 0, −1), 32 elements of each
    /// row per chunk: bit 4r + i of 64-bit word 4h + s of chunk c is row r's element
    /// 32c + 16h + 4s + i (Q1_0).
    OneBit,
    /// One byte per weight (Q8_0: its value + 128), 4 elements of each row per chunk:
    /// byte 4r + i of chunk c is row r's element 4c + i.
    Bytes,
    /// One nibble per weight (Q4_0: its value + 8), 8 elements of each row per chunk: the
    /// low nibble of byte 4r + i of chunk c is row r's element 8c + i, the high one
    /// element 8c + 4 + i.
    Nibbles,
}

impl Codes {
    /// Elements of each row per chunk.
    pub const fn chunk_elems(self) -> usize {
        match self {
            Codes::TwoBit => CHUNK_ELEMS,
            Codes::OneBit => 32,
            Codes::Bytes => 4,
            Codes::Nibbles => 8,
        }
    }

    /// Largest token tile of [`Vnni::q8_0_dots`] with these codes, and so the tiling of the
    /// Q8_0 activations it reads: [`SUB_TILE`], but [`TOKEN_TILE`] for nibbles (unpacked
    /// once for more tokens: 10 % faster than 8).
    pub const fn token_tile(self) -> usize {
        match self {
            Codes::Nibbles => TOKEN_TILE,
            _ => SUB_TILE,
        }
    }
}

/// Token rows of Q8_0 activations for the Q1_0 / Q2_0 products: `q` (rows of the
/// product's width), per token and 32-element block the scale `d` and Σq `sum`
/// (token-major).
#[derive(Clone, Copy)]
pub struct Q80Rows<'a> {
    /// Int8 values in element order.
    pub q: &'a [i8],
    /// Block scales (for the AVX-512 prompt kernels laid out by [`interleave_blocks`]).
    pub d: &'a [f32],
    /// Block sums of `q` (likewise).
    pub sum: &'a [i32],
}

/// Where the products of one group go: for each of `rows` token rows, `cols` (≤ 16)
/// consecutive floats, `stride` floats after the previous row's (the group's columns of a
/// row-major output, or a tile of 16 columns). The kernels store into it directly.
// Off x86-64 no kernel exists to read the fields.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct OutCols<'a> {
    ptr: *mut f32,
    stride: usize,
    rows: usize,
    cols: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> OutCols<'a> {
    /// A tile: token row t is `tile[t]`, all 16 columns.
    pub fn tile(tile: &'a mut [[f32; 16]]) -> OutCols<'a> {
        OutCols {
            ptr: tile.as_mut_ptr().cast(),
            stride: 16,
            rows: tile.len(),
            cols: 16,
            _out: std::marker::PhantomData,
        }
    }

    /// Columns `ptr[t·stride .. t·stride + cols]` of rows t < `rows`.
    ///
    /// # Safety
    /// Those floats must be valid for writes for `'a`, and nothing else may read or write
    /// them meanwhile.
    ///
    /// # Panics
    /// If `cols` is over 16.
    pub unsafe fn new(ptr: *mut f32, stride: usize, rows: usize, cols: usize) -> OutCols<'a> {
        assert!(cols <= 16, "OutCols: at most 16 columns");
        OutCols {
            ptr,
            stride,
            rows,
            cols,
            _out: std::marker::PhantomData,
        }
    }

    /// Token rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The kernels' view of rows `t0..`: their first column, the stride and the mask of
    /// the columns written.
    #[cfg(target_arch = "x86_64")]
    fn dst(&self, t0: usize) -> avx512::Dst {
        avx512::Dst {
            // In bounds: t0 < rows (callers), so the row exists.
            ptr: self.ptr.wrapping_add(t0 * self.stride),
            stride: self.stride,
            mask: ((1u32 << self.cols) - 1) as u16,
        }
    }
}

/// Proof that the CPU has AVX-512 F, BW and VNNI and that they were chosen.
#[derive(Clone, Copy, Debug)]
pub struct Vnni(Features);

/// Proof that the AVX2 kernels were chosen ([`Level::Avx2`]: AVX2, FMA and F16C), and
/// the [`Dot`] this CPU runs them with.
// Off x86-64 no kernel reads the dot (the token cannot exist there).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub struct Avx2(Features, Dot);

/// How the AVX2 kernels multiply a code plane by four broadcast activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dot {
    /// `vpmaddubsw` into 16-bit sums, widened every `RUN_CHUNKS` chunks (plain AVX2).
    Maddubs,
    /// AVX-VNNI's `vpdpbusd` on 256-bit vectors: four products added into a 32-bit lane
    /// by one instruction (Intel from Alder Lake, AMD from Zen 5, without AVX-512).
    AvxVnni,
    /// The same instruction in its AVX-512 VL encoding, on a CPU with AVX-512 VNNI whose
    /// AVX2 level was asked for (`TERNION_SIMD=avxvnni`): the AVX-VNNI kernel measured and
    /// tested where AVX-VNNI itself is missing.
    Evex,
}

/// The kernels that read the interleaved layout on this CPU: the AVX-512 VNNI ones (every
/// format of [`Codes`]), or where only AVX2 runs, the AVX2 ones of the 2-bit codes (I2_S
/// against per-token activations, TQ2_0 / TQ1_0 against Q8_K ones, Q2_0 against Q8_0
/// ones; the other formats keep their row kernels there).
#[derive(Clone, Copy, Debug)]
pub enum Tiles {
    /// AVX-512 F/BW/VNNI.
    Vnni(Vnni),
    /// AVX2, the 2-bit I2_S, TQ2_0, TQ1_0 and Q2_0 only.
    Avx2(Avx2),
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
struct Features;

/// No AVX-512 off x86-64: the token cannot exist.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy, Debug)]
enum Features {}

/// Largest token tile of [`Tiles::per_token_dots`] and [`Tiles::block_dots`] (accumulators
/// held in registers; for the block dots' float sums, touched once per 256-element block,
/// 16 measured ~5 % faster than 8, and no slower since the broadcasts were made
/// unindexed).
pub const TOKEN_TILE: usize = 16;

/// Largest token tile of the AVX2 `vpmaddubsw` kernels (all three products): each run of
/// chunks is unpacked once for the tile's passes of four tokens, so 32 tokens halve that
/// work against 16 (I2_S prompts 4–8 % faster). The `vpdpbusd` ones unpack in every pass
/// and keep [`TOKEN_TILE`].
pub const AVX2_TOKEN_TILE: usize = 32;

/// Largest token tile of [`Vnni::q8_0_dots`] (1- and 2-bit codes: three accumulators per
/// token, integer, block and row sums, all in registers; bytes: 16 measured 2–4 % slower).
pub const SUB_TILE: usize = 8;

/// The largest power of two ≤ `n`, capped at `cap`.
fn tile(n: usize, cap: usize) -> usize {
    let mut t = cap;
    while t > n {
        t /= 2;
    }
    t
}

/// The token tiles `(first, len)` that the prompt kernels take `n` tokens in, as
/// [`interleave_tokens`] lays them out: runs of `cap` ([`Tiles::token_tile`] for
/// [`Tiles::per_token_dots`] and [`Tiles::block_dots`], [`SUB_TILE`] for
/// [`Vnni::q8_0_dots`]) from token 0, each split into tiles of the largest power of
/// two left.
fn token_tiles(n: usize, cap: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut t0 = 0;
    std::iter::from_fn(move || {
        let step_end = (t0 / cap + 1) * cap;
        let tn = tile(n.min(step_end) - t0, cap);
        (t0 < n).then(|| {
            let first = t0;
            t0 += tn;
            (first, tn)
        })
    })
}

/// Per-token values of each block (`n` token rows of `nb`, row-major: Q8_K scales or block
/// sums) laid out as the prompt kernels read them beside [`interleave_tokens`]: each tile
/// of `tn` tokens from `token_tiles` (runs of `cap`) keeps its place (`first · nb` values
/// in) and holds, block by block, the value of each of its tokens in turn (value
/// `first · nb + b·tn + t` = token first + t, block b). A tile of one token is its row
/// unchanged.
///
/// # Panics
/// If the lengths disagree.
pub fn interleave_blocks<T: Copy>(v: &[T], nb: usize, cap: usize, out: &mut [T]) {
    assert_eq!(v.len(), out.len(), "interleave_blocks: lengths");
    let n = v.len().checked_div(nb).unwrap_or(0);
    for (first, tn) in token_tiles(n, cap) {
        let (src, dst) = (
            &v[first * nb..(first + tn) * nb],
            &mut out[first * nb..(first + tn) * nb],
        );
        for (b, values) in dst.chunks_exact_mut(tn).enumerate() {
            for (t, value) in values.iter_mut().enumerate() {
                *value = src[t * nb + b];
            }
        }
    }
}

/// Token rows of int8 activations (`n` rows of `k`, row-major) laid out as the prompt
/// kernels read them: each tile of `tn` tokens from `token_tiles` (runs of `cap`) keeps
/// its place (`first · k` bytes in) and holds, for every 16 elements u of the row in
/// order, the 16 bytes of each of its tokens in turn (byte `(u·tn + t)·16 + j` = token
/// first + t, element 16u + j). A tile of one token is its row unchanged. Every broadcast
/// of the kernels then addresses a fixed offset from one pointer.
///
/// # Panics
/// If `k` is not a multiple of 16 or the lengths disagree.
pub fn interleave_tokens(q: &[i8], k: usize, cap: usize, out: &mut [i8]) {
    assert!(k.is_multiple_of(CHUNK_ELEMS), "interleave_tokens: width");
    assert_eq!(q.len(), out.len(), "interleave_tokens: lengths");
    let n = q.len().checked_div(k).unwrap_or(0);
    for (first, tn) in token_tiles(n, cap) {
        let (src, dst) = (
            &q[first * k..(first + tn) * k],
            &mut out[first * k..(first + tn) * k],
        );
        for (u, units) in dst.chunks_exact_mut(CHUNK_ELEMS * tn).enumerate() {
            for (t, unit) in units.chunks_exact_mut(CHUNK_ELEMS).enumerate() {
                let at = t * k + u * CHUNK_ELEMS;
                unit.copy_from_slice(&src[at..at + CHUNK_ELEMS]);
            }
        }
    }
}

impl Dot {
    /// The dot step of this CPU's AVX2 kernels: AVX-VNNI where it has it, unless
    /// `TERNION_SIMD=avx2` asks for plain AVX2; under `TERNION_SIMD=avxvnni` on a CPU
    /// with AVX-512 VNNI and VL but no AVX-VNNI, [`Dot::Evex`].
    #[cfg(target_arch = "x86_64")]
    fn detect() -> Dot {
        static DOT: std::sync::OnceLock<Dot> = std::sync::OnceLock::new();
        *DOT.get_or_init(|| {
            let cap = super::simd_cap();
            if cap == "avx2" {
                Dot::Maddubs
            } else if is_x86_feature_detected!("avxvnni") {
                Dot::AvxVnni
            } else if cap == "avxvnni"
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                Dot::Evex
            } else {
                Dot::Maddubs
            }
        })
    }
}

impl Tiles {
    /// The kernels of the level [`Level::detect`] chose, if it has any.
    pub fn get() -> Option<Tiles> {
        #[cfg(target_arch = "x86_64")]
        if Level::detect() == Level::Avx2 {
            return Some(Tiles::Avx2(Avx2(Features, Dot::detect())));
        }
        Vnni::get().map(Tiles::Vnni)
    }

    /// The AVX2 kernels with every [`Dot`] this CPU runs, wherever it has AVX2, FMA and
    /// F16C, whatever level was chosen (so that tests compare them with the others on an
    /// AVX-512 machine).
    #[cfg(test)]
    pub(crate) fn avx2_present() -> Vec<Tiles> {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            let vl = is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("avx512vnni");
            return [
                (Dot::Maddubs, true),
                (Dot::AvxVnni, is_x86_feature_detected!("avxvnni")),
                (Dot::Evex, vl),
            ]
            .into_iter()
            .filter(|&(_, runs)| runs)
            .map(|(dot, _)| Tiles::Avx2(Avx2(Features, dot)))
            .collect();
        }
        Vec::new()
    }

    /// A short name for reports: `avx512-vnni`, `avx2`, `avx-vnni`, or `avx-vnni-evex` (its
    /// AVX-512 VL encoding, [`Dot::Evex`]).
    pub fn name(self) -> &'static str {
        match self {
            Tiles::Vnni(_) => "avx512-vnni",
            Tiles::Avx2(Avx2(_, Dot::Maddubs)) => "avx2",
            Tiles::Avx2(Avx2(_, Dot::AvxVnni)) => "avx-vnni",
            Tiles::Avx2(Avx2(_, Dot::Evex)) => "avx-vnni-evex",
        }
    }

    /// The largest token tile of [`Tiles::per_token_dots`] and [`Tiles::block_dots`], and
    /// so the tiling of the activations they read ([`interleave_tokens`],
    /// [`interleave_blocks`]): [`AVX2_TOKEN_TILE`] for the AVX2 `vpmaddubsw` kernels,
    /// else [`TOKEN_TILE`].
    pub fn token_tile(self) -> usize {
        match self {
            Tiles::Avx2(Avx2(_, Dot::Maddubs)) => AVX2_TOKEN_TILE,
            _ => TOKEN_TILE,
        }
    }

    /// The largest token tile of [`Tiles::q8_0_dots`] with `codes`, and so the tiling of
    /// the Q8_0 activations it reads: [`AVX2_TOKEN_TILE`] for the AVX2 kernels (always
    /// `vpmaddubsw` there), else the codes' [`Codes::token_tile`].
    pub fn q8_0_token_tile(self, codes: Codes) -> usize {
        match self {
            Tiles::Avx2(_) => AVX2_TOKEN_TILE,
            Tiles::Vnni(_) => codes.token_tile(),
        }
    }

    /// Whether these kernels read weights of type `ty` (the AVX2 ones: the 2-bit I2_S,
    /// TQ2_0, TQ1_0 and Q2_0 only).
    pub fn take(self, ty: GgmlType) -> bool {
        match self {
            Tiles::Vnni(_) => true,
            Tiles::Avx2(_) => matches!(
                ty,
                GgmlType::I2_S | GgmlType::TQ2_0 | GgmlType::TQ1_0 | GgmlType::Q2_0
            ),
        }
    }

    /// I2_S products of the 16 rows of `group` with the token rows q_t of `q` (one per
    /// row of `out`, each `16 · group.len()` values, laid out by [`interleave_tokens`] in
    /// tiles of [`Tiles::token_tile`]; `sum[t]` = Σq_t, `scale[t]` their per-token scale):
    /// `out[t][r] = ((Σ_e (code(r, e) − 1)·q_t[e]) as f32 / scale[t]) · post`, with the
    /// exact integer sum, whichever the kernels.
    ///
    /// # Panics
    /// If `q`, `sum` or `scale` do not hold `out.rows()` tokens of the group's width.
    // Off x86-64 no token can exist: the body ends at the empty matches.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub fn per_token_dots(
        self,
        group: &[Chunk],
        q: &[i8],
        sum: &[i32],
        scale: &[f32],
        post: f32,
        out: OutCols<'_>,
    ) {
        let k = group.len() * CHUNK_ELEMS;
        let n = out.rows();
        assert_eq!(q.len(), n * k, "per_token_dots: activations length");
        assert_eq!(sum.len(), n, "per_token_dots: token sums");
        assert_eq!(scale.len(), n, "per_token_dots: token scales");
        #[cfg(not(target_arch = "x86_64"))]
        match self {
            Tiles::Vnni(v) => match v.0 {},
            Tiles::Avx2(a) => match a.0 {},
        }
        #[cfg(target_arch = "x86_64")]
        {
            let (w, nc) = (group.as_ptr(), group.len());
            for (t0, tn) in token_tiles(n, self.token_tile()) {
                let qt = q[t0 * k..].as_ptr();
                let dot = match self {
                    Tiles::Vnni(_) => {
                        let (st, ct) = (sum[t0..].as_ptr(), scale[t0..].as_ptr());
                        let o = out.dst(t0);
                        // SAFETY: the token proves the features; `q`, `sum`, `scale` and `out`
                        // hold `n` tokens (asserted; `out` by its construction) and tokens
                        // t0..t0+tn are among them.
                        unsafe {
                            match tn {
                                16 => avx512::per_token_dots::<16>(w, nc, qt, st, ct, post, o),
                                8 => avx512::per_token_dots::<8>(w, nc, qt, st, ct, post, o),
                                4 => avx512::per_token_dots::<4>(w, nc, qt, st, ct, post, o),
                                2 => avx512::per_token_dots::<2>(w, nc, qt, st, ct, post, o),
                                _ => avx512::per_token_dot1(w, nc, qt, *st, *ct, post, o),
                            }
                        }
                        continue;
                    }
                    Tiles::Avx2(Avx2(_, dot)) => dot,
                };
                let (st, ct) = (sum[t0..].as_ptr(), scale[t0..].as_ptr());
                let o = out.dst(t0);
                // SAFETY: the token proves AVX2 and its dot's extension (chosen where
                // detected); `q`, `sum`, `scale` and `out` hold `n` tokens (asserted; `out`
                // by its construction), tokens t0..t0+tn among them, and tn ≤ the token tile.
                unsafe {
                    use avx2_tile::per_token_dots as f;
                    match tn {
                        32 => f::<4, 32>(dot, w, nc, qt, st, ct, post, &o),
                        16 => f::<4, 16>(dot, w, nc, qt, st, ct, post, &o),
                        8 => f::<4, 8>(dot, w, nc, qt, st, ct, post, &o),
                        4 => f::<4, 4>(dot, w, nc, qt, st, ct, post, &o),
                        2 => f::<2, 2>(dot, w, nc, qt, st, ct, post, &o),
                        1 => f::<1, 1>(dot, w, nc, qt, st, ct, post, &o),
                        _ => unreachable!("token tiles are powers of two up to the token tile"),
                    }
                }
            }
        }
    }

    /// `out[t][r] = Σ_b ((Σ_{e∈b} code(r, e)·q_t[e]) − bsum[t][b]) · (d[t][b] · scales[b][r])`
    /// over the 256-element blocks b in order: the TQ2_0 / TQ1_0 dot against the Q8_K
    /// activations `x` (one token per row of `out`, `x.q` laid out by
    /// [`interleave_tokens`] and `x.d`, `x.bsum` by [`interleave_blocks`], in tiles of
    /// [`Tiles::token_tile`]; `scales`: the group's weight scales, block-major, 16 per block),
    /// times `post`, whichever the kernels.
    ///
    /// # Panics
    /// If the lengths do not agree with the group's width and `out.rows()` tokens.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub fn block_dots(
        self,
        group: &[Chunk],
        scales: &[f16],
        x: Q8kRows<'_>,
        post: f32,
        out: OutCols<'_>,
    ) {
        let Q8kRows { q, d, bsum } = x;
        let k = group.len() * CHUNK_ELEMS;
        let nb = k / SCALE_BLOCK;
        let n = out.rows();
        assert_eq!(k, nb * SCALE_BLOCK, "block_dots: width of whole blocks");
        assert_eq!(scales.len(), nb * GROUP_ROWS, "block_dots: weight scales");
        assert_eq!(q.len(), n * k, "block_dots: activations length");
        assert_eq!(d.len(), n * nb, "block_dots: activation scales");
        assert_eq!(bsum.len(), n * nb, "block_dots: block sums");
        #[cfg(not(target_arch = "x86_64"))]
        match self {
            Tiles::Vnni(v) => match v.0 {},
            Tiles::Avx2(a) => match a.0 {},
        }
        #[cfg(target_arch = "x86_64")]
        {
            let (w, s) = (group.as_ptr(), scales.as_ptr());
            for (t0, tn) in token_tiles(n, self.token_tile()) {
                let qt = q[t0 * k..].as_ptr();
                let (dt, bt) = (d[t0 * nb..].as_ptr(), bsum[t0 * nb..].as_ptr());
                let dot = match self {
                    Tiles::Vnni(_) => {
                        let o = out.dst(t0);
                        // SAFETY: the token proves the features; every length was asserted
                        // above (`out`'s by its construction) and tokens t0..t0+tn are among
                        // the `n` rows.
                        unsafe {
                            match tn {
                                16 => avx512::block_dots::<16>(w, s, nb, qt, dt, bt, post, o),
                                8 => avx512::block_dots::<8>(w, s, nb, qt, dt, bt, post, o),
                                4 => avx512::block_dots::<4>(w, s, nb, qt, dt, bt, post, o),
                                2 => avx512::block_dots::<2>(w, s, nb, qt, dt, bt, post, o),
                                _ => avx512::block_dot1(w, s, nb, qt, dt, bt, post, o),
                            }
                        }
                        continue;
                    }
                    Tiles::Avx2(Avx2(_, dot)) => dot,
                };
                let o = out.dst(t0);
                // SAFETY: the token proves AVX2, F16C and its dot's extension; every length
                // was asserted above (`out`'s by its construction), tokens t0..t0+tn are
                // among the `n` rows, and tn ≤ the token tile.
                unsafe {
                    use avx2_tile::block_dots as f;
                    match tn {
                        32 => f::<4, 32>(dot, w, s, nb, qt, (dt, bt), post, &o),
                        16 => f::<4, 16>(dot, w, s, nb, qt, (dt, bt), post, &o),
                        8 => f::<4, 8>(dot, w, s, nb, qt, (dt, bt), post, &o),
                        4 => f::<4, 4>(dot, w, s, nb, qt, (dt, bt), post, &o),
                        2 => f::<2, 2>(dot, w, s, nb, qt, (dt, bt), post, &o),
                        1 => f::<1, 1>(dot, w, s, nb, qt, (dt, bt), post, &o),
                        _ => unreachable!("token tiles are powers of two up to the token tile"),
                    }
                }
            }
        }
    }

    /// The dots of the group's rows against the Q8_0 activations `x` (one token per row of
    /// `out`, `x.q` laid out by [`interleave_tokens`] and `x.d`, `x.sum` by
    /// [`interleave_blocks`] in runs of the codes' [`Codes::token_tile`]; `shape`: how the chunks hold the codes and the weight blocks'
    /// elements; `scales`: the group's weight scales, block-major, 16 per block), each
    /// integer sum exact, in the reference dots' float orders:
    /// - Q1_0 / Q2_0 (1- and 2-bit codes): `out[t][r] = (Σ_b scales[b][r] · (Σ_{k∈b} d[t][k]
    ///   · f32(Σ_{e∈k} code(r, e)·q_t[e] − sum[t][k]))) · post` over the weight blocks b in
    ///   order and their 32-element sub-blocks k in order (each inner sum from 0);
    /// - Q8_0 (bytes) `y += f32(Σ w·q) · (scale · d)`, Q4_0 (nibbles)
    ///   `y += (f32(Σ w·q) · scale) · d` over the 32-element blocks in order (w: the weight
    ///   values), as ggml's generic `vec_dot_q8_0_q8_0` / `vec_dot_q4_0_q8_0`;
    ///   `out[t][r] = y · post`.
    ///
    /// # Panics
    /// If the weight blocks are not whole 32-element sub-blocks of the group's width (32
    /// for bytes and nibbles) or the lengths do not agree with it and `out.rows()` tokens.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub fn q8_0_dots(
        self,
        group: &[Chunk],
        shape: (Codes, usize),
        scales: &[f16],
        x: Q80Rows<'_>,
        post: f32,
        out: OutCols<'_>,
    ) {
        let Q80Rows { q, d, sum, .. } = x;
        let (codes, block_elems) = shape;
        let k = group.len() * codes.chunk_elems();
        let whole = matches!(codes, Codes::TwoBit | Codes::OneBit) || block_elems == 32;
        assert!(
            whole
                && block_elems > 0
                && block_elems.is_multiple_of(32)
                && k.is_multiple_of(block_elems),
            "q8_0_dots: width of whole blocks"
        );
        let (nb, ns, n) = (k / block_elems, k / 32, out.rows());
        assert_eq!(scales.len(), nb * GROUP_ROWS, "q8_0_dots: weight scales");
        assert_eq!(q.len(), n * k, "q8_0_dots: activations length");
        assert_eq!(d.len(), n * ns, "q8_0_dots: activation scales");
        assert_eq!(sum.len(), n * ns, "q8_0_dots: block sums");
        #[cfg(not(target_arch = "x86_64"))]
        match self {
            Tiles::Vnni(v) => match v.0 {},
            Tiles::Avx2(a) => match a.0 {},
        }
        #[cfg(target_arch = "x86_64")]
        {
            let w = avx512_bits::Shape {
                w: group.as_ptr(),
                scales: scales.as_ptr(),
                n_blocks: nb,
                subs: block_elems / 32,
            };
            for (t0, tn) in token_tiles(n, self.q8_0_token_tile(codes)) {
                let qt = q[t0 * k..].as_ptr();
                let (dt, st) = (d[t0 * ns..].as_ptr(), sum[t0 * ns..].as_ptr());
                match self {
                    Tiles::Vnni(_) => {
                        let o = out.dst(t0);
                        // SAFETY: the token proves the features; every length was asserted above
                        // (`out`'s by its construction) and tokens t0..t0+tn are among the `n` rows.
                        unsafe {
                            use avx512_bits::sub_block_dots as f;
                            use avx512_q8::block32_dots as g;
                            use Codes::{Bytes, Nibbles, OneBit, TwoBit};
                            let (ws, nb) = (w.scales, w.n_blocks);
                            match (tn, codes) {
                                (8, TwoBit) => f::<8, 2>(w, qt, dt, st, post, o),
                                (4, TwoBit) => f::<4, 2>(w, qt, dt, st, post, o),
                                (2, TwoBit) => f::<2, 2>(w, qt, dt, st, post, o),
                                (_, TwoBit) => f::<1, 2>(w, qt, dt, st, post, o),
                                (8, OneBit) => f::<8, 1>(w, qt, dt, st, post, o),
                                (4, OneBit) => f::<4, 1>(w, qt, dt, st, post, o),
                                (2, OneBit) => f::<2, 1>(w, qt, dt, st, post, o),
                                (_, OneBit) => f::<1, 1>(w, qt, dt, st, post, o),
                                (8, Bytes) => g::<8, false>(w.w, ws, nb, qt, dt, st, post, o),
                                (4, Bytes) => g::<4, false>(w.w, ws, nb, qt, dt, st, post, o),
                                (2, Bytes) => g::<2, false>(w.w, ws, nb, qt, dt, st, post, o),
                                (_, Bytes) => g::<1, false>(w.w, ws, nb, qt, dt, st, post, o),
                                (16, Nibbles) => g::<16, true>(w.w, ws, nb, qt, dt, st, post, o),
                                (8, Nibbles) => g::<8, true>(w.w, ws, nb, qt, dt, st, post, o),
                                (4, Nibbles) => g::<4, true>(w.w, ws, nb, qt, dt, st, post, o),
                                (2, Nibbles) => g::<2, true>(w.w, ws, nb, qt, dt, st, post, o),
                                (_, Nibbles) => g::<1, true>(w.w, ws, nb, qt, dt, st, post, o),
                            }
                        }
                        continue;
                    }
                    Tiles::Avx2(_) => {}
                }
                // AVX2 takes 2-bit codes only (`take`).
                assert_eq!(codes, Codes::TwoBit, "q8_0_dots: AVX2 reads 2-bit codes");
                let o = out.dst(t0);
                let (ws, nbs) = (w.scales, (w.n_blocks, w.subs));
                // SAFETY: the token proves AVX2 and F16C; every length was asserted above
                // (`out`'s by its construction), tokens t0..t0+tn are among the `n` rows,
                // and tn ≤ the token tile.
                unsafe {
                    use avx2_tile::sub_block_dots as f;
                    match tn {
                        32 => f::<4, 32>(w.w, ws, nbs, qt, (dt, st), post, &o),
                        16 => f::<4, 16>(w.w, ws, nbs, qt, (dt, st), post, &o),
                        8 => f::<4, 8>(w.w, ws, nbs, qt, (dt, st), post, &o),
                        4 => f::<4, 4>(w.w, ws, nbs, qt, (dt, st), post, &o),
                        2 => f::<2, 2>(w.w, ws, nbs, qt, (dt, st), post, &o),
                        1 => f::<1, 1>(w.w, ws, nbs, qt, (dt, st), post, &o),
                        _ => unreachable!("token tiles are powers of two up to the token tile"),
                    }
                }
            }
        }
    }
}

impl Vnni {
    /// The token, when [`Level::detect`] chose the AVX-512 kernels.
    pub fn get() -> Option<Vnni> {
        #[cfg(target_arch = "x86_64")]
        if Level::detect() == Level::Avx512 {
            return Some(Vnni(Features));
        }
        None
    }
}
