//! Large weight buffers on transparent huge pages. A decode step streams every weight
//! once; on 4 KiB pages that is a TLB miss every 4 KiB and the hardware prefetchers stop
//! at every page boundary, so the repacked ternary weights and a requantized LM head read
//! measurably slower than the memory allows (BENCHMARKS.md, sessions 16 and 31). Where the
//! kernel offers transparent huge pages only on request (`madvise`, the usual default), a
//! buffer lies on huge pages from its first byte to its last:
//! - one that whole huge pages fit with at most a third to spare takes whole huge pages
//!   (q and o of 2B-4T: 1.56 → 2 MiB);
//! - a smaller or more awkward one (k and v of 2B-4T: 0.4 MiB; gate, up and down: 4.3 MiB,
//!   whose last 0.3 MiB would otherwise sit on small pages; a KV cache page, 2.3 MiB) is
//!   cut from a shared slab of huge pages, one after the other, so that no huge page is
//!   left mostly empty (weights and cache pages from slabs of their own);
//! - a tiny one is an ordinary allocation.
//!
//! Elsewhere, or if the kernel declines, a buffer lies on ordinary pages: this changes
//! speed only, never contents.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// Bytes of a huge page on x86-64 and aarch64 (4 KiB granule).
const HUGE_PAGE: usize = 2 << 20;

/// Bytes of a shared slab (32 huge pages). A buffer that does not fit the rest of the
/// current slab starts a new one; that rest (less than the largest buffer cut from slabs,
/// 6 MiB) is never touched.
const SLAB: usize = 64 << 20;

/// Buffers below this many bytes are ordinary allocations (a slab would save little).
const SLAB_MIN: usize = 64 << 10;

/// A fixed-size buffer of `Copy` values, on huge pages where it is large enough (see the
/// module's notes).
pub(crate) struct HugeBuf<T> {
    ptr: NonNull<T>,
    len: usize,
    /// The shared slab the buffer was cut from (freed when its last buffer is dropped);
    /// None for a buffer with an allocation of its own (the layout [`HugeBuf::place`]
    /// gives its size).
    slab: Option<Arc<Slab>>,
}

/// [`SLAB`] bytes on huge pages that buffers are cut from, front to back.
struct Slab {
    base: NonNull<u8>,
}

// SAFETY: a slab is raw memory that only the buffers cut from it read and write, each its
// own disjoint part.
unsafe impl Send for Slab {}
// SAFETY: as above.
unsafe impl Sync for Slab {}

impl Slab {
    fn layout() -> Layout {
        Layout::from_size_align(SLAB, HUGE_PAGE).expect("HugeBuf: slab layout")
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `cut` with this layout; the last buffer cut from it is gone.
        unsafe { alloc::dealloc(self.base.as_ptr(), Slab::layout()) };
    }
}

/// What a buffer holds, which decides the slabs it shares: buffers that live about as
/// long as each other share slabs, so that a long-lived one never keeps a slab of freed
/// ones (nor its memory) alive.
#[derive(Clone, Copy)]
pub(crate) enum Lifetime {
    /// Weights, made once a model is loaded and kept while it is.
    Model,
    /// KV cache pages, made and freed as sequences come and go.
    Cache,
}

/// A new allocation of `layout` (non-zero size), asked to lie on huge pages.
fn allocate(layout: Layout) -> NonNull<u8> {
    // SAFETY: callers pass a layout of non-zero size.
    let Some(p) = NonNull::new(unsafe { alloc::alloc(layout) }) else {
        alloc::handle_alloc_error(layout)
    };
    advise_huge(p.as_ptr(), layout.size());
    p
}

/// A slab being cut (while any buffer cut from it lives) and the bytes of it used.
type Cursor = Option<(Weak<Slab>, usize)>;

/// The [`Cursor`] of each [`Lifetime`].
static CURRENT: [Mutex<Cursor>; 2] = [Mutex::new(None), Mutex::new(None)];

/// `layout`'s bytes cut from the current slab of `life`, or from a fresh one where they
/// do not fit.
fn cut(layout: Layout, life: Lifetime) -> (NonNull<u8>, Arc<Slab>) {
    let mut current = CURRENT[life as usize]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((slab, used)) = current.as_mut() {
        let at = used.next_multiple_of(layout.align());
        if let Some(slab) = slab.upgrade().filter(|_| at + layout.size() <= SLAB) {
            *used = at + layout.size();
            // SAFETY: at + size ≤ SLAB: inside the slab's allocation.
            return (unsafe { slab.base.add(at) }, slab);
        }
    }
    let base = allocate(Slab::layout());
    let slab = Arc::new(Slab { base });
    *current = Some((Arc::downgrade(&slab), layout.size()));
    (base, slab)
}

// SAFETY: a HugeBuf owns its values as a Vec does; sharing or sending it shares or sends
// them.
unsafe impl<T: Send> Send for HugeBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for HugeBuf<T> {}

impl<T: Copy> HugeBuf<T> {
    /// `n` copies of `fill`, a model's weights ([`Lifetime::Model`]).
    ///
    /// # Panics
    /// If `n` values do not fit the address space (as `vec!` would).
    pub(crate) fn filled(n: usize, fill: T) -> HugeBuf<T> {
        Self::filled_for(n, fill, Lifetime::Model)
    }

    /// `n` copies of `fill`, sharing slabs only with buffers of the same `life`.
    ///
    /// # Panics
    /// If `n` values do not fit the address space (as `vec!` would).
    pub(crate) fn filled_for(n: usize, fill: T, life: Lifetime) -> HugeBuf<T> {
        let bytes = n
            .checked_mul(std::mem::size_of::<T>())
            .expect("HugeBuf: size overflows");
        let (ptr, slab) = match Self::place(bytes) {
            Place::Slab(layout) => {
                let (p, slab) = cut(layout, life);
                (p.cast::<T>(), Some(slab))
            }
            Place::Own(layout) if layout.size() == 0 => (NonNull::dangling(), None),
            Place::Own(layout) => (allocate(layout).cast::<T>(), None),
        };
        for i in 0..n {
            // SAFETY: i < n, inside the n values placed above.
            unsafe { ptr.as_ptr().add(i).write(fill) };
        }
        HugeBuf { ptr, len: n, slab }
    }
}

/// Where a buffer of some size goes.
#[derive(Debug, PartialEq)]
enum Place {
    /// An allocation of its own, of this layout.
    Own(Layout),
    /// Cut from a shared slab, with this layout.
    Slab(Layout),
}

impl<T> HugeBuf<T> {
    /// Where a buffer of `bytes` bytes of `T` goes: whole huge pages of its own when that
    /// adds at most a third (every buffer of 6 MiB or more: so a slab's buffer always fits
    /// a fresh slab); on Linux, a slab's bytes when it is at least [`SLAB_MIN`]; else an
    /// ordinary allocation.
    ///
    /// # Panics
    /// If the size does not fit the address space (as `vec!` would).
    fn place(bytes: usize) -> Place {
        let align = std::mem::align_of::<T>();
        let whole = bytes.next_multiple_of(HUGE_PAGE);
        let own = |size, align| {
            Place::Own(Layout::from_size_align(size, align).expect("HugeBuf: layout"))
        };
        if whole - bytes <= bytes / 3 {
            own(whole, HUGE_PAGE.max(align))
        } else if cfg!(target_os = "linux") && bytes >= SLAB_MIN && align <= HUGE_PAGE {
            Place::Slab(Layout::from_size_align(bytes, align.max(64)).expect("HugeBuf: layout"))
        } else {
            own(bytes, align)
        }
    }
}

impl<T> Deref for HugeBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised values (written in `filled`), owned here.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for HugeBuf<T> {
    fn drop(&mut self) {
        // A slab's part is freed with the slab (its `Arc` drops with the buffer).
        if self.slab.is_some() {
            return;
        }
        if let Place::Own(layout) = Self::place(self.len * std::mem::size_of::<T>()) {
            if layout.size() > 0 {
                // SAFETY: allocated in `filled_for` with this layout (a function of the
                // length); the values are `Copy` and need no drop.
                unsafe { alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
            }
        }
    }
}

/// Asks for huge pages under the whole huge pages inside `[start, start + len)` (memory
/// not yet touched, so the first touch maps huge pages where the kernel can).
#[cfg(target_os = "linux")]
fn advise_huge(start: *mut u8, len: usize) {
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > first {
        // SAFETY: [first, end) lies inside the buffer, memory this process owns;
        // MADV_HUGEPAGE changes how its pages are backed, never their contents. Advice
        // only: a failure changes nothing but speed.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

/// Without Linux's `madvise`, an ordinary buffer.
#[cfg(not(target_os = "linux"))]
fn advise_huge(_start: *mut u8, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_their_values_and_large_ones_lie_on_huge_pages() {
        for n in [
            0,
            1,
            1000,
            HUGE_PAGE / 8 + 3,
            (400 << 10) / 8,
            (4400 << 10) / 8,
        ] {
            let mut b = HugeBuf::filled(n, 7u64);
            assert_eq!(b.len(), n);
            assert!(b.iter().all(|&v| v == 7));
            if let Some(last) = b.last_mut() {
                *last = 9;
            }
            assert_eq!(b.iter().sum::<u64>(), 7 * n as u64 + 2 * u64::from(n > 0));
            match HugeBuf::<u64>::place(8 * n) {
                Place::Own(l) if l.align() == HUGE_PAGE && n > 0 => {
                    assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0)
                }
                Place::Slab(_) => assert_eq!(b.as_ptr() as usize % 64, 0),
                Place::Own(_) => {}
            }
        }
        // 1.6 MiB rounds up to one huge page; 0.4 and 4.4 MiB are cut from a slab (on
        // Linux); 3 KiB is an ordinary allocation; 9 MiB rounds up to 10.
        let own = |size, align| Place::Own(Layout::from_size_align(size, align).unwrap());
        let slab = |size| match cfg!(target_os = "linux") {
            true => Place::Slab(Layout::from_size_align(size, 64).unwrap()),
            false => own(size, 1),
        };
        for (bytes, place) in [
            (1600 << 10, own(HUGE_PAGE, HUGE_PAGE)),
            (400 << 10, slab(400 << 10)),
            (4400 << 10, slab(4400 << 10)),
            (3 << 10, own(3 << 10, 1)),
            (9 << 20, own(10 << 20, HUGE_PAGE)),
        ] {
            assert_eq!(HugeBuf::<u8>::place(bytes), place, "{bytes}");
        }
    }

    /// Slabs exist on Linux only (elsewhere every buffer is its own allocation).
    #[cfg(target_os = "linux")]
    #[test]
    fn buffers_cut_from_a_slab_are_disjoint_and_outlive_each_other() {
        // 4.3 MiB: cut from a slab, 14 to a slab, so 16 of them need at least two.
        const BYTES: usize = 4400 << 10;
        assert!(matches!(HugeBuf::<u8>::place(BYTES), Place::Slab(_)));
        let mut a = HugeBuf::filled(BYTES, 1u8);
        let b = HugeBuf::filled(BYTES, 2u8);
        let many: Vec<HugeBuf<u8>> = (0..16).map(|i| HugeBuf::filled(BYTES, i as u8)).collect();
        let cache = HugeBuf::filled_for(BYTES, 3u8, Lifetime::Cache);
        let slab = |h: &HugeBuf<u8>| h.slab.clone().expect("cut from a slab");
        // Every buffer has its own bytes, and a cache page never shares a weight's slab.
        let mut spans: Vec<(usize, usize)> = [&a, &b, &cache]
            .into_iter()
            .chain(&many)
            .map(|h| (h.as_ptr() as usize, h.as_ptr() as usize + h.len()))
            .collect();
        spans.sort_unstable();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "overlapping buffers"
        );
        assert!(many.iter().any(|m| !Arc::ptr_eq(&slab(m), &slab(&many[0]))));
        assert!([&a, &b]
            .into_iter()
            .chain(&many)
            .all(|h| !Arc::ptr_eq(&slab(h), &slab(&cache))));
        // A buffer dropped leaves its neighbours' values as they were.
        a.iter_mut().for_each(|v| *v += 10);
        drop(b);
        assert!(a.iter().all(|&v| v == 11));
        assert!(cache.iter().all(|&v| v == 3));
        for (i, m) in many.iter().enumerate() {
            assert!(m.iter().all(|&v| v == i as u8), "buffer {i}");
        }
    }
}
