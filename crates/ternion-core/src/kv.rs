//! The paged key/value cache.
//!
//! Keys and values live in fixed-size pages of [`PAGE_POSITIONS`] positions taken from a
//! [`KvPool`] that all sequences of a model share. Each sequence holds a [`KvSeq`]: its page
//! table (the pages it owns, in position order) and its length. A sequence takes a page when
//! it crosses a page boundary and gives pages back the moment it is truncated below them or
//! dropped. The pool's capacity in pages bounds the memory of every cache together; a
//! sequence that needs a page when none is left gets [`Error::KvPoolExhausted`].
//!
//! Values are stored as F16 (the default) or F32 ([`KvType`]: the reference engine's KV
//! cache type when logits are compared tightly). Page layout, the same for every page of a
//! pool: for layer `l`, keys then values, each `kv_dim · page_size` values ordered by kv head,
//! then position slot, then element, so kv head `h`'s keys at slot `s` of layer `l` start at
//! `(2·l · kv_dim + h · head_dim) · page_size + s · head_dim` and its values `kv_dim ·
//! page_size` values later. One head's rows of a page are contiguous: attention reads each
//! head's keys and values as one stream. The GPU backend pages its caches too (same page
//! size, a page table per sequence: `ternion-gpu/src/seqs.rs`) but keeps one buffer per
//! layer, since a device binding is limited in size.
//!
//! A page is zero-filled when made, on transparent huge pages where the OS gives them
//! (`HugeBuf`, from slabs that only cache pages share): attention reads every page of a
//! sequence once a token, and through 4 KiB pages it took ~20 % longer at 512 positions
//! (BENCHMARKS.md, session 31). Freed pages stay in the pool and are reused before any
//! new one is made.
//!
//! [`KvSeq::fork`] starts a sequence that shares another's pages (a prompt evaluated once
//! for several choices). A shared page is copy-on-write: before a sequence writes into a
//! page another one holds too, [`KvSeq::reserve`] gives it a copy of its own. A page goes
//! back to the pool when its last holder lets it go; the pool counts it once while shared.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use half::{f16, slice::HalfFloatSliceExt};

use crate::backend::cpu::{HugeBuf, Lifetime};
use crate::{Error, Result};

/// Positions per page.
pub const PAGE_POSITIONS: usize = 32;

/// The element type of a KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// Half precision (keys and values rounded to F16 when stored).
    #[default]
    F16,
    /// Single precision (stored as computed).
    F32,
}

impl KvType {
    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    /// Parses `f16` or `f32`.
    pub fn parse(name: &str) -> Result<KvType> {
        match name {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            _ => Err(Error::unsupported(
                "KV cache type",
                name,
                ["f16", "f32"],
                "",
            )),
        }
    }
}

/// One stored row of keys or values, in the cache's element type.
#[derive(Clone, Copy, Debug)]
pub enum KvRow<'a> {
    /// An F16 row.
    F16(&'a [f16]),
    /// An F32 row.
    F32(&'a [f32]),
}

impl<'a> KvRow<'a> {
    /// Values in the row.
    pub(crate) fn len(self) -> usize {
        match self {
            KvRow::F16(r) => r.len(),
            KvRow::F32(r) => r.len(),
        }
    }

    /// Value `i` as f32.
    pub fn get(self, i: usize) -> f32 {
        match self {
            KvRow::F16(r) => r[i].to_f32(),
            KvRow::F32(r) => r[i],
        }
    }
}

/// The shape of every page of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    /// Layers with a cache.
    pub n_layer: usize,
    /// Key (and value) heads per position and layer.
    pub n_head_kv: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Positions per page.
    pub page_size: usize,
    /// Element type.
    pub ty: KvType,
}

impl KvGeometry {
    /// Key (and value) values per position and layer.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Values in one page.
    pub fn page_values(&self) -> usize {
        self.n_layer * 2 * self.page_size * self.kv_dim()
    }

    /// Where kv head `h`'s keys (`half` 0) or values (1) of layer `layer` start in a page,
    /// at slot 0 (slot `s` is `s · head_dim` values further).
    fn head_start(&self, layer: usize, half: usize, h: usize) -> usize {
        ((2 * layer + half) * self.kv_dim() + h * self.head_dim) * self.page_size
    }

    /// Bytes of one page.
    pub fn page_bytes(&self) -> usize {
        self.page_values() * self.ty.bytes()
    }

    /// Pages needed to hold `positions` positions.
    pub fn pages_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.page_size)
    }
}

/// One page: its id in the pool and its values (F16 or F32 bit patterns, in 32-bit words).
struct Page {
    id: u32,
    data: HugeBuf<u32>,
}

/// Pages made and not in use.
struct Free {
    pages: Vec<Page>,
    /// Pages made so far (ids `0..made`).
    made: usize,
}

/// Pages shared by the sequences of one model, at most `capacity` of them.
pub struct KvPool {
    geo: KvGeometry,
    capacity: usize,
    free: Mutex<Free>,
    in_use: AtomicUsize,
}

impl KvPool {
    /// A pool of at most `capacity` pages of shape `geo` (a page size of 0 counts as 1;
    /// the capacity is capped at `u32::MAX` pages). Nothing is allocated until a sequence
    /// needs a page.
    pub fn new(geo: KvGeometry, capacity: usize) -> Arc<KvPool> {
        let geo = KvGeometry {
            page_size: geo.page_size.max(1),
            ..geo
        };
        Arc::new(KvPool {
            geo,
            capacity: capacity.min(u32::MAX as usize),
            free: Mutex::new(Free {
                pages: Vec::new(),
                made: 0,
            }),
            in_use: AtomicUsize::new(0),
        })
    }

    /// A pool of pages shaped `geo` with room for `n_seq` sequences of `n_ctx` positions
    /// each.
    pub fn for_sequences(geo: KvGeometry, n_ctx: usize, n_seq: usize) -> Arc<KvPool> {
        KvPool::new(geo, geo.pages_for(n_ctx).saturating_mul(n_seq))
    }

    /// The shape of the pages.
    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    /// Most pages in use at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Pages held by sequences now.
    pub fn pages_in_use(&self) -> usize {
        self.in_use.load(Relaxed)
    }

    /// Pages allocated so far (in use or kept for reuse).
    pub fn pages_allocated(&self) -> usize {
        self.lock().made
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `n` pages (reused ones first), or none when fewer than `n` are left.
    fn take(&self, n: usize) -> Result<Vec<Page>> {
        let words = self
            .geo
            .n_layer
            .checked_mul(2 * self.geo.page_size)
            .and_then(|v| v.checked_mul(self.geo.kv_dim()))
            .and_then(|v| v.checked_mul(self.geo.ty.bytes()))
            .filter(|&b| b <= isize::MAX as usize)
            .map(|b| b / 4)
            .ok_or_else(|| Error::Request(format!("a KV page of {:?} is too large", self.geo)))?;
        let mut f = self.lock();
        let mut out = Vec::with_capacity(n);
        let used = self.in_use.load(Relaxed);
        if used + n > self.capacity {
            return Err(Error::KvPoolExhausted {
                need: n,
                free: self.capacity - used,
                capacity: self.capacity,
            });
        }
        for _ in 0..n {
            let page = match f.pages.pop() {
                Some(p) => p,
                None => {
                    f.made += 1;
                    Page {
                        id: (f.made - 1) as u32,
                        data: HugeBuf::filled_for(words, 0, Lifetime::Cache),
                    }
                }
            };
            out.push(page);
        }
        self.in_use.fetch_add(n, Relaxed);
        Ok(out)
    }

    /// Lets `pages` go: those no other sequence holds return to the pool.
    fn give_back(&self, pages: impl Iterator<Item = Arc<Page>>) {
        let mut f = self.lock();
        let before = f.pages.len();
        f.pages.extend(pages.filter_map(Arc::into_inner));
        self.in_use.fetch_sub(f.pages.len() - before, Relaxed);
    }
}

/// One sequence's cache: its page table and the positions filled.
pub struct KvSeq {
    pool: Arc<KvPool>,
    /// Its pages; one held by another sequence too (after [`KvSeq::fork`]) is read-only.
    pages: Vec<Arc<Page>>,
    len: usize,
    n_ctx: usize,
}

impl KvSeq {
    /// An empty sequence of at most `n_ctx` positions drawing pages from `pool`.
    pub fn new(pool: Arc<KvPool>, n_ctx: usize) -> KvSeq {
        let table = pool.geo.pages_for(n_ctx).min(pool.capacity);
        KvSeq {
            pool,
            pages: Vec::with_capacity(table),
            len: 0,
            n_ctx,
        }
    }

    /// The pool the pages come from.
    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
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

    /// Pages held.
    pub fn n_pages(&self) -> usize {
        self.pages.len()
    }

    /// The page table: the pool ids of the pages holding positions `0, page_size, …`.
    pub fn page_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.pages.iter().map(|p| p.id)
    }

    /// Forgets every position after the first `len` and gives the pages no longer needed
    /// back to the pool.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        let keep = self.pool.geo.pages_for(self.len);
        if self.pages.len() > keep {
            self.pool.give_back(self.pages.drain(keep..));
        }
    }

    /// Checks that `n` more positions fit the context.
    pub fn check_room(&self, n: usize) -> Result<()> {
        crate::generate::check_room(self.len, n, self.n_ctx)
    }

    /// Makes room for `n` more positions: checks the context and takes the pages they
    /// need from the pool (all or none), a copy included for each page the positions
    /// fall in that another sequence shares.
    pub fn reserve(&mut self, n: usize) -> Result<()> {
        self.check_room(n)?;
        let need = self.pool.geo.pages_for(self.len + n);
        let first = self.len / self.pool.geo.page_size;
        let shared: Vec<usize> = (first..need.min(self.pages.len()))
            .filter(|&i| Arc::strong_count(&self.pages[i]) > 1)
            .collect();
        let grow = need.saturating_sub(self.pages.len());
        if grow + shared.len() == 0 {
            return Ok(());
        }
        let mut fresh = self.pool.take(grow + shared.len())?.into_iter();
        for (&i, mut copy) in shared.iter().zip(&mut fresh) {
            copy.data.copy_from_slice(&self.pages[i].data);
            let old = std::mem::replace(&mut self.pages[i], Arc::new(copy));
            self.pool.give_back(std::iter::once(old));
        }
        self.pages.extend(fresh.map(Arc::new));
        Ok(())
    }

    /// A new sequence holding this one's positions in the same pages (nothing is copied
    /// until one of them writes into a shared page: see [`KvSeq::reserve`]).
    pub fn fork(&self) -> KvSeq {
        let held = self.pool.geo.pages_for(self.len);
        let mut pages = Vec::with_capacity(self.pages.capacity());
        pages.extend(self.pages[..held].iter().cloned());
        KvSeq {
            pool: self.pool.clone(),
            pages,
            len: self.len,
            n_ctx: self.n_ctx,
        }
    }

    /// Stores keys and values (`n × kv_dim` each, rounded to the cache's type) of layer `layer` for the
    /// `n` positions after the filled ones; [`KvSeq::reserve`] must have made room for them.
    /// Call [`KvSeq::advance`] after the last layer.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let geo = self.pool.geo;
        let (hd, page_size) = (geo.head_dim, geo.page_size);
        for (half, src) in [k, v].into_iter().enumerate() {
            for (i, row) in src.chunks_exact(geo.kv_dim()).enumerate() {
                let p = self.len + i;
                let data = &mut Arc::get_mut(&mut self.pages[p / page_size])
                    .expect("KvSeq::reserve gives a sequence its own copy of a page it writes")
                    .data;
                for (h, head) in row.chunks_exact(hd).enumerate() {
                    let at = geo.head_start(layer, half, h) + p % page_size * hd;
                    match geo.ty {
                        KvType::F16 => {
                            // Rounded to nearest (ties to even), F16C vectors where the CPU
                            // has them.
                            bytemuck::cast_slice_mut::<u32, f16>(data)[at..at + hd]
                                .convert_from_f32_slice(head);
                        }
                        KvType::F32 => bytemuck::cast_slice_mut::<u32, f32>(data)[at..at + hd]
                            .copy_from_slice(head),
                    }
                }
            }
        }
    }

    /// Marks `n` more positions as filled.
    pub fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Read access to the keys and values of `layer`.
    pub fn layer(&self, layer: usize) -> KvLayer<'_> {
        KvLayer { seq: self, layer }
    }
}

impl Drop for KvSeq {
    fn drop(&mut self) {
        self.pool.give_back(self.pages.drain(..));
    }
}

/// The keys and values of one layer of one sequence, head by head.
#[derive(Clone, Copy)]
pub struct KvLayer<'a> {
    seq: &'a KvSeq,
    layer: usize,
}

impl<'a> KvLayer<'a> {
    /// Kv head `h`'s rows of `n` positions from `p` (all inside `p`'s page: at most to its
    /// end), one after the other.
    fn rows(&self, half: usize, (p, h): (usize, usize), n: usize) -> KvRow<'a> {
        let geo = self.seq.pool.geo;
        let (hd, page_size) = (geo.head_dim, geo.page_size);
        let n = n.min(page_size - p % page_size);
        let at = geo.head_start(self.layer, half, h) + p % page_size * hd;
        let data = &self.seq.pages[p / page_size].data;
        let span = at..at + n * hd;
        match geo.ty {
            KvType::F16 => KvRow::F16(&bytemuck::cast_slice(data)[span]),
            KvType::F32 => KvRow::F32(&bytemuck::cast_slice(data)[span]),
        }
    }

    /// The element type of the rows.
    pub fn ty(&self) -> KvType {
        self.seq.pool.geo.ty
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.seq.pool.geo.head_dim
    }

    /// Kv head `h`'s key at position `p`.
    pub fn key(&self, p: usize, h: usize) -> KvRow<'a> {
        self.rows(0, (p, h), 1)
    }

    /// Kv head `h`'s value at position `p`.
    pub fn value(&self, p: usize, h: usize) -> KvRow<'a> {
        self.rows(1, (p, h), 1)
    }

    /// Kv head `h`'s keys at position `p` and the positions after it stored next to it (to
    /// the end of `p`'s page), one after the other.
    pub fn keys_from(&self, p: usize, h: usize) -> KvRow<'a> {
        self.rows(0, (p, h), usize::MAX)
    }

    /// Kv head `h`'s values at position `p` and the positions after it stored next to it.
    pub fn values_from(&self, p: usize, h: usize) -> KvRow<'a> {
        self.rows(1, (p, h), usize::MAX)
    }
}

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;
