//! Where replaced rulesets are freed. A load swaps the ruleset in force for a new one; the
//! workers take the new one at their next batch and let go of the old. Freeing a ruleset of a
//! million rules (and the parse tree it came from) takes hundreds of milliseconds of frees and
//! unmaps: done by the worker that let go last, it would hold that worker's packets as long,
//! and done by the control thread, it would hold the reply to `xpfctl -f`. One thread here
//! keeps what was replaced until only it holds it, then frees it.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use xpf_conf::reload::Slot;
use xpf_conf::Ruleset;

/// What a load replaced: the compiled ruleset the workers may still hold, and anything that
/// goes with it (the parse tree it was compiled from).
struct Retired {
    ruleset: Arc<Ruleset>,
    _with: Option<Box<dyn Send>>,
    generation: u64,
}

static RETIRE: OnceLock<Mutex<Sender<Retired>>> = OnceLock::new();

/// How often the thread looks whether the workers have let go.
const POLL: Duration = Duration::from_millis(5);

/// Installs `r` in `slot` and hands the ruleset it replaced, with `with`, to the freeing
/// thread; returns the new generation.
pub fn install(slot: &Slot, r: Ruleset, with: Option<Box<dyn Send>>) -> u64 {
    let (generation, ruleset) = slot.install(r);
    retire(Retired { ruleset, _with: with, generation });
    generation
}

fn retire(r: Retired) {
    let tx = RETIRE.get_or_init(|| {
        let (tx, rx) = channel();
        // A thread that cannot start leaves the frees to whoever lets go last (as before).
        let _ = std::thread::Builder::new().name("xpfd-retire".into()).spawn(move || run(rx));
        Mutex::new(tx)
    });
    // With the thread gone (it never is while xpfd runs), `r` is dropped here.
    let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(r);
}

fn run(rx: Receiver<Retired>) {
    let mut held: Vec<Retired> = Vec::new();
    loop {
        let wait = if held.is_empty() { Duration::from_secs(3600) } else { POLL };
        match rx.recv_timeout(wait) {
            Ok(r) => held.push(r),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Oldest first: a worker that has not moved holds every generation before its own.
        while let Some(i) = held.iter().position(|r| Arc::strong_count(&r.ruleset) == 1) {
            let r = held.remove(i);
            let (g, t) = (r.generation, Instant::now());
            drop(r);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            // A large ruleset's load: what xpfd holds once the one it replaced is gone (the
            // allocator keeps freed pages for the next load).
            if ms >= 10.0 {
                let rss = xpf_state::region::resident_bytes() >> 20;
                log::info!("ruleset generation {g}: the one it replaced freed in {ms:.0} ms; xpfd resident {rss} MiB");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notes the name of the thread that drops it.
    struct Witness(Arc<Mutex<Option<String>>>);
    impl Drop for Witness {
        fn drop(&mut self) {
            *self.0.lock().unwrap() = Some(std::thread::current().name().unwrap_or("?").to_string());
        }
    }

    #[test]
    fn the_replaced_ruleset_is_freed_by_the_retire_thread_after_the_workers_move() {
        let ifx = |_: &str| None;
        let compile = |t: &str| Ruleset::compile(&xpf_conf::parse::parse(t, "t.conf", &[]), &ifx).unwrap();
        let slot = Slot::new(compile("block all\n"));
        // A worker holding the ruleset in force when the load comes.
        let worker = slot.current().1;
        let weak = Arc::downgrade(&worker);
        let by = Arc::new(Mutex::new(None));
        assert_eq!(install(&slot, compile("pass all\n"), Some(Box::new(Witness(by.clone())))), 2);
        std::thread::sleep(POLL * 4);
        assert!(by.lock().unwrap().is_none(), "kept while a worker holds the old ruleset");
        // The worker moves on; its drop is not the last.
        drop(worker);
        let t = Instant::now();
        while by.lock().unwrap().is_none() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(POLL);
        }
        assert_eq!(by.lock().unwrap().as_deref(), Some("xpfd-retire"));
        assert!(weak.upgrade().is_none(), "the ruleset went with it");
        assert_eq!(slot.generation(), 2);
        assert!(xpf_state::region::resident_bytes() > 0);
    }
}
