//! Atomic reload: a new pf.conf is parsed and compiled in full, off the packet path, and
//! installed by swapping one pointer; a file with any error changes nothing. Workers read the
//! generation (one atomic load per batch) and take the new ruleset when it moved.

use crate::{parse, Ruleset};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub struct Slot {
    generation: AtomicU64,
    current: Mutex<Arc<Ruleset>>,
}

impl Slot {
    pub fn new(r: Ruleset) -> Slot {
        Slot { generation: AtomicU64::new(1), current: Mutex::new(Arc::new(r)) }
    }

    /// Parses and compiles `text` (named `file` in errors); installs it only if both succeed,
    /// and returns the new generation. On error the ruleset in force stays, and the errors come
    /// back as `FILE:LINE: message` lines.
    pub fn reload(
        &self,
        text: &str,
        file: &str,
        defines: &[(String, String)],
        ifindex: &dyn Fn(&str) -> Option<u16>,
    ) -> Result<u64, Vec<String>> {
        let p = parse(text, file, defines);
        if !p.errors.is_empty() {
            return Err(p.errors.iter().map(|e| e.to_string()).collect());
        }
        let r = Ruleset::compile(&p, ifindex).map_err(|e| vec![format!("{file}:{}: {}", e.line, e.msg)])?;
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        *cur = Arc::new(r);
        Ok(self.generation.fetch_add(1, Ordering::Release) + 1)
    }

    /// Installs a ruleset compiled elsewhere (the daemon, which keeps the parsed form too);
    /// returns the new generation and the ruleset it replaced. Workers may still hold the old
    /// one until their next batch: whoever drops the last reference frees it, so the daemon
    /// keeps this one until they have moved (a large ruleset takes a while to free, and not on
    /// a worker's time).
    pub fn install(&self, r: Ruleset) -> (u64, Arc<Ruleset>) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut *cur, Arc::new(r));
        (self.generation.fetch_add(1, Ordering::Release) + 1, old)
    }

    /// The generation in force (cheap: for a worker's per-batch check).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The ruleset in force and its generation.
    pub fn current(&self) -> (u64, Arc<Ruleset>) {
        let cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (self.generation(), cur.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpf_engine::{Action, Policy};
    use xpf_state::Dir;
    use xpf_wire::pdesc::{pdf, AF_INET};
    use xpf_wire::{Addr, PDesc};

    #[test]
    fn a_bad_file_changes_nothing() {
        let ifx = |_: &str| None;
        let p = parse("block all\n", "a.conf", &[]);
        let slot = Slot::new(Ruleset::compile(&p, &ifx).unwrap());
        let pd = PDesc {
            src: Addr::v4([1, 1, 1, 1]),
            dst: Addr::v4([2, 2, 2, 2]),
            af: AF_INET,
            proto: 17,
            flags: pdf::HAS_PORTS,
            ..Default::default()
        };
        let verdict = |s: &Slot| s.current().1.evaluate(&pd, 1, Dir::In).action;
        assert_eq!(verdict(&slot), Action::Block);
        let err = slot.reload("pass all\npass in on $nope\n", "b.conf", &[], &ifx).unwrap_err();
        assert_eq!(err, vec!["b.conf:2: macro 'nope' not defined"]);
        assert_eq!(slot.generation(), 1);
        assert_eq!(verdict(&slot), Action::Block, "the old ruleset stays in force");
        // Parses, but names a queue no line declares: refused at compile, nothing changes.
        let err = slot.reload("pass\npass out set queue nope\n", "c.conf", &[], &ifx).unwrap_err();
        assert_eq!(err, vec!["c.conf:2: queue nope is not defined"]);
        assert_eq!(slot.generation(), 1);
        assert_eq!(slot.reload("pass all\n", "d.conf", &[], &ifx), Ok(2));
        assert_eq!(verdict(&slot), Action::Pass);
    }
}
