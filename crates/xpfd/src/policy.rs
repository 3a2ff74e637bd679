//! The ruleset as a worker sees it: the compiled ruleset in force, taken anew from the reload
//! slot when its generation moves (one atomic load, between batches).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use xpf_conf::reload::Slot;
use xpf_conf::Ruleset;
use xpf_engine::{Context, Decision, Policy};
use xpf_state::Dir;
use xpf_wire::PDesc;

/// pf's status (`pfctl -e`, `-d`): enabled, every packet filtered; or disabled, every packet
/// passing unfiltered, without states or translation, as `set skip` on every interface (the
/// states stay, and expire on their timeouts). Since when, for `-s info`.
pub struct Status {
    enabled: AtomicBool,
    since: Mutex<Instant>,
}

impl Status {
    pub fn new() -> Status {
        Status { enabled: AtomicBool::new(true), since: Mutex::new(Instant::now()) }
    }

    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Enables (true) or disables; false when it already was so (pfctl's "pf already enabled",
    /// "pf not enabled").
    pub fn set(&self, on: bool) -> bool {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if self.enabled.swap(on, Ordering::Relaxed) == on {
            return false;
        }
        *since = Instant::now();
        true
    }

    /// Whether enabled, and for how many seconds it has been as it is.
    pub fn now(&self) -> (bool, u64) {
        let since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        (self.enabled(), since.elapsed().as_secs())
    }
}

impl Default for Status {
    fn default() -> Self {
        Status::new()
    }
}

pub struct Live {
    slot: Arc<Slot>,
    generation: u64,
    rules: Arc<Ruleset>,
    status: Arc<Status>,
}

impl Live {
    pub fn new(slot: Arc<Slot>, status: Arc<Status>) -> Live {
        let (generation, rules) = slot.current();
        Live { slot, generation, rules, status }
    }

    /// pf's status: disabled, nothing is filtered.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.status.enabled()
    }

    /// The ruleset in force and its generation.
    pub fn current(&self) -> (u64, &Ruleset) {
        (self.generation, &self.rules)
    }

    /// The ruleset in force, held (for work that outlives a round).
    pub fn ruleset(&self) -> Arc<Ruleset> {
        self.rules.clone()
    }

    /// Whether a new ruleset was installed since this one was taken.
    #[inline]
    pub fn stale(&self) -> bool {
        self.slot.generation() != self.generation
    }

    /// Takes the new ruleset if one was installed since: true when it did.
    #[inline]
    pub fn refresh(&mut self) -> bool {
        if self.slot.generation() != self.generation {
            (self.generation, self.rules) = self.slot.current();
            return true;
        }
        false
    }
}

impl Policy for Live {
    fn pool(&self, i: u32) -> Option<&xpf_engine::nat::Pool> {
        self.rules.pool(i)
    }

    fn pools(&self) -> &[xpf_engine::nat::Pool] {
        self.rules.pools()
    }

    fn translation(&self, pd: &PDesc, at: &Context) -> Option<xpf_engine::policy::Xlate> {
        self.rules.translation(pd, at)
    }

    fn limits(&self, i: u32) -> Option<&xpf_state::RuleLimits> {
        self.rules.limits(i)
    }

    fn route(&self, i: u16) -> Option<&xpf_engine::RouteTarget> {
        self.rules.route(i)
    }

    fn log_name(&self, rule: u32) -> xpf_engine::LogName {
        self.rules.log_name(rule)
    }

    /// Disabled: every interface as `set skip` (one load a batch).
    #[inline]
    fn skip(&self, ifidx: u16) -> bool {
        !self.status.enabled() || self.rules.skip(ifidx)
    }

    #[inline]
    fn evaluate(&self, pd: &PDesc, ifidx: u16, dir: Dir) -> Decision {
        self.rules.evaluate(pd, ifidx, dir)
    }

    #[inline]
    fn evaluate_in(&self, pd: &PDesc, at: &Context) -> Decision {
        self.rules.evaluate_in(pd, at)
    }

    #[inline]
    fn rate_exceeded(&self, meter: u32, now: u32) -> bool {
        self.rules.rate_exceeded(meter, now)
    }

    #[inline]
    fn wants_random(&self) -> bool {
        self.rules.wants_random()
    }

    #[inline]
    fn packet_scrubs(&self) -> bool {
        self.rules.packet_scrubs()
    }

    fn packet_scrub(&self, pd: &PDesc, at: &Context) -> xpf_engine::Scrub {
        self.rules.packet_scrub(pd, at)
    }
}

#[cfg(test)]
mod tests {
    use super::Status;

    #[test]
    fn status_changes_once_each_way() {
        let s = Status::new();
        assert!(s.now().0);
        assert!(!s.set(true), "already enabled");
        assert!(s.set(false));
        assert!(!s.set(false), "not enabled");
        assert!(!s.enabled());
        assert!(s.set(true));
        assert!(s.enabled());
    }
}
