//! The delegate's own memory: a lifetime-based placement of intermediates in
//! one arena, and the 64-byte aligned buffer that backs it.

use std::alloc::Layout;

/// Alignment of every arena offset (a cache line; also what SIMD kernels want).
pub const ARENA_ALIGNMENT: usize = 64;

/// A buffer to place: `bytes` long, live from step `first` to step `last`
/// (inclusive: it is written at `first` and last read at `last`).
#[derive(Clone, Copy, Debug)]
pub struct Lifetime {
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
}

/// Offsets for `buffers` such that two buffers live at the same step never
/// overlap, and the arena size. Greedy by size, first fit: the usual
/// heuristic (as in TFLite's and ExecuTorch's planners), near-optimal for
/// the chain-shaped graphs delegated here.
pub fn place(buffers: &[Lifetime]) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(buffers[i].bytes));
    let mut offsets = vec![0; buffers.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut total = 0;
    for i in order {
        let b = buffers[i];
        let mut taken: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| buffers[j].first <= b.last && b.first <= buffers[j].last)
            .map(|&j| (offsets[j], offsets[j] + buffers[j].bytes))
            .collect();
        taken.sort_unstable();
        let mut offset = 0;
        for (start, end) in taken {
            if offset + b.bytes <= start {
                break;
            }
            offset = offset.max(end.next_multiple_of(ARENA_ALIGNMENT));
        }
        offsets[i] = offset;
        total = total.max(offset + b.bytes);
        placed.push(i);
    }
    (offsets, total.next_multiple_of(ARENA_ALIGNMENT))
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct CacheLine([u8; ARENA_ALIGNMENT]);

/// Zero-initialised bytes whose start is 64-byte aligned.
pub struct AlignedBuf {
    lines: Vec<CacheLine>,
    len: usize,
}

impl AlignedBuf {
    /// # Panics
    /// Where the memory cannot be had (sizes the delegate holds already,
    /// such as a copy of constants it read); a blob's declared sizes go
    /// through [`Self::try_zeroed`].
    pub fn zeroed(len: usize) -> Self {
        Self::try_zeroed(len).expect("memory for an aligned buffer")
    }

    /// `len` zero bytes, or None where the allocation fails: a blob may
    /// declare an arena larger than the device's memory (a fuzzed one
    /// asked for 4 TiB, which `vec!` would answer by aborting the process).
    /// Zeroed by the allocator (`calloc`'s fresh pages), not written: the
    /// pages of a 16 GiB arena a blob declares are not made resident until
    /// a kernel writes them (written zeros took a fuzzed blob's `init` to
    /// 9 GB).
    pub fn try_zeroed(len: usize) -> Option<Self> {
        let n = len.div_ceil(ARENA_ALIGNMENT);
        if n == 0 {
            return Some(AlignedBuf {
                lines: Vec::new(),
                len,
            });
        }
        let layout = Layout::array::<CacheLine>(n).ok()?;
        // SAFETY: `layout` has a non-zero size (`n > 0`).
        let data = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<CacheLine>();
        if data.is_null() {
            return None;
        }
        // SAFETY: `data` comes from the global allocator with the layout of
        // `n` CacheLines (a Vec's for capacity `n`, which it frees with),
        // holds `n` initialised ones (a CacheLine is plain bytes; all zero
        // is a value) and is owned by nothing else.
        let lines = unsafe { Vec::from_raw_parts(data, n, n) };
        Some(AlignedBuf { lines, len })
    }

    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut buf = Self::zeroed(bytes.len());
        buf.as_mut_slice().copy_from_slice(bytes);
        buf
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.lines.as_mut_ptr().cast()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.lines.as_ptr().cast()
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `lines` holds at least `len` initialised bytes (a CacheLine
        // is plain bytes with no padding), borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
        a.0 < b.1 && b.0 < a.1
    }

    #[test]
    fn live_buffers_never_overlap_and_dead_ones_are_reused() {
        // A chain: each buffer is written at step i and read at step i + 1.
        let chain: Vec<Lifetime> = (0..6)
            .map(|i| Lifetime {
                bytes: 1000 + 100 * i,
                first: i,
                last: i + 1,
            })
            .collect();
        let (offsets, total) = place(&chain);
        for i in 0..chain.len() {
            assert_eq!(offsets[i] % ARENA_ALIGNMENT, 0);
            for j in 0..chain.len() {
                let live_together =
                    chain[i].first <= chain[j].last && chain[j].first <= chain[i].last;
                if i != j && live_together {
                    assert!(!overlaps(
                        (offsets[i], offsets[i] + chain[i].bytes),
                        (offsets[j], offsets[j] + chain[j].bytes)
                    ));
                }
            }
        }
        // Two live at a time: far less than the sum of all six.
        let sum: usize = chain.iter().map(|b| b.bytes).sum();
        assert!(
            total <= 2 * 1600 + 2 * ARENA_ALIGNMENT,
            "arena {total} of {sum}"
        );
    }

    #[test]
    fn empty_plan_needs_no_arena() {
        assert_eq!(place(&[]), (vec![], 0));
    }

    #[test]
    fn an_arena_larger_than_memory_is_an_error() {
        assert!(AlignedBuf::try_zeroed(1 << 60).is_none());
        assert!(AlignedBuf::try_zeroed(usize::MAX).is_none());
        assert!(AlignedBuf::try_zeroed(0).unwrap().is_empty());
        let mut buf = AlignedBuf::try_zeroed(100).unwrap();
        assert_eq!(buf.as_mut_slice(), &[0; 100]);
    }

    /// Resident memory of this process, from /proc (Linux).
    #[cfg(target_os = "linux")]
    fn rss_bytes() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<usize>()
            .unwrap()
            * 1024
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_large_arena_is_not_resident_until_written() {
        let before = rss_bytes();
        let mut buf = AlignedBuf::try_zeroed(2 << 30).unwrap();
        let grown = rss_bytes().saturating_sub(before);
        // Written zeros would make all 2 GiB resident; half is room for a
        // sanitizer's shadow of the range (an eighth) and other tests.
        assert!(grown < 1 << 30, "2 GiB arena made {grown} bytes resident");
        // Zero where read, writable at both ends.
        let bytes = buf.as_mut_slice();
        assert_eq!((bytes[0], bytes[(2 << 30) - 1]), (0, 0));
        bytes[(2 << 30) - 1] = 1;
    }

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_writable() {
        let mut buf = AlignedBuf::zeroed(100);
        assert_eq!(buf.as_ptr() as usize % ARENA_ALIGNMENT, 0);
        assert!(buf.as_mut_slice().iter().all(|&b| b == 0));
        buf.as_mut_slice()[99] = 5;
        let copy = AlignedBuf::from_bytes(&[1, 2, 3]);
        // SAFETY: reading 3 initialised bytes of `copy`.
        assert_eq!(
            unsafe { std::slice::from_raw_parts(copy.as_ptr(), 3) },
            &[1, 2, 3]
        );
    }
}
