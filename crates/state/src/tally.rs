//! Each rule's packets, bytes and states as pf counts them (`pfctl -s rules -v`, `-s labels`):
//! since the ruleset was loaded, in and out.
//!
//! pf adds every packet to its rule as it passes. Here a state carries its own packets (the
//! engine counts them there, and the kernel's fast path counts the flows it forwards, read
//! back into the states), so a rule's count is made of three parts: the states in the table
//! now (summed by a reader's walk), the states that ended (folded in here as each is taken
//! out), and the packets the rule decided without making a state (a `block`, a `no state`
//! pass), added here as they are decided. The last two are this table's [`RuleTally`].

use std::collections::HashMap;

/// One rule's counts, pf's `pf_rule` counters: `packets[0]`/`bytes[0]` in, `[1]` out (the
/// interface's direction, as pf's `dirndx`), `states` the states in the table now (pf's
/// `states_cur`), `created` the states it made (`states_tot`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RuleCount {
    pub packets: [u64; 2],
    pub bytes: [u64; 2],
    pub states: u64,
    pub created: u64,
}

impl RuleCount {
    /// A state's packets (`packets`, `bytes`: from the creator, towards it), its creator's
    /// going `out` or in: the creator's count in its direction, the replies' in the other.
    #[inline]
    pub fn add_state(&mut self, out: bool, packets: [u32; 2], bytes: [u64; 2]) {
        let d = out as usize;
        self.packets[d] += packets[0] as u64;
        self.bytes[d] += bytes[0];
        self.packets[d ^ 1] += packets[1] as u64;
        self.bytes[d ^ 1] += bytes[1];
    }

    /// One packet of `len` bytes going `out` or in.
    #[inline]
    pub fn add_packet(&mut self, out: bool, len: u64) {
        self.packets[out as usize] += 1;
        self.bytes[out as usize] += len;
    }

    /// Takes `o`'s packets, bytes and creations out (what was counted twice).
    pub fn take(&mut self, o: &RuleCount) {
        for d in 0..2 {
            self.packets[d] = self.packets[d].saturating_sub(o.packets[d]);
            self.bytes[d] = self.bytes[d].saturating_sub(o.bytes[d]);
        }
        self.created = self.created.saturating_sub(o.created);
    }

    pub fn merge(&mut self, o: &RuleCount) {
        for d in 0..2 {
            self.packets[d] += o.packets[d];
            self.bytes[d] += o.bytes[d];
        }
        self.states += o.states;
        self.created += o.created;
    }

    /// The packets and bytes since `base` was read (`pfctl -z`): `states` and `created` are
    /// kept, as pf keeps them.
    pub fn since(mut self, base: &RuleCount) -> RuleCount {
        self.take(&RuleCount { created: 0, ..*base });
        self
    }
}

/// Per rule number, [`RuleCount`]s.
pub type RuleCounts = HashMap<u32, RuleCount, foldhash::fast::FixedState>;

/// A table's part of its rules' counts: the states that ended and the packets decided
/// without a state, per rule number. A rule's entry is made at its first count.
///
/// A rule counts from its load, as pf's: a state keeps the number of the rule that made it,
/// and a load gives numbers to other rules, so each list of rules in force
/// ([`RuleTally::follow`]) notes when it came (the engine's second and the table's state
/// sequence then), and a state made before its rule's list came counts for none of the rules
/// in force (pf's state keeps pointing at the rule it had, which no listing shows).
#[derive(Debug, Default)]
pub struct RuleTally {
    /// Rules numbered below [`DENSE`], by number (grown to the highest counted): an ending
    /// state's count is an add at its rule's place, no hash (bench-results "Rules counted as
    /// pf counts them").
    dense: Vec<RuleCount>,
    /// The others (a large ruleset's last rules, anchors loaded at run time).
    counts: RuleCounts,
    /// The lists of rules in force, by their lowest rule number: (lowest, highest, identity,
    /// (second, sequence) of the last state made before the list came).
    lists: Vec<(u32, u32, usize, (u32, u32))>,
    /// A reader's walk of the table in progress ([`RuleTally::walk_begin`]): the slots below
    /// this it has visited.
    walked: Option<u32>,
    /// What the states the walk visited carried when they ended since: in its sums already.
    during: RuleCounts,
}

/// Rules numbered below this are counted in [`RuleTally`]'s dense rows (48 bytes a rule, at
/// most 3 MiB a table).
const DENSE: u32 = 1 << 16;

impl RuleTally {
    #[inline]
    fn count(&mut self, rule: u32) -> &mut RuleCount {
        if rule < DENSE {
            let i = rule as usize;
            if i >= self.dense.len() {
                self.dense.resize((i + 1).next_power_of_two().min(DENSE as usize), RuleCount::default());
            }
            &mut self.dense[i]
        } else {
            self.counts.entry(rule).or_default()
        }
    }

    /// Whether a state of rule `rule` made at second `creation` with sequence `seq` is one of
    /// that rule's, in the lists of rules in force (every state is, before the first
    /// [`follow`](Self::follow)).
    #[inline]
    pub fn counts(&self, rule: u32, creation: u32, seq: u32) -> bool {
        if self.lists.is_empty() {
            return true;
        }
        let i = self.lists.partition_point(|l| l.0 <= rule);
        let Some(&(_, hi, _, (at, at_seq))) = i.checked_sub(1).map(|i| &self.lists[i]) else { return false };
        // Within one second fewer than 2^31 states are made: the sequence compares there.
        rule <= hi && (creation > at || (creation == at && (seq.wrapping_sub(at_seq) as i32) > 0))
    }

    /// The lists of rules in force are now `lists` ((identity, lowest, highest rule number));
    /// the table is at second `now` and state sequence `seq`. A list that stays keeps its
    /// counts and its start; a new one starts now; the counts of the lists gone go.
    pub fn follow(&mut self, lists: &[(usize, u32, u32)], now: u32, seq: u32) {
        let old = std::mem::take(&mut self.lists);
        self.lists = lists
            .iter()
            .map(|&(id, lo, hi)| {
                let at = old.iter().find(|o| o.2 == id).map_or((now, seq), |o| o.3);
                (lo, hi, id, at)
            })
            .collect();
        self.lists.sort_unstable_by_key(|l| l.0);
        let gone: Vec<_> = old.iter().filter(|o| !lists.iter().any(|l| l.0 == o.2)).map(|o| (o.0, o.1)).collect();
        if !gone.is_empty() {
            let kept = |r: u32| !gone.iter().any(|&(lo, hi)| (lo..=hi).contains(&r));
            self.counts.retain(|r, _| kept(*r));
            for (r, c) in self.dense.iter_mut().enumerate() {
                if !kept(r as u32) {
                    *c = RuleCount::default();
                }
            }
        }
    }

    /// A state of rule `rule` ended: its packets stay with the rule. A rule with a row made
    /// is an add in place (few instructions: a removal waits on its index row's cache miss,
    /// and a longer removal leaves fewer of those misses in flight at once); the rest out of
    /// line.
    /// `id` is the state's slot (see [`walk_begin`](Self::walk_begin)).
    #[inline]
    pub fn ended(&mut self, id: u32, rule: u32, out: bool, packets: [u32; 2], bytes: [u64; 2]) {
        match self.dense.get_mut(rule as usize) {
            Some(c) => {
                c.add_state(out, packets, bytes);
                c.created += 1;
            }
            None => self.ended_new(rule, out, packets, bytes),
        }
        if self.walked.is_some_and(|w| id < w) {
            self.ended_walked(rule, out, packets, bytes);
        }
    }

    #[inline(never)]
    #[cold]
    fn ended_walked(&mut self, rule: u32, out: bool, packets: [u32; 2], bytes: [u64; 2]) {
        let c = self.during.entry(rule).or_default();
        c.add_state(out, packets, bytes);
        c.created += 1;
    }

    /// A reader starts a walk of the table's slots in order, summing the states it visits
    /// (a slice at a time, with packets going between): [`walk_at`](Self::walk_at) says how
    /// far it went, [`walk_end`](Self::walk_end) gives its sums the tally. A state the walk
    /// visited that ends before it is done is then counted once (as the walk saw it), not
    /// again in the tally: a rule's figure never goes down from one read to the next
    /// (Prometheus takes a counter that goes down for a reset).
    pub fn walk_begin(&mut self) {
        self.walked = Some(0);
        self.during.clear();
    }

    /// The walk has visited the slots below `slot`.
    pub fn walk_at(&mut self, slot: u32) {
        self.walked = Some(slot);
    }

    /// The walk is done: adds the tally to its sums `into` (but what the states it visited
    /// carried when they ended since, already there).
    pub fn walk_end(&mut self, into: &mut RuleCounts) {
        self.add_to(into);
        for (r, d) in self.during.drain() {
            if let Some(c) = into.get_mut(&r) {
                c.take(&d);
            }
        }
        self.walked = None;
    }

    #[inline(never)]
    #[cold]
    fn ended_new(&mut self, rule: u32, out: bool, packets: [u32; 2], bytes: [u64; 2]) {
        let c = self.count(rule);
        c.add_state(out, packets, bytes);
        c.created += 1;
    }

    /// Rule `rule` decided a packet of `len` bytes going `out` or in without a state (as
    /// [`ended`](Self::ended): an add in place once the rule has a row).
    #[inline]
    pub fn decided(&mut self, rule: u32, out: bool, len: u64) {
        match self.dense.get_mut(rule as usize) {
            Some(c) => c.add_packet(out, len),
            None => self.decided_new(rule, out, len),
        }
    }

    #[inline(never)]
    #[cold]
    fn decided_new(&mut self, rule: u32, out: bool, len: u64) {
        self.count(rule).add_packet(out, len);
    }

    /// Adds the tally into `to`.
    pub fn add_to(&self, to: &mut RuleCounts) {
        let none = RuleCount::default();
        let dense = self.dense.iter().enumerate().filter(|(_, c)| **c != none).map(|(r, c)| (r as u32, c));
        for (r, c) in dense.chain(self.counts.iter().map(|(r, c)| (*r, c))) {
            to.entry(r).or_default().merge(c);
        }
    }

    pub fn clear(&mut self) {
        self.dense.clear();
        self.counts.clear();
    }

    /// Rule `rule`'s tally (None: nothing counted).
    pub fn get(&self, rule: u32) -> Option<&RuleCount> {
        if rule < DENSE {
            self.dense.get(rule as usize).filter(|c| **c != RuleCount::default())
        } else {
            self.counts.get(&rule)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_counts_its_creator_in_its_direction_and_replies_in_the_other() {
        let mut t = RuleTally::default();
        // An inbound state: 3 packets in (300 bytes), 2 replies out (100).
        t.ended(0, 7, false, [3, 2], [300, 100]);
        // An outbound one of the same rule: 1 out (40), 4 replies in (400).
        t.ended(0, 7, true, [1, 4], [40, 400]);
        t.decided(7, false, 60);
        t.decided(9, true, 52);
        t.decided(1 << 31, true, 52);
        let c = t.get(7).copied().unwrap_or_default();
        assert_eq!(c.packets, [3 + 4 + 1, 2 + 1]);
        assert_eq!(c.bytes, [300 + 400 + 60, 100 + 40]);
        assert_eq!((c.states, c.created), (0, 2));
        let mut all = RuleCounts::default();
        t.add_to(&mut all);
        t.add_to(&mut all);
        assert_eq!(all[&9].packets, [0, 2]);
        assert_eq!((all[&(1 << 31)].packets, all.len()), ([0, 2], 3), "a sparse rule, and no empty row");
        assert_eq!(all[&9].created, 0, "a packet decided without a state made none");
        let z = all[&7].since(&c);
        assert_eq!((z.packets, z.bytes, z.created), (c.packets, c.bytes, 4), "-z keeps the creations");
        t.clear();
        assert!(t.get(7).is_none());
    }

    /// A load: the lists that stay keep their counts and start, a new list starts then, and
    /// a state made before its rule's list came is not that rule's.
    #[test]
    fn a_rule_counts_the_states_made_since_its_list_came() {
        let mut t = RuleTally::default();
        assert!(t.counts(3, 0, 1), "every state counts before any list is followed");
        // The main ruleset (rules 0-9) from second 5, sequence 100.
        t.follow(&[(1, 0, 9)], 5, 100);
        t.ended(0, 3, false, [1, 0], [10, 0]);
        assert!(!t.counts(3, 4, 500), "made a second before");
        assert!(!t.counts(3, 5, 100) && t.counts(3, 5, 101), "the same second: by sequence");
        assert!(t.counts(3, 6, 7), "a later second, whatever the sequence");
        assert!(!t.counts(10, 6, 7), "a number no list holds");
        // An anchor (rules 1000-1004) loaded at second 8; the main list stays.
        t.follow(&[(1, 0, 9), (2, 1000, 1004)], 8, 300);
        assert!(t.counts(3, 6, 7) && !t.counts(1002, 6, 7) && t.counts(1002, 9, 0));
        t.ended(0, 1002, true, [1, 1], [5, 5]);
        assert_eq!(t.get(3).map(|c| c.packets), Some([1, 0]));
        // The main ruleset reloaded (a new list 3): its counts go, the anchor's stay.
        t.follow(&[(3, 0, 9), (2, 1000, 1004)], 12, 400);
        assert!(t.get(3).is_none() && t.get(1002).is_some());
        assert!(!t.counts(3, 6, 7) && t.counts(1002, 9, 0));
    }

    /// A walk's read counts a state that ends while it goes once: as the walk saw it if the
    /// walk had visited its slot, in the tally if not.
    #[test]
    fn a_walk_counts_a_state_that_ends_meanwhile_once() {
        let mut t = RuleTally::default();
        t.ended(9, 1, false, [1, 0], [10, 0]);
        t.walk_begin();
        // The walk visits slots 0-99: the state in slot 5 has 2 packets then.
        let mut sums = RuleCounts::default();
        sums.entry(1).or_default().add_state(false, [2, 0], [20, 0]);
        sums.entry(1).or_default().created += 1;
        t.walk_at(100);
        // Slot 5's state ends with 3 packets; slot 200's (not visited) with 4.
        t.ended(5, 1, false, [3, 0], [30, 0]);
        t.ended(200, 1, false, [4, 0], [40, 0]);
        t.walk_end(&mut sums);
        let c = sums[&1];
        assert_eq!((c.packets, c.bytes, c.created), ([1 + 2 + 4, 0], [70, 0], 3));
        // The next read, with nothing to walk: the ended states as they ended.
        let mut next = RuleCounts::default();
        t.walk_begin();
        t.walk_end(&mut next);
        assert_eq!((next[&1].packets, next[&1].created), ([1 + 3 + 4, 0], 3), "not less than before");
        t.ended(5, 1, false, [1, 0], [1, 0]);
        assert!(t.during.is_empty(), "no walk: nothing set aside");
    }
}
