//! An anonymous memory mapping used as an array of plain-old-data records.
//!
//! The state slab reserves address space for the largest table it may grow to and lets the
//! kernel back pages on first touch, so raising `set limit states` costs nothing and never
//! copies entries. Regions are advised for transparent huge pages: with 10M states the entries
//! span 640 MB, and 2 MB pages keep the TLB out of the lookup's way (see docs/state-table.md).

use std::marker::PhantomData;
use std::ptr::NonNull;

/// Marker for records that are valid when all bytes are zero and have no drop glue.
///
/// # Safety
/// Implementors must be `Copy`, contain no references, and accept the all-zero bit pattern.
pub unsafe trait Zeroable: Copy {}

// SAFETY: an array or pair of zeroable records is zeroable.
unsafe impl<T: Zeroable, const N: usize> Zeroable for [T; N] {}
unsafe impl<A: Zeroable, B: Zeroable> Zeroable for (A, B) {}

pub struct Region<T: Zeroable> {
    ptr: NonNull<T>,
    cap: usize,
    _t: PhantomData<T>,
}

// SAFETY: the region owns its mapping exclusively, like a Box<[T]>.
unsafe impl<T: Zeroable + Send> Send for Region<T> {}
unsafe impl<T: Zeroable + Sync> Sync for Region<T> {}

#[derive(Debug)]
pub struct MapError {
    pub bytes: usize,
    pub errno: i32,
}

impl std::fmt::Display for MapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot map {} bytes: {}", self.bytes, std::io::Error::from_raw_os_error(self.errno))
    }
}
impl std::error::Error for MapError {}

impl<T: Zeroable> Region<T> {
    /// Reserves room for `cap` records, all zero. Pages are only backed when written.
    pub fn new(cap: usize) -> Result<Self, MapError> {
        let cap = cap.max(1);
        let bytes =
            cap.checked_mul(core::mem::size_of::<T>()).ok_or(MapError { bytes: usize::MAX, errno: libc::ENOMEM })?;
        // SAFETY: an anonymous private mapping with no address hint; checked below.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(MapError { bytes, errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0) });
        }
        // SAFETY: p is a valid mapping of `bytes`; the advice is only a hint.
        unsafe {
            libc::madvise(p, bytes, libc::MADV_HUGEPAGE);
        }
        Ok(Region { ptr: NonNull::new(p as *mut T).unwrap(), cap, _t: PhantomData })
    }

    #[inline(always)]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    #[inline(always)]
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }

    #[inline(always)]
    pub fn get(&self, i: usize) -> &T {
        assert!(i < self.cap);
        // SAFETY: in bounds; all-zero is a valid T.
        unsafe { &*self.ptr.as_ptr().add(i) }
    }

    #[inline(always)]
    pub fn get_mut(&mut self, i: usize) -> &mut T {
        assert!(i < self.cap);
        // SAFETY: in bounds; &mut self gives exclusive access.
        unsafe { &mut *self.ptr.as_ptr().add(i) }
    }

    /// # Safety
    /// `i < capacity()`.
    #[inline(always)]
    pub unsafe fn get_unchecked(&self, i: usize) -> &T {
        &*self.ptr.as_ptr().add(i)
    }

    /// # Safety
    /// `i < capacity()`.
    #[inline(always)]
    pub unsafe fn get_unchecked_mut(&mut self, i: usize) -> &mut T {
        &mut *self.ptr.as_ptr().add(i)
    }

    /// Sets records `[0, n)` to zero (all-zero is a valid T), in place: their pages stay
    /// backed, so the packet path takes no page fault on them afterwards.
    pub fn zero(&mut self, n: usize) {
        // SAFETY: `n` is bounded by the capacity; &mut self gives exclusive access.
        unsafe { core::ptr::write_bytes(self.ptr.as_ptr(), 0, n.min(self.cap)) }
    }

    /// Backs records `[0, n)` with memory now, so that the packet path never takes a page
    /// fault for them (MADV_POPULATE_WRITE, Linux 5.14). On failure (an older kernel, or no
    /// memory) nothing is lost: pages are then faulted in on first touch.
    pub fn populate(&self, n: usize) -> bool {
        self.populate_range(0, n)
    }

    /// Backs records `[start, start + n)` with memory now (whole pages around them).
    pub fn populate_range(&self, start: usize, n: usize) -> bool {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        let size = core::mem::size_of::<T>();
        let end = (start + n).min(self.cap) * size;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let from = (start.min(self.cap) * size) / page * page;
        if end <= from {
            return true;
        }
        // SAFETY: the page-aligned range lies inside our (page-aligned) mapping; populating does
        // not change its contents.
        unsafe {
            libc::madvise(
                (self.ptr.as_ptr() as *mut u8).add(from) as *mut libc::c_void,
                end - from,
                MADV_POPULATE_WRITE,
            ) == 0
        }
    }

    /// Faults the whole region in on another thread, so that the caller never waits for it.
    /// The caller must keep the region alive until the returned thread has finished (join it).
    pub fn populate_in_background(&self) -> std::io::Result<std::thread::JoinHandle<()>> {
        struct Span(usize, usize);
        // SAFETY: only an address range crosses threads, for madvise; no data is read.
        unsafe impl Send for Span {}
        let span = Span(self.ptr.as_ptr() as usize, self.cap * core::mem::size_of::<T>());
        spawn_away("xpf-populate", move || {
            const MADV_POPULATE_WRITE: libc::c_int = 23;
            let s = span;
            // SAFETY: the range is the caller's live mapping (see above); populating keeps its
            // contents (zero) and nothing else reads or writes it until the thread is joined.
            unsafe {
                libc::madvise(s.0 as *mut libc::c_void, s.1, MADV_POPULATE_WRITE);
            }
        })
    }

    /// Hints the CPU to bring record `i` into cache. Never faults, whatever `i` is.
    #[inline(always)]
    pub fn prefetch(&self, i: usize) {
        prefetch(self.ptr.as_ptr().wrapping_add(i) as *const u8);
    }
}

impl<T: Zeroable> Drop for Region<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what new() mapped.
        unsafe {
            libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.cap * core::mem::size_of::<T>());
        }
    }
}

/// Starts a helper thread on the CPUs other than the caller's. Callers are usually workers
/// pinned to their core: a helper inheriting that pinning takes the worker's core for a
/// scheduler slice (4-8 ms measured during a resize).
pub fn spawn_away<F: FnOnce() + Send + 'static>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<()>> {
    let away = cpus_other_than_current();
    std::thread::Builder::new().name(name.into()).spawn(move || {
        if let Some(set) = away {
            // SAFETY: set is a valid cpu_set_t.
            unsafe {
                libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
        f()
    })
}

/// All online CPUs but the one this thread runs on; None if there is no other.
fn cpus_other_than_current() -> Option<libc::cpu_set_t> {
    // SAFETY: plain libc queries; cpu_set_t is plain data.
    unsafe {
        let here = libc::sched_getcpu();
        let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
        let mut set: libc::cpu_set_t = core::mem::zeroed();
        let mut any = false;
        for c in 0..n {
            if c as i32 != here {
                libc::CPU_SET(c, &mut set);
                any = true;
            }
        }
        any.then_some(set)
    }
}

/// A prefetch hint for a read that will follow soon.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint and does not fault on any address.
    unsafe {
        core::arch::x86_64::_mm_prefetch(p as *const i8, core::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Resident memory of this process in bytes, from /proc/self/statm (for bytes-per-state).
pub fn resident_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s.split_whitespace().nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page
}

/// Side records: an arena with a free list, in a reserved mapping like the slab, so that it
/// grows by pages as records are used (a Vec's doubling would cost up to a record's size again
/// per state).
pub(crate) struct Side<T: Zeroable> {
    v: Region<T>,
    hwm: u32,
    free: Vec<u32>,
}

impl<T: Zeroable> Side<T> {
    pub(crate) fn new() -> Result<Self, MapError> {
        Ok(Side { v: Region::new(crate::table::MAX_STATES as usize)?, hwm: 0, free: Vec::new() })
    }
    pub(crate) fn alloc(&mut self, x: T) -> u32 {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.hwm += 1;
                self.hwm - 1
            }
        };
        *self.v.get_mut(i as usize) = x;
        i
    }
    pub(crate) fn release(&mut self, i: u32) {
        self.free.push(i);
    }
    #[inline(always)]
    pub(crate) fn get(&self, i: u32) -> &T {
        self.v.get(i as usize)
    }
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, i: u32) -> &mut T {
        self.v.get_mut(i as usize)
    }
    pub(crate) fn bytes(&self) -> usize {
        self.hwm as usize * core::mem::size_of::<T>() + self.free.capacity() * 4
    }
    /// Whether a record was ever taken.
    #[inline(always)]
    pub(crate) fn used(&self) -> bool {
        self.hwm != 0
    }
    #[inline(always)]
    pub(crate) fn prefetch(&self, i: u32) {
        self.v.prefetch(i as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    struct R {
        a: u64,
    }
    unsafe impl Zeroable for R {}

    #[test]
    fn zeroed_and_writable_far_out() {
        let mut r: Region<R> = Region::new(1 << 26).unwrap(); // 512 MiB reserved, untouched
        assert_eq!(r.get(12345).a, 0);
        r.get_mut((1 << 26) - 1).a = 7;
        assert_eq!(r.get((1 << 26) - 1).a, 7);
        r.prefetch(usize::MAX / 64);
    }
}
