//! Memory for the arrays an index reads at random (its rows, codes and edges), asked of the
//! kernel in 2 MB pages.
//!
//! Why: a walk of the graph reads a few thousand rows and edge lists a query, each at a random
//! address; over 4 KB pages a base of 390,000 rows spans tens of thousands of pages, far more
//! than the TLB holds, so nearly every such read (and every prefetch of one) first waits for a
//! page walk. The advice (`MADV_HUGEPAGE`) serves systems whose transparent huge pages are on
//! request, as Debian's and Ubuntu's are; where it is refused the pages are 4 KB, as without it.

/// A vector of `len` copies of `value`, its memory advised into 2 MB pages before it is first
/// written (so the first touch maps huge pages).
pub fn huge_filled<T: Copy>(len: usize, value: T) -> Vec<T> {
    let mut values: Vec<T> = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let base = values.as_ptr() as usize;
        let start = base.next_multiple_of(HUGE_PAGE);
        let end = (base + len * size_of::<T>()) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: [start, end) lies within `values`' allocation (its capacity is `len`),
            // page-aligned; the advice only changes how the kernel backs those pages, never
            // their contents. A refusal (no THP) leaves 4 KB pages, which is what the advice's
            // absence gives.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    values.resize(len, value);
    values
}
