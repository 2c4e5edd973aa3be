//! Large weight buffers on transparent huge pages. A decode step streams every weight
//! once; on 4 KiB pages that is a TLB miss every 4 KiB and the hardware prefetchers stop
//! at every page boundary, so the repacked ternary weights and a requantized LM head read
//! measurably slower than the memory allows (BENCHMARKS.md, session 16). Where the kernel
//! offers transparent huge pages only on request (`madvise`, the usual default), the
//! buffers ask for them before their first touch. Elsewhere, or if the kernel declines,
//! they are ordinary buffers: this changes speed only, never contents.

/// Bytes of a huge page on x86-64 and aarch64 (4 KiB granule).
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// `n` copies of `fill` in a buffer asked to sit on transparent huge pages.
pub(super) fn filled<T: Copy>(n: usize, fill: T) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise_huge(v.spare_capacity_mut());
    v.resize(n, fill);
    v
}

/// Asks for huge pages under the whole huge pages inside `buf` (untouched memory, so the
/// first touch maps huge pages where the kernel can).
#[cfg(target_os = "linux")]
fn advise_huge<T>(buf: &mut [T]) {
    let (start, len) = (buf.as_mut_ptr() as usize, std::mem::size_of_val(buf));
    let first = start.next_multiple_of(HUGE_PAGE);
    let end = (start + len) / HUGE_PAGE * HUGE_PAGE;
    if end > first {
        // SAFETY: [first, end) lies inside `buf`, memory this process owns; MADV_HUGEPAGE
        // changes how its pages are backed, never their contents. Advice only: a failure
        // changes nothing but speed.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

/// Without Linux's `madvise`, an ordinary buffer.
#[cfg(not(target_os = "linux"))]
fn advise_huge<T>(_buf: &mut [T]) {}
