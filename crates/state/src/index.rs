//! The state index: rows of 64-byte buckets, each holding ten (tag, ref) slots, with overflow
//! buckets chained from a row that fills up.
//!
//! A lookup reads one cache line for the row and one for the entry its tag points to. Tags are
//! 15 bits of the hash (bit 0 set, so 0 means empty) and are compared ten at a time with SSE2;
//! the false-match rate at the automatic load (6 per row) is about 2e-4 per lookup. Overflow
//! chains keep the table correct at any load, so a hash that is far too small degrades the way
//! pf's does (longer rows) instead of refusing states; the `hashsize` bench shows the curve.

use crate::region::{prefetch, MapError, Region, Zeroable};

pub const SLOTS: usize = 10;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Bucket {
    /// 0..20: tags, 0 = empty slot.
    tags: [u16; SLOTS],
    /// 20..24: overflow bucket index + 1, 0 = end of chain.
    next: u32,
    /// 24..64: state refs.
    refs: [u32; SLOTS],
}
const _: () = assert!(core::mem::size_of::<Bucket>() == 64);
// SAFETY: plain integers; all-zero is an empty bucket.
unsafe impl Zeroable for Bucket {}

const EMPTY: Bucket = Bucket { tags: [0; SLOTS], next: 0, refs: [0; SLOTS] };

#[inline(always)]
pub fn tag_of(h: u64) -> u16 {
    ((h >> 48) as u16) | 1
}

/// Bit mask of the slots whose tag equals `tag`.
#[inline(always)]
fn match_tags(b: &Bucket, tag: u16) -> u32 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: Bucket is 64-byte aligned, so both 16-byte loads are aligned and in bounds; SSE2
    // is part of x86_64.
    unsafe {
        use core::arch::x86_64::*;
        let t = _mm_set1_epi16(tag as i16);
        let p = b as *const Bucket as *const __m128i;
        let lo = _mm_cmpeq_epi16(_mm_load_si128(p), t);
        let hi = _mm_cmpeq_epi16(_mm_load_si128(p.add(1)), t);
        (_mm_movemask_epi8(_mm_packs_epi16(lo, hi)) as u32) & ((1 << SLOTS) - 1)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut m = 0;
        for (i, &x) in b.tags.iter().enumerate() {
            m |= ((x == tag) as u32) << i;
        }
        m
    }
}

/// What the pipelined first probe found in a row.
pub enum Probe {
    /// No slot matches and the row has no overflow: the key is not here.
    Miss,
    /// The first slot whose tag matches; the caller compares the key.
    Candidate(u32),
    /// Nothing in the first bucket but the row overflows: walk it with `find`.
    Chain,
}

pub struct Index {
    rows: Region<Bucket>,
    nrows: u32,
    overflow: Vec<Bucket>,
    free_overflow: Vec<u32>,
    used: u64,
}

impl Index {
    /// A new index. `populate` faults every row in now (a table's first index: every row is
    /// touched at random soon enough, better at startup than per packet); an index made for an
    /// online resize is not, or the worker would stall for the whole populate.
    pub fn new(nrows: u32, populate: bool) -> Result<Index, MapError> {
        let nrows = nrows.max(1);
        let rows = Region::new(nrows as usize)?;
        if populate {
            rows.populate(nrows as usize);
        }
        Ok(Index { rows, nrows, overflow: Vec::new(), free_overflow: Vec::new(), used: 0 })
    }

    /// Faults in `n` rows from `start` (a resize prepares its new index this way, a little per
    /// maintenance call, so that no single call pays for all of it).
    pub fn populate_rows(&self, start: u32, n: u32) {
        self.rows.populate_range(start as usize, n as usize);
    }

    #[inline(always)]
    pub fn nrows(&self) -> u32 {
        self.nrows
    }

    /// Refs stored (one per state, two for a state whose keys differ).
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn overflow_buckets(&self) -> usize {
        self.overflow.len() - self.free_overflow.len()
    }

    /// Faults every row in on a helper thread (see `Region::populate_in_background`).
    pub fn populate_in_background(&self) -> std::io::Result<std::thread::JoinHandle<()>> {
        self.rows.populate_in_background()
    }

    /// Bytes of the first `rows` rows (an index being prepared).
    pub fn populated_bytes(&self, rows: u32) -> usize {
        rows.min(self.nrows) as usize * 64
    }

    pub fn bytes(&self) -> usize {
        (self.nrows as usize + self.overflow.capacity()) * 64
    }

    /// The row of a hash: Lemire's multiply-shift, so any row count works (rows need not be a
    /// power of two, which would waste up to half the index).
    #[inline(always)]
    pub fn row_of(&self, h: u64) -> u32 {
        (((h as u32) as u64 * self.nrows as u64) >> 32) as u32
    }

    #[inline(always)]
    pub fn prefetch(&self, h: u64) {
        prefetch(self.rows.as_ptr().wrapping_add(self.row_of(h) as usize) as *const u8);
    }

    #[inline(always)]
    fn bucket(&self, b: u32) -> &Bucket {
        if b < self.nrows {
            // SAFETY: b < nrows == capacity.
            unsafe { self.rows.get_unchecked(b as usize) }
        } else {
            &self.overflow[(b - self.nrows) as usize]
        }
    }

    #[inline(always)]
    fn bucket_mut(&mut self, b: u32) -> &mut Bucket {
        if b < self.nrows {
            // SAFETY: b < nrows == capacity.
            unsafe { self.rows.get_unchecked_mut(b as usize) }
        } else {
            &mut self.overflow[(b - self.nrows) as usize]
        }
    }

    /// First probe of the row, for the lookup pipeline.
    #[inline(always)]
    pub fn probe(&self, h: u64) -> Probe {
        let b = self.bucket(self.row_of(h));
        let m = match_tags(b, tag_of(h));
        if m != 0 {
            Probe::Candidate(b.refs[m.trailing_zeros() as usize])
        } else if b.next != 0 {
            Probe::Chain
        } else {
            Probe::Miss
        }
    }

    /// Walks the row and its overflow chain; `is` decides whether a ref with a matching tag is
    /// the key sought.
    #[inline]
    pub fn find(&self, h: u64, mut is: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = tag_of(h);
        let mut b = self.row_of(h);
        loop {
            let bk = self.bucket(b);
            let mut m = match_tags(bk, tag);
            while m != 0 {
                let i = m.trailing_zeros() as usize;
                if is(bk.refs[i]) {
                    return Some(bk.refs[i]);
                }
                m &= m - 1;
            }
            if bk.next == 0 {
                return None;
            }
            b = self.nrows + bk.next - 1;
        }
    }

    /// Adds `r` under hash `h`; chains an overflow bucket when the row is full.
    pub fn insert(&mut self, h: u64, r: u32) {
        let tag = tag_of(h);
        let nrows = self.nrows;
        let mut b = self.row_of(h);
        self.used += 1;
        loop {
            let bk = self.bucket_mut(b);
            let m = match_tags(bk, 0);
            if m != 0 {
                let i = m.trailing_zeros() as usize;
                bk.tags[i] = tag;
                bk.refs[i] = r;
                return;
            }
            if bk.next == 0 {
                let o = match self.free_overflow.pop() {
                    Some(o) => o,
                    None => {
                        self.overflow.push(EMPTY);
                        (self.overflow.len() - 1) as u32
                    }
                };
                self.bucket_mut(b).next = o + 1;
                b = nrows + o;
            } else {
                b = nrows + bk.next - 1;
            }
        }
    }

    /// Empties the index at once: every row zeroed, the overflow buckets dropped.
    pub fn clear(&mut self) {
        self.rows.zero(self.nrows as usize);
        self.overflow.clear();
        self.free_overflow.clear();
        self.used = 0;
    }

    /// Removes `r` stored under hash `h`. Returns false if it was not there. An overflow bucket
    /// that becomes empty is unlinked and kept for reuse.
    pub fn remove(&mut self, h: u64, r: u32) -> bool {
        let tag = tag_of(h);
        let nrows = self.nrows;
        let mut prev: Option<u32> = None;
        let mut b = self.row_of(h);
        loop {
            let bk = self.bucket_mut(b);
            let mut m = match_tags(bk, tag);
            while m != 0 {
                let i = m.trailing_zeros() as usize;
                if bk.refs[i] == r {
                    bk.tags[i] = 0;
                    bk.refs[i] = 0;
                    let (empty, next) = (match_tags(bk, 0) == (1 << SLOTS) - 1, bk.next);
                    self.used -= 1;
                    if empty {
                        if let Some(p) = prev {
                            self.bucket_mut(p).next = next;
                            *self.bucket_mut(b) = EMPTY;
                            self.free_overflow.push(b - self.nrows);
                        }
                    }
                    return true;
                }
                m &= m - 1;
            }
            if bk.next == 0 {
                return false;
            }
            prev = Some(b);
            b = nrows + bk.next - 1;
        }
    }

    /// Every ref of row `row` and its chain (for migration to a larger index).
    pub fn row_refs(&self, row: u32, mut f: impl FnMut(u32)) {
        let mut b = row;
        loop {
            let bk = self.bucket(b);
            for i in 0..SLOTS {
                if bk.tags[i] != 0 {
                    f(bk.refs[i]);
                }
            }
            if bk.next == 0 {
                return;
            }
            b = self.nrows + bk.next - 1;
        }
    }

    /// Longest chain in buckets, over all rows (diagnostics; scans the index).
    pub fn longest_chain(&self) -> u32 {
        (0..self.nrows)
            .map(|r| {
                let mut n = 1;
                let mut b = self.bucket(r);
                while b.next != 0 {
                    n += 1;
                    b = &self.overflow[(b.next - 1) as usize];
                }
                n
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_find_remove_with_chains() {
        let mut ix = Index::new(2, true).unwrap();
        // 100 refs in 2 rows: long chains.
        let h = |i: u32| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..100 {
            ix.insert(h(i), i);
        }
        assert_eq!(ix.used(), 100);
        assert!(ix.overflow_buckets() > 0);
        for i in 0..100 {
            assert_eq!(ix.find(h(i), |r| r == i), Some(i));
        }
        assert_eq!(ix.find(h(1000), |r| r == 1000), None);
        for i in 0..100 {
            assert!(ix.remove(h(i), i), "remove {i}");
        }
        assert!(!ix.remove(h(5), 5));
        assert_eq!(ix.used(), 0);
        assert_eq!(ix.overflow_buckets(), 0);
        for i in 0..100 {
            assert_eq!(ix.find(h(i), |r| r == i), None);
        }
    }

    #[test]
    fn tag_zero_is_never_produced() {
        assert_eq!(tag_of(0), 1);
        assert_eq!(tag_of(u64::MAX), 0xffff);
    }
}
