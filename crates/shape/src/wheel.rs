//! The leaves waiting for their rate to let them send again ([`crate::Shaper`]'s pending
//! tiers): a hashed timing wheel of slots of 65.5 us, one lap [`SLOTS`] slots long (268 ms).
//!
//! With every member backlogged each packet sent moves its leaf out of the tier's ready heap
//! into the waiting ones and, a packet time later, back: with 24,000 members a binary heap of
//! that many entries, out of the caches between two visits, cost most of the shaper's time a
//! frame (`xpf-bench shaper`'s backlogged regime). Here a leaf is filed by an append to its
//! time's slot, and the slots that have passed are read in order. A leaf is taken in the
//! pass after its time's slot has ended: up to a slot late, well within the rates'
//! tolerance ahead ([`crate::TOLERANCE_NS`]), so no rate loses time by it. A time more than a
//! lap ahead sits in its slot until the lap that reaches it.

/// A slot's span: 2^16 ns (65.5 us).
const SHIFT: u32 = 16;
#[cfg(test)]
const SLOT_NS: u64 = 1 << SHIFT;
/// Slots a lap (268 ms).
pub const SLOTS: usize = 4096;
const MASK: u64 = SLOTS as u64 - 1;

pub struct Wheel {
    slots: Vec<Vec<(u64, u32)>>,
    /// Bit i: slot i holds something.
    used: [u64; SLOTS / 64],
    /// The first slot (absolute: time >> SHIFT) not yet read.
    cursor: u64,
    len: usize,
}

impl Default for Wheel {
    fn default() -> Self {
        Wheel { slots: (0..SLOTS).map(|_| Vec::new()).collect(), used: [0; SLOTS / 64], cursor: 0, len: 0 }
    }
}

impl Wheel {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Files `c` to be taken once `t` has passed.
    #[inline]
    pub fn push(&mut self, t: u64, c: u32) {
        // Never into a slot already read: a time already past is taken at the next pass.
        let s = ((t >> SHIFT).max(self.cursor) & MASK) as usize;
        self.slots[s].push((t, c));
        self.used[s / 64] |= 1 << (s % 64);
        self.len += 1;
    }

    /// When something may next be due: the end of the first slot that holds anything (a
    /// slot holding only times of a later lap makes it early, never late), None when empty.
    pub fn next(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let first = self.cursor & MASK;
        (0..SLOTS as u64 / 64 + 1).find_map(|k| {
            // Word by word from the cursor's, the cursor's word again last (its low bits).
            let i = ((first / 64 + k) % (SLOTS as u64 / 64)) as usize;
            let mut w = self.used[i];
            if k == 0 {
                w &= !0 << (first % 64);
            }
            (w != 0).then(|| {
                let s = i as u64 * 64 + w.trailing_zeros() as u64;
                let ahead = (s + SLOTS as u64 - first) & MASK;
                (self.cursor + ahead + 1) << SHIFT
            })
        })
    }

    /// Moves every entry whose slot has ended by `now` (its time passed) to `out`, in slot
    /// order.
    pub fn take_due(&mut self, now: u64, out: &mut Vec<(u64, u32)>) {
        let end = now >> SHIFT;
        if end <= self.cursor {
            return;
        }
        // At most one lap of slots; what is due is what ends before `end` (an entry more
        // than a lap ahead shares its slot with due ones and stays).
        let stop = self.cursor + (end - self.cursor).min(SLOTS as u64);
        let mut s = self.cursor;
        while s < stop && self.len > 0 {
            let i = (s & MASK) as usize;
            let w = self.used[i / 64] >> (i % 64);
            if w == 0 {
                // The rest of this word is empty.
                s += 64 - (i % 64) as u64;
                continue;
            }
            let skip = w.trailing_zeros() as u64;
            if skip > 0 {
                s += skip;
                continue;
            }
            let slot = &mut self.slots[i];
            let before = out.len();
            slot.retain(|&(t, c)| {
                let due = t >> SHIFT < end;
                if due {
                    out.push((t, c));
                }
                !due
            });
            self.len -= out.len() - before;
            if slot.is_empty() {
                self.used[i / 64] &= !(1 << (i % 64));
            }
            s += 1;
        }
        self.cursor = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry is taken once, after its time and within a slot of it, in time order
    /// of their slots (a time already past: the first slot not read), whatever the gaps between the passes (more than a lap among them).
    #[test]
    fn entries_come_once_after_their_time_within_a_slot() {
        let mut w = Wheel::default();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut now = 5 * SLOT_NS + 17;
        // Each entry's time and when it was taken (MAX: not yet).
        let mut filed: Vec<(u64, u64)> = Vec::new();
        let mut due = Vec::new();
        // The wheel's cursor when each entry was filed.
        let mut pushed_at = Vec::new();
        for round in 0..20_000u32 {
            for _ in 0..(rnd() % 4) {
                // Mostly within a lap, some past, some several laps ahead.
                let t = match rnd() % 10 {
                    0 => now.saturating_sub(rnd() % (3 * SLOT_NS)),
                    1 => now + rnd() % (5 * SLOTS as u64 * SLOT_NS),
                    _ => now + rnd() % (SLOTS as u64 * SLOT_NS / 3),
                };
                w.push(t, filed.len() as u32);
                filed.push((t, u64::MAX));
                pushed_at.push(w.cursor);
            }
            now += if round % 1000 == 999 { 2 * SLOTS as u64 * SLOT_NS } else { rnd() % (3 * SLOT_NS) };
            let (next, cursor) = (w.next(), w.cursor);
            due.clear();
            w.take_due(now, &mut due);
            let mut last_slot = 0;
            for &(t, c) in &due {
                assert!(t <= now, "{t} taken at {now}");
                assert_eq!(filed[c as usize], (t, u64::MAX), "entry {c} taken twice");
                // A time already read past was filed in the cursor's slot.
                let slot = (t >> SHIFT).max(cursor);
                assert!(slot >= last_slot || round % 1000 == 999, "slots out of order");
                assert!(next.is_some_and(|n| n <= now), "next {next:?}, an entry due by {now}");
                last_slot = slot;
                filed[c as usize].1 = now;
            }
            if round % 97 == 0 {
                // Nothing left whose slot (its time's, or the first not read when it came) ended.
                for (c, &(t, at)) in filed.iter().enumerate() {
                    let slot = (t >> SHIFT).max(pushed_at[c]);
                    assert!(at != u64::MAX || slot >= (now >> SHIFT), "entry {c} at {t} left at {now}");
                }
                assert_eq!(w.len(), filed.iter().filter(|o| o.1 == u64::MAX).count());
            }
        }
    }
}
