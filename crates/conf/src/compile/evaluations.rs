//! Each rule's evaluations (`pfctl -s rules -v`'s Evaluations), counted per worker.
//!
//! A first packet counts every rule it is tested against. One shared counter per rule took a
//! locked add per rule tested: a full barrier that holds back the loads after it (the next
//! candidate's rule line), and a line the workers take from each other for every rule they
//! both test. Here each worker adds into its own row with a plain load and store (FreeBSD's
//! counter(9) keeps per-CPU counters for the same reason); a reader sums the rows. The rows
//! are made when a worker first counts in the list, so a list costs memory per worker that
//! evaluates it, not per worker the host could run. `pfctl -z` sets a baseline the readers
//! subtract; no row is written by anyone but its worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Rows of their own for workers 0..ROWS-1; the workers from ROWS-1 on share the last row
/// with a locked add, so a count is never lost, whatever the number of workers.
const ROWS: usize = 16;

/// The evaluations of one list of rules.
#[derive(Debug)]
pub struct Evaluations {
    n: usize,
    rows: [OnceLock<Box<[AtomicU64]>>; ROWS],
    /// What the readers subtract (`pfctl -z`), made by the first zeroing.
    base: OnceLock<Box<[AtomicU64]>>,
}

/// `n` counters at 0, allocated zeroed (pages the kernel maps as they are first touched,
/// by the worker that counts in them).
fn zeroed(n: usize) -> Box<[AtomicU64]> {
    if n == 0 {
        return Box::new([]);
    }
    let layout = std::alloc::Layout::array::<AtomicU64>(n).expect("a row of counters fits the address space");
    // SAFETY: the layout is non-zero in size; all-zero bytes are a valid AtomicU64 (it has
    // the size and bit validity of u64); the allocation is handed to a Box of the same
    // layout, which frees it.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<AtomicU64>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n))
    }
}

/// One worker's row, taken once per walk.
pub struct Row<'a> {
    c: &'a [AtomicU64],
    /// The last row, which workers share: a locked add.
    shared: bool,
}

impl Row<'_> {
    /// Rule `i` was tested.
    #[inline(always)]
    pub fn add(&self, i: usize) {
        let c = &self.c[i];
        if self.shared {
            c.fetch_add(1, Ordering::Relaxed);
        } else {
            // Only this worker writes this row: a plain load and store.
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

impl Evaluations {
    pub fn new(n: usize) -> Evaluations {
        Evaluations { n, rows: std::array::from_fn(|_| OnceLock::new()), base: OnceLock::new() }
    }

    /// Worker `worker`'s row (made at its first count).
    #[inline]
    pub fn row(&self, worker: u16) -> Row<'_> {
        let k = (worker as usize).min(ROWS - 1);
        Row { c: self.rows[k].get_or_init(|| zeroed(self.n)), shared: k == ROWS - 1 }
    }

    /// Rule `i`'s count summed over the rows, since the list was made.
    fn counted(&self, i: usize) -> u64 {
        self.rows.iter().filter_map(OnceLock::get).map(|r| r[i].load(Ordering::Relaxed)).sum()
    }

    /// Rule `i`'s evaluations since the list was made or last zeroed.
    pub fn get(&self, i: usize) -> u64 {
        if i >= self.n {
            return 0;
        }
        self.counted(i).wrapping_sub(self.base.get().map_or(0, |b| b[i].load(Ordering::Relaxed)))
    }

    /// Every rule's evaluations, in order.
    pub fn all(&self) -> Vec<u64> {
        (0..self.n).map(|i| self.get(i)).collect()
    }

    /// `pfctl -z`: every rule's evaluations read 0 from now on.
    pub fn zero(&self) {
        let base = self.base.get_or_init(|| zeroed(self.n));
        for (i, b) in base.iter().enumerate() {
            b.store(self.counted(i), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sum_and_zero_sets_a_baseline() {
        let e = Evaluations::new(5);
        assert_eq!(e.all(), vec![0; 5]);
        e.row(0).add(1);
        e.row(0).add(1);
        e.row(3).add(1);
        e.row(3).add(4);
        assert_eq!(e.all(), vec![0, 3, 0, 0, 1]);
        e.zero();
        assert_eq!(e.all(), vec![0; 5]);
        e.row(7).add(4);
        assert_eq!(e.get(4), 1);
        assert_eq!(e.get(5), 0, "past the list");
    }

    /// Workers past the rows of their own share the last one and lose nothing: 40 threads,
    /// each counting 10,000 times into rule 0 through its own worker index.
    #[test]
    fn no_count_is_lost_with_more_workers_than_rows() {
        let e = Evaluations::new(3);
        std::thread::scope(|s| {
            for w in 0..40u16 {
                let e = &e;
                s.spawn(move || {
                    let row = e.row(w);
                    for _ in 0..10_000 {
                        row.add(0);
                    }
                });
            }
        });
        assert_eq!(e.get(0), 400_000);
        assert_eq!(e.get(1), 0);
    }
}
