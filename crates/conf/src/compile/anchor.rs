//! Anchors loaded at run time (`xpfctl -a NAME -f FILE`): each is a ruleset of its own (its
//! rules, skip steps or classifier, evaluations), found through the slot of the main ruleset's
//! anchor rules that name it, so that replacing one compiles only its own rules. The main
//! ruleset's inline bodies stay flat in its list (one classifier over all of them, measured
//! fastest); rules loaded into such an anchor are evaluated in place of its body until the
//! main ruleset is loaded again, which brings its own definition back, as pfctl -f does.

use super::*;
use std::collections::BTreeMap;

/// The rules loaded into one anchor at run time.
#[derive(Debug, Clone)]
pub(crate) struct Anchored {
    pub(super) list: List,
    /// The number of its first rule (states and counters name rules by number).
    first_nr: u32,
    /// Its rules' names in pflog (their inline anchors' included).
    log: Arc<RuleLog>,
}

/// What pflog names a list's rules by (pf numbers each ruleset from 0, and an anchor's rules
/// are logged with the anchor's path): per rule, its number in its ruleset and the index of
/// the anchor rule whose body holds it (u32::MAX: none); per anchor rule, the path of the
/// ruleset it opens. Built only for lists with anchors (without, a rule's number is its index).
#[derive(Debug, Default)]
pub(super) struct RuleLog {
    own: Vec<u32>,
    outer: Vec<u32>,
    paths: HashMap<u32, String>,
}

impl RuleLog {
    /// For `rules` (parsed, one list) in the ruleset at `path` ("": the main one).
    pub(super) fn of(rules: &[Rule], path: &str) -> Option<RuleLog> {
        if !rules.iter().any(|r| r.opens) {
            return None;
        }
        let mut l = RuleLog {
            own: Vec::with_capacity(rules.len()),
            outer: Vec::with_capacity(rules.len()),
            ..RuleLog::default()
        };
        // Per depth: rules counted, unnamed anchors counted (pfctl names them _1, _2, ...);
        // the anchor rules open around the rule.
        let (mut counts, mut unnamed, mut open): (Vec<u32>, Vec<u32>, Vec<u32>) = (vec![0], vec![0], Vec::new());
        for (i, r) in rules.iter().enumerate() {
            let d = r.depth as usize;
            for v in [&mut counts, &mut unnamed] {
                v.resize(d + 1, 0);
            }
            open.truncate(d);
            l.own.push(counts[d]);
            counts[d] += 1;
            l.outer.push(open.last().copied().unwrap_or(u32::MAX));
            if r.opens {
                let parent = open.last().map_or(path, |&a| l.paths[&a].as_str());
                let name = match r.anchor.as_deref() {
                    Some(n) if !n.is_empty() => n.to_string(),
                    _ => {
                        unnamed[d] += 1;
                        format!("_{}", unnamed[d])
                    }
                };
                let full = if parent.is_empty() { name } else { format!("{parent}/{name}") };
                l.paths.insert(i as u32, full);
                open.push(i as u32);
                counts.push(0);
                unnamed.push(0);
            }
        }
        Some(l)
    }

    /// Rule `i`: its number in its ruleset, and for a rule in an anchor, the outermost anchor
    /// rule around it and the path of the innermost.
    fn name(&self, i: usize) -> (u32, Option<(u32, &str)>) {
        match self.outer[i] {
            u32::MAX => (self.own[i], None),
            a => {
                // pf logs the main ruleset's anchor rule: the outermost one.
                let mut top = a;
                while self.outer[top as usize] != u32::MAX {
                    top = self.outer[top as usize];
                }
                (self.own[i], Some((top, self.paths[&a].as_str())))
            }
        }
    }
}

/// The main ruleset's named anchors and what is loaded into them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Anchors {
    /// Each named anchor's path: its slot, and whether the main ruleset gives it a body.
    pub(super) slots: Arc<HashMap<String, (u32, bool)>>,
    /// Per slot, the index of the first anchor rule naming it (pflog names its rules by it).
    first: Arc<Vec<u32>>,
    /// Every anchor loaded at run time, by path (referenced by the main ruleset or not yet).
    pub(super) loaded: Arc<BTreeMap<String, Arc<Anchored>>>,
    /// By slot: the rulesets its anchor rules evaluate (one; a wildcard's children in name
    /// order; none: the body in the main ruleset).
    pub(super) by_slot: Arc<Vec<Vec<Arc<Anchored>>>>,
}

impl Anchors {
    /// `slots`: each named anchor's path, its slot, whether the main ruleset gives it a body;
    /// `first`: per slot, the index of the first anchor rule naming it.
    pub(super) fn new(slots: HashMap<String, (u32, bool)>, first: Vec<u32>) -> Anchors {
        Anchors { slots: Arc::new(slots), first: Arc::new(first), ..Anchors::default() }
    }

    /// What the anchor at slot path `at` evaluates: the anchor loaded there, or for `P/*`
    /// (`*`) every anchor loaded directly under P (at the top), in name order.
    fn evaluated(&self, at: &str) -> Vec<Arc<Anchored>> {
        let Some(prefix) = wildcard(at) else { return self.loaded.get(at).cloned().into_iter().collect() };
        self.loaded
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| child_of(prefix, k).is_some())
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// `loaded` with `path` set to `a` (None: removed), the slots it is evaluated at updated.
    fn with(&self, path: &str, a: Option<Arc<Anchored>>) -> Anchors {
        let mut loaded = (*self.loaded).clone();
        match a {
            Some(a) => loaded.insert(path.to_string(), a),
            None => loaded.remove(path),
        };
        let mut out = Anchors {
            slots: self.slots.clone(),
            first: self.first.clone(),
            loaded: Arc::new(loaded),
            by_slot: Arc::default(),
        };
        let mut by_slot = (*self.by_slot).clone();
        by_slot.resize(self.slots.len(), Vec::new());
        for at in [path.to_string(), wildcard_of(path)] {
            if let Some(&(slot, _)) = self.slots.get(&at) {
                by_slot[slot as usize] = out.evaluated(&at);
            }
        }
        out.by_slot = Arc::new(by_slot);
        out
    }
}

/// What `-s rules -a NAME` shows of an anchor loaded at run time.
#[derive(Debug, Clone)]
pub struct AnchorInfo {
    pub first_nr: u32,
    pub evaluations: Vec<u64>,
    /// Whether an anchor rule of the main ruleset evaluates it (by its name or a wildcard).
    pub referenced: bool,
}

/// For each rule, the path of the anchor it names (None: not an anchor, an unnamed one, or
/// one inside an unnamed one): its name, under the path of the anchor whose body holds it.
pub fn anchor_paths(rules: &[Rule]) -> Vec<Option<String>> {
    let mut stack: Vec<Option<String>> = Vec::new();
    rules
        .iter()
        .map(|r| {
            let d = r.depth as usize;
            stack.truncate(d);
            let parent = if d == 0 { Some(String::new()) } else { stack.get(d - 1).cloned().flatten() };
            let path = match (r.anchor.as_deref(), parent) {
                (Some(n), Some(p)) if !n.is_empty() && r.xlate.is_none() => {
                    Some(if p.is_empty() { n.to_string() } else { format!("{p}/{n}") })
                }
                _ => None,
            };
            if r.opens && stack.len() == d {
                stack.push(path.clone());
            }
            path
        })
        .collect()
}

/// The wildcard that takes anchor `path` in: `P/*` for `P/name`, `*` for a top-level one.
fn wildcard_of(path: &str) -> String {
    path.rsplit_once('/').map_or("*".to_string(), |(p, _)| format!("{p}/*"))
}

/// For an anchor path `P/*` (or `*`): `P/` (or ""), what its children's paths start with.
pub fn wildcard(path: &str) -> Option<&str> {
    path.strip_suffix('*').filter(|p| p.is_empty() || p.ends_with('/'))
}

/// `path`'s name under `prefix` (from [`wildcard`]) when it is directly under it.
pub fn child_of<'a>(prefix: &str, path: &'a str) -> Option<&'a str> {
    path.strip_prefix(prefix).filter(|rest| !rest.is_empty() && !rest.contains('/'))
}

/// The end of the body of anchor rule `i` (the index after it): the rules after it one level
/// deeper.
pub fn body_end(rules: &[Rule], i: usize) -> usize {
    rules[i + 1..].iter().position(|x| x.depth <= rules[i].depth).map_or(rules.len(), |k| i + 1 + k)
}

/// Whether `path` names an anchor rules can be loaded into: names joined by `/`, no wildcard.
pub fn valid_anchor_path(path: &str) -> bool {
    !path.is_empty() && path.split('/').all(|c| !c.is_empty() && c != "*" && c != "." && c != "..")
}

impl Ruleset {
    /// This ruleset with `p`'s rules loaded into anchor `path` (replacing what was loaded
    /// there), numbered from `first_nr`; everything else shared. Interfaces as `ifindex` has
    /// them. What an anchor loaded at run time cannot hold is an error at its line: tables,
    /// options, translation, state limits, and the tests kept outside the rule walk (`on` a
    /// group or an interface not present, `received-on`, `once`, `max-pkt-rate`, `no-route`, `urpf-failed`); and anchors
    /// without a body (nothing would ever be loaded into them).
    pub fn with_anchor(
        &self,
        path: &str,
        p: &Parsed,
        first_nr: u32,
        ifindex: &dyn Fn(&str) -> Option<u16>,
    ) -> Result<Ruleset, CompileError> {
        let err = |line: u32, msg: &str| CompileError { line, msg: msg.to_string() };
        if !valid_anchor_path(path) {
            return Err(err(0, &format!("anchor \"{path}\": not a name rules can be loaded into")));
        }
        if let Some(t) = p.tables.first() {
            return Err(err(t.line, &format!("table <{}>: declare tables in the main ruleset", t.name)));
        }
        if let Some((s, _, line)) = p.settings.first() {
            return Err(err(*line, &format!("{s}: options belong in the main ruleset")));
        }
        if let Some(r) = p.xrules.first() {
            return Err(err(r.line, "translation rules belong in the main ruleset"));
        }
        if let Some(q) = p.queues.first() {
            return Err(err(q.line, "queues belong in the main ruleset"));
        }
        let fib = crate::routes::Fib::default();
        // The main file's `set state-defaults` and `set state-policy` hold for them too.
        let globals = self.globals;
        let mut b =
            Build::new(&globals, ifindex, &crate::ifgroup::members, &fib, self.tables.clone(), self.tags.clone());
        b.queue_ids = self.queues.ids.clone();
        let mut rules = Vec::with_capacity(p.rules.len());
        for (j, r) in p.rules.iter().enumerate() {
            let anchor_end = if r.anchor.is_some() {
                if !r.opens {
                    return Err(err(r.line, "an anchor loaded with -a holds its anchors' rules inline"));
                }
                body_end(&p.rules, j) as u32
            } else {
                0
            };
            let c = b.rule(r, first_nr.wrapping_add(j as u32), false, anchor_end, 0)?;
            let what = if c.rare != 0 {
                "interface groups (or interfaces not present), received-on, once, max-pkt-rate, no-route and urpf-failed"
            } else if c.limits != 0 {
                "state limits"
            } else if c.nat != 0 || c.rdr != 0 {
                "translation (nat-to, rdr-to, binat-to)"
            } else if c.route != 0 || c.route_pool != 0 {
                "route-to and reply-to"
            } else {
                ""
            };
            if !what.is_empty() {
                return Err(err(
                    r.line,
                    &format!("{what}: not in an anchor loaded with -a (the main ruleset has them)"),
                ));
            }
            rules.push(c);
        }
        let mut out = self.clone();
        out.random |= rules.iter().any(|r| r.prob != 0);
        out.tables = b.tables;
        out.tags = b.tags;
        let log = Arc::new(RuleLog::of(&p.rules, path).unwrap_or_default());
        let a = Anchored { list: List::new(rules, Lookup::Auto), first_nr, log };
        out.anchors = self.anchors.with(path, Some(Arc::new(a)));
        Ok(out)
    }

    /// This ruleset without the rules loaded into anchor `path` (its body in the main
    /// ruleset, if it has one, is evaluated again).
    pub fn without_anchor(&self, path: &str) -> Ruleset {
        let mut out = self.clone();
        out.anchors = self.anchors.with(path, None);
        out
    }

    /// The anchor loaded at run time at `path`: its rules' first number and evaluations.
    pub fn anchor(&self, path: &str) -> Option<AnchorInfo> {
        let a = self.anchors.loaded.get(path)?;
        Some(AnchorInfo {
            first_nr: a.first_nr,
            evaluations: a.list.evaluations.all(),
            referenced: self.anchors.slots.contains_key(path) || self.anchors.slots.contains_key(&wildcard_of(path)),
        })
    }

    /// [`Ruleset::set_lookup`] for the anchors loaded at run time.
    pub(super) fn set_anchors_lookup(&mut self, how: Lookup) {
        let mut a = self.anchors.clone();
        for path in self.anchors.loaded.keys() {
            let mut x = (*self.anchors.loaded[path]).clone();
            x.list.set_lookup(how);
            a = a.with(path, Some(Arc::new(x)));
        }
        self.anchors = a;
    }

    /// Whether the main ruleset gives anchor `path` a body of its own (inline or `load
    /// anchor`): loading the main ruleset again brings that body back.
    pub fn anchor_has_body(&self, path: &str) -> bool {
        self.anchors.slots.get(path).is_some_and(|s| s.1)
    }

    /// How pflog names rule `nr` (pf's rulenr, subrulenr and ruleset).
    pub fn log_name(&self, nr: u32) -> xpf_engine::LogName {
        use xpf_engine::LogName;
        // The main ruleset's rule `i` (its own number, and its outermost anchor's).
        let main = |i: usize| -> (u32, Option<(u32, String)>) {
            match &self.rule_log {
                None => (i as u32, None),
                Some(l) => {
                    let (own, at) = l.name(i);
                    (own, at.map(|(top, p)| (l.own[top as usize], p.to_string())))
                }
            }
        };
        if (nr as usize) < self.filter.rules.len() {
            return match main(nr as usize) {
                (own, None) => LogName::main(own),
                (own, Some((top, path))) => LogName::in_anchor(top, own, &path),
            };
        }
        // A rule loaded at run time: under the main ruleset's anchor rule that evaluates it.
        let Some((path, a)) = self
            .anchors
            .loaded
            .iter()
            .find(|(_, a)| nr >= a.first_nr && ((nr - a.first_nr) as usize) < a.list.rules.len())
        else {
            return LogName::main(nr);
        };
        let j = (nr - a.first_nr) as usize;
        let slot = self.anchors.slots.get(path.as_str()).or_else(|| self.anchors.slots.get(&wildcard_of(path)));
        let rulenr =
            slot.and_then(|s| self.anchors.first.get(s.0 as usize)).map_or(u32::MAX, |&i| match main(i as usize) {
                (own, None) => own,
                (_, Some((top, _))) => top,
            });
        let (own, inner) = if a.log.own.is_empty() { (j as u32, None) } else { a.log.name(j) };
        let ruleset = inner.map_or(path.as_str(), |(_, p)| p);
        LogName::in_anchor(rulenr, own, ruleset)
    }

    /// The rulesets loaded into the anchor rule `r` names (empty: its body is evaluated).
    #[inline]
    pub(super) fn loaded_into(&self, r: &CRule) -> &[Arc<Anchored>] {
        match self.anchors.by_slot.get((r.slot as usize).wrapping_sub(1)) {
            Some(v) => v,
            None => &[],
        }
    }
}
