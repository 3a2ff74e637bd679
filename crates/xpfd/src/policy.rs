//! The ruleset as a worker sees it: the compiled ruleset in force, taken anew from the reload
//! slot when its generation moves (one atomic load, between batches).

use std::sync::Arc;
use xpf_conf::reload::Slot;
use xpf_conf::Ruleset;
use xpf_engine::{Context, Decision, Policy};
use xpf_state::Dir;
use xpf_wire::PDesc;

pub struct Live {
    slot: Arc<Slot>,
    generation: u64,
    rules: Arc<Ruleset>,
}

impl Live {
    pub fn new(slot: Arc<Slot>) -> Live {
        let (generation, rules) = slot.current();
        Live { slot, generation, rules }
    }

    /// The ruleset in force and its generation.
    pub fn current(&self) -> (u64, &Ruleset) {
        (self.generation, &self.rules)
    }

    /// Takes the new ruleset if one was installed since.
    #[inline]
    pub fn refresh(&mut self) {
        if self.slot.generation() != self.generation {
            (self.generation, self.rules) = self.slot.current();
        }
    }
}

impl Policy for Live {
    fn pool(&self, i: u32) -> Option<&xpf_engine::nat::Pool> {
        self.rules.pool(i)
    }

    fn translation(&self, pd: &PDesc, at: &Context) -> Option<xpf_engine::policy::Xlate> {
        self.rules.translation(pd, at)
    }

    fn limits(&self, i: u32) -> Option<&xpf_state::RuleLimits> {
        self.rules.limits(i)
    }

    fn log_name(&self, rule: u32) -> xpf_engine::LogName {
        self.rules.log_name(rule)
    }

    #[inline]
    fn skip(&self, ifidx: u16) -> bool {
        self.rules.skip(ifidx)
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
}
