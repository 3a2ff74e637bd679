//! The expiry wheel: 128 one-second slots, each a list of state ids to look at in that second.
//!
//! The packet path never touches the wheel: it only writes the state's last-activity time. When
//! a slot comes due, each id in it is checked: expired states go, live ones are filed again at
//! their real deadline (or the wheel's horizon, for long timeouts). Every allocated state is in
//! the wheel exactly once, so the work per second is the number of states due then, never a
//! scan of the table, and the memory is 4 bytes per state.

pub const SLOTS: u32 = 128;
const CHUNK: usize = 254;
const NONE: u32 = u32::MAX;

struct Chunk {
    ids: [u32; CHUNK],
    len: u32,
    next: u32,
}

pub struct Wheel {
    heads: Vec<u32>,
    /// Boxed so that growing the list never copies the 1 KB chunks.
    #[allow(clippy::vec_box)]
    chunks: Vec<Box<Chunk>>,
    free: Vec<u32>,
    /// The next second to process.
    tick: u32,
    /// A slot being processed: (chunk, position in it).
    cur: Option<(u32, u32)>,
    filed: u64,
}

impl Wheel {
    pub fn new(now: u32) -> Wheel {
        Wheel {
            heads: vec![NONE; SLOTS as usize],
            chunks: Vec::new(),
            free: Vec::new(),
            tick: now,
            cur: None,
            filed: 0,
        }
    }

    /// Ids in the wheel.
    pub fn len(&self) -> u64 {
        self.filed
    }

    pub fn is_empty(&self) -> bool {
        self.filed == 0
    }

    pub fn bytes(&self) -> usize {
        self.chunks.len() * core::mem::size_of::<Chunk>() + self.heads.len() * 4
    }

    /// Files `id` to be looked at in second `at` (clamped to the horizon, and to no earlier
    /// than the next second to process).
    pub fn file(&mut self, id: u32, at: u32) {
        let at = at.clamp(self.tick, self.tick + SLOTS - 1);
        let slot = (at % SLOTS) as usize;
        let h = self.heads[slot];
        if h == NONE || self.chunks[h as usize].len as usize == CHUNK {
            let c = match self.free.pop() {
                Some(c) => c,
                None => {
                    self.chunks.push(Box::new(Chunk { ids: [0; CHUNK], len: 0, next: NONE }));
                    (self.chunks.len() - 1) as u32
                }
            };
            let ch = &mut self.chunks[c as usize];
            ch.len = 0;
            ch.next = h;
            self.heads[slot] = c;
        }
        let ch = &mut self.chunks[self.heads[slot] as usize];
        ch.ids[ch.len as usize] = id;
        ch.len += 1;
        self.filed += 1;
    }

    /// Takes the next id due at or before `now`, or None when nothing more is due.
    #[inline]
    pub fn next_due(&mut self, now: u32) -> Option<u32> {
        loop {
            match self.cur {
                Some((c, pos)) => {
                    let ch = &self.chunks[c as usize];
                    if pos < ch.len {
                        self.cur = Some((c, pos + 1));
                        self.filed -= 1;
                        return Some(ch.ids[pos as usize]);
                    }
                    let next = ch.next;
                    self.free.push(c);
                    self.cur = if next == NONE { None } else { Some((next, 0)) };
                }
                None => {
                    if self.tick > now {
                        return None;
                    }
                    let slot = (self.tick % SLOTS) as usize;
                    self.tick += 1;
                    let h = std::mem::replace(&mut self.heads[slot], NONE);
                    if h != NONE {
                        self.cur = Some((h, 0));
                    }
                }
            }
        }
    }

    /// The next second that `next_due` will process.
    pub fn tick(&self) -> u32 {
        self.tick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_in_order_and_clamped() {
        let mut w = Wheel::new(100);
        w.file(1, 105);
        w.file(2, 100);
        w.file(3, 50); // in the past: next tick
        w.file(4, 100 + 10_000); // beyond the horizon: clamped
        for i in 10..1000 {
            w.file(i, 103);
        }
        assert_eq!(w.len(), 994);
        let mut got = Vec::new();
        while let Some(id) = w.next_due(100) {
            got.push(id);
        }
        got.sort();
        assert_eq!(got, vec![2, 3]);
        let mut n = 0;
        while let Some(id) = w.next_due(104) {
            assert!((10..1000).contains(&id));
            n += 1;
        }
        assert_eq!(n, 990);
        assert_eq!(w.next_due(105), Some(1));
        assert_eq!(w.next_due(105 + SLOTS), Some(4));
        assert!(w.is_empty());
        // chunks are reused
        let c = w.chunks.len();
        for i in 0..1000 {
            w.file(i, 300);
        }
        assert_eq!(w.chunks.len(), c);
    }
}
