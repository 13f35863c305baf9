//! Resident arenas: a buffer whose pages are all mapped when it is made.
//!
//! A large `vec![0; n]` comes from the OS untouched: each 4 KiB page is mapped (and zeroed) by
//! a page fault on its first write. For a KV cache that means a fault whenever a sequence
//! first writes into a block: a block of SmolLM2's cache spans six pages per layer, so a
//! decode step that enters a fresh block paid 180 faults (~0.4 ms, 13 µs a layer) and a
//! 248-token prefill ~3,000 (5% of it). The block pool hands out the least recently freed
//! block, so a server with a large cache kept entering never-touched blocks until it had
//! cycled through all of them. vLLM and llama.cpp allocate their caches up front too.
//!
//! So the arena is written whole at start-up. On Linux its memory is first advised to use
//! transparent huge pages (`madvise(MADV_HUGEPAGE)`; the system's default here is "madvise"),
//! so start-up maps 2 MiB at a time and attention's scattered block reads miss the TLB less.
//! The advice is a hint: without it (or elsewhere) the pages are 4 KiB.

/// `len` copies of `value`, every page of them mapped: the memory is advised first, then
/// written whole (a `vec![value; len]` of zeros would come untouched from `calloc`).
pub(crate) fn filled<T: Copy>(len: usize, value: T) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    advise_huge_pages(v.spare_capacity_mut());
    v.resize(len, value);
    v
}

#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(v: &mut [T]) {
    const HUGE: usize = 2 << 20;
    let (start, end) = (
        v.as_ptr() as usize,
        v.as_ptr() as usize + std::mem::size_of_val(v),
    );
    // Only whole huge pages inside the buffer can be backed by one.
    let first = start.next_multiple_of(HUGE);
    if end < first + HUGE {
        return;
    }
    let len = (end - first) / HUGE * HUGE;
    // SAFETY: `[first, first + len)` lies inside `v`'s allocation (not yet written);
    // MADV_HUGEPAGE changes how its pages are backed, never their contents. A failure (THP
    // off) is harmless.
    unsafe { libc::madvise(first as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages<T>(_: &mut [T]) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The smallest page size of the targets we run on.
    const PAGE: usize = 4096;

    /// Pages of `v` the OS reports resident (`mincore`), and how many pages it spans.
    fn resident_pages<T>(v: &[T]) -> (usize, usize) {
        let start = (v.as_ptr() as usize) / PAGE * PAGE;
        let end = v.as_ptr() as usize + std::mem::size_of_val(v);
        let pages = (end - start).div_ceil(PAGE);
        let mut status = vec![0u8; pages];
        // SAFETY: `[start, end)` is mapped (it covers `v`'s allocation, page-rounded down);
        // `status` has one byte per page.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, status.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        (status.iter().filter(|&&s| s & 1 == 1).count(), pages)
    }

    #[test]
    fn every_page_of_the_arena_is_mapped_and_holds_the_value() {
        // 48 MiB: far above the allocator's mmap threshold, so it comes from the OS untouched.
        let n = 12 << 20;
        let plain = vec![0.0f32; n];
        let (before, pages) = resident_pages(&plain);
        assert!(
            before < pages / 2,
            "a plain zeroed vec is mapped lazily ({before} of {pages})"
        );
        for v in [filled(n, 0.0f32), filled(n, -1.5f32)] {
            let (mapped, pages) = resident_pages(&v);
            assert_eq!(mapped, pages, "every page resident");
            assert!(v.len() == n && v.iter().all(|&x| x == v[0]));
        }
        let h = filled(n, half::bf16::ZERO);
        assert_eq!(resident_pages(&h).0, resident_pages(&h).1);
        assert!(filled(0, 0u8).is_empty() && filled(3, 7u8) == [7, 7, 7]);
    }
}
