//! The key/value cache: per layer, one F16 row of keys and one of values per position.
//!
//! Memory is reserved for the whole context up front but the OS commits pages only as
//! positions are written, so resident memory grows with the tokens actually seen.

use half::f16;

use crate::{Error, Result};

/// Keys and values of every layer for the positions processed so far.
pub struct KvCache {
    /// F16 bit patterns; stored as `u16` so the zeroed allocation is lazily committed.
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
    kv_dim: usize,
    n_ctx: usize,
    len: usize,
}

impl KvCache {
    /// A cache for `n_layer` layers of `kv_dim` values per position, `n_ctx` positions.
    pub fn new(n_layer: usize, kv_dim: usize, n_ctx: usize) -> KvCache {
        let plane = || vec![0u16; n_ctx * kv_dim];
        KvCache {
            k: (0..n_layer).map(|_| plane()).collect(),
            v: (0..n_layer).map(|_| plane()).collect(),
            kv_dim,
            n_ctx,
            len: 0,
        }
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets every position after the first `len` (to rewind a conversation).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Checks that `n` more positions fit.
    pub fn check_room(&self, n: usize) -> Result<()> {
        if self.len + n > self.n_ctx {
            return Err(Error::Request(format!(
                "context full: {} positions used + {n} new > context size {}",
                self.len, self.n_ctx
            )));
        }
        Ok(())
    }

    /// Stores keys and values (`n × kv_dim` each, rounded to F16) for the `n` positions
    /// that follow the filled ones, in layer `layer`. Call [`KvCache::advance`] after the
    /// last layer.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let start = self.len * self.kv_dim;
        for (dst, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
            for (d, &s) in dst[start..start + src.len()].iter_mut().zip(src) {
                *d = f16::from_f32(s).to_bits();
            }
        }
    }

    /// Marks `n` more positions as filled.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of `layer` for the first `n` positions.
    pub fn layer(&self, layer: usize, n: usize) -> (&[f16], &[f16]) {
        let e = n * self.kv_dim;
        (
            bytemuck::cast_slice(&self.k[layer][..e]),
            bytemuck::cast_slice(&self.v[layer][..e]),
        )
    }
}
