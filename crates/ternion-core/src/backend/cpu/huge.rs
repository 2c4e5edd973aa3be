//! Large weight buffers on transparent huge pages. A decode step streams every weight
//! once; on 4 KiB pages that is a TLB miss every 4 KiB and the hardware prefetchers stop
//! at every page boundary, so the repacked ternary weights and a requantized LM head read
//! measurably slower than the memory allows (BENCHMARKS.md, session 16). Where the kernel
//! offers transparent huge pages only on request (`madvise`, the usual default), a buffer
//! of at least one huge page starts on a huge-page boundary and asks for huge pages before
//! its first touch. Elsewhere, or if the kernel declines, it is an ordinary buffer: this
//! changes speed only, never contents.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Bytes of a huge page on x86-64 and aarch64 (4 KiB granule).
const HUGE_PAGE: usize = 2 << 20;

/// A fixed-size buffer of `Copy` values. One of at least 3/4 of a huge page starts on a
/// huge-page boundary (the alignment costs address space only: the skipped bytes are
/// never touched) and, where rounding its size up to whole huge pages adds at most a
/// third, takes whole huge pages.
pub(crate) struct HugeBuf<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: a HugeBuf owns its values as a Vec does; sharing or sending it shares or sends
// them.
unsafe impl<T: Send> Send for HugeBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for HugeBuf<T> {}

impl<T: Copy> HugeBuf<T> {
    /// `n` copies of `fill`.
    ///
    /// # Panics
    /// If `n` values do not fit the address space (as `vec!` would).
    pub(crate) fn filled(n: usize, fill: T) -> HugeBuf<T> {
        let layout = Self::layout(n);
        let ptr = match layout.size() {
            0 => NonNull::dangling(),
            // SAFETY: the layout has a non-zero size.
            _ => match NonNull::new(unsafe { alloc::alloc(layout) }.cast::<T>()) {
                Some(p) => p,
                None => alloc::handle_alloc_error(layout),
            },
        };
        advise_huge(ptr.as_ptr().cast(), layout.size());
        for i in 0..n {
            // SAFETY: i < n, inside the allocation of n values.
            unsafe { ptr.as_ptr().add(i).write(fill) };
        }
        HugeBuf { ptr, len: n }
    }
}

impl<T> HugeBuf<T> {
    /// The allocation of `n` values.
    ///
    /// # Panics
    /// If `n` values do not fit the address space (as `vec!` would).
    fn layout(n: usize) -> Layout {
        let bytes = n
            .checked_mul(std::mem::size_of::<T>())
            .expect("HugeBuf: size overflows");
        // Whole huge pages when that adds at most a third (q and o of 2B-4T: 1.56 → 2 MiB).
        let (whole, align) = (bytes.next_multiple_of(HUGE_PAGE), std::mem::align_of::<T>());
        let huge = HUGE_PAGE.max(align);
        match (whole - bytes <= bytes / 3, bytes >= HUGE_PAGE) {
            (true, _) => Layout::from_size_align(whole, huge),
            (false, true) => Layout::from_size_align(bytes, huge),
            (false, false) => Layout::from_size_align(bytes, align),
        }
        .expect("HugeBuf: layout")
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
        let layout = Self::layout(self.len);
        if layout.size() > 0 {
            // SAFETY: allocated in `filled` with this layout (a function of the length);
            // the values are `Copy` and need no drop.
            unsafe { alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
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
    fn buffers_hold_their_values_and_large_ones_start_on_a_huge_page() {
        for n in [0, 1, 1000, HUGE_PAGE / 8 + 3] {
            let mut b = HugeBuf::filled(n, 7u64);
            assert_eq!(b.len(), n);
            assert!(b.iter().all(|&v| v == 7));
            if let Some(last) = b.last_mut() {
                *last = 9;
            }
            assert_eq!(b.iter().sum::<u64>(), 7 * n as u64 + 2 * u64::from(n > 0));
            if n * 8 >= HUGE_PAGE {
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            }
        }
        // 1.6 MiB rounds up to one huge page; 0.4 and 4.4 MiB keep their size.
        for (bytes, size, align) in [
            (1600 << 10, HUGE_PAGE, HUGE_PAGE),
            (400 << 10, 400 << 10, 1),
            (4400 << 10, 4400 << 10, HUGE_PAGE),
        ] {
            let layout = HugeBuf::<u8>::layout(bytes);
            assert_eq!((layout.size(), layout.align()), (size, align), "{bytes}");
        }
    }
}
