//! Anchors loaded at run time (`xpfctl -a NAME -f FILE`, `-a NAME -F rules`, `-a NAME -s
//! rules`): each is compiled on its own against the ruleset in force and swapped in as a new
//! generation; the rest of the ruleset is shared, not recompiled. They outlive reloads of the
//! main ruleset, except where the main file gives the anchor a body of its own (pfctl -f loads
//! that body, as pf does).

use crate::control::{ifindex_of, Daemon};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;
use xpf_conf::parse::Parsed;
use xpf_conf::Ruleset;

/// Rules loaded into anchors number from here (the main ruleset's from 0): states, counters
/// and pflog name a rule by number.
pub const FIRST_NR: u32 = 1 << 31;

/// An anchor loaded at run time: its rules as parsed, where they came from, their first number.
pub struct AnchorLoad {
    pub parsed: Parsed,
    pub file: String,
    pub first_nr: u32,
}

/// The anchors loaded at run time, by path, and the next rule number to give.
pub struct Anchors {
    pub loads: BTreeMap<String, AnchorLoad>,
    next_nr: u32,
}

impl Default for Anchors {
    fn default() -> Anchors {
        Anchors { loads: BTreeMap::new(), next_nr: FIRST_NR }
    }
}

impl Anchors {
    /// `r` with every anchor loaded at run time compiled into it again (a new main ruleset),
    /// and the anchors to forget once it is installed: those the main ruleset now gives a
    /// body of its own (that body is what was loaded). An anchor that no longer compiles (an
    /// interface gone) fails the load.
    pub fn apply(&self, mut r: Ruleset) -> Result<(Ruleset, Vec<String>), Vec<String>> {
        let mut dropped = Vec::new();
        for (path, a) in &self.loads {
            if r.anchor_has_body(path) {
                dropped.push(path.clone());
                continue;
            }
            r = r
                .with_anchor(path, &a.parsed, a.first_nr, &ifindex_of)
                .map_err(|e| vec![format!("anchor \"{path}\": {}:{}: {}", a.file, e.line, e.msg)])?;
        }
        Ok((r, dropped))
    }

    /// Forgets the anchors [`Anchors::apply`] dropped.
    pub fn forget(&mut self, dropped: &[String]) {
        for p in dropped {
            log::info!("anchor \"{p}\": the main ruleset's own rules for it replace those loaded with -a");
            self.loads.remove(p);
        }
    }
}

impl Daemon {
    /// `xpfctl -a PATH -f FILE` (`defines`: its -D): FILE's rules replace anchor PATH's,
    /// compiled on their own; nothing else is recompiled. On any error nothing changes.
    pub fn load_anchor(
        &mut self,
        path: &str,
        file: &str,
        noaction: bool,
        defines: &[(String, String)],
    ) -> Result<(String, Value), String> {
        let t0 = Instant::now();
        if !xpf_conf::compile::valid_anchor_path(path) {
            return Err(format!("-a {path}: not an anchor rules can be loaded into (names joined by /, no wildcard)"));
        }
        let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        let base = std::path::Path::new(file).parent().map(|d| d.to_path_buf());
        let parsed = xpf_conf::parse::parse_in(&text, file, &self.defines_with(defines), base.as_deref());
        if !parsed.errors.is_empty() {
            return Err(parsed.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"));
        }
        let (refused, warnings) = xpf_conf::support::refusals(&parsed);
        if !refused.is_empty() {
            return Err(refused.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"));
        }
        for w in &warnings {
            log::warn!("{w}");
        }
        crate::control::pflow_fits(&parsed, self.pflow.is_some())?;
        let n = parsed.rules.len() as u32;
        let first = self.anchors.next_nr;
        let next = first.checked_add(n).ok_or("rule numbers for anchors are used up: restart xpfd")?;
        let (_, cur) = self.slot.current();
        let r =
            cur.with_anchor(path, &parsed, first, &ifindex_of).map_err(|e| format!("{file}:{}: {}", e.line, e.msg))?;
        let referenced = r.anchor(path).is_some_and(|a| a.referenced);
        if noaction {
            return Ok((String::new(), json!({"anchor": path, "rules": n, "loaded": false})));
        }
        let g = self.put(r, None);
        self.anchors.next_nr = next;
        self.anchors.loads.insert(path.to_string(), AnchorLoad { parsed, file: file.to_string(), first_nr: first });
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let note = if referenced { "" } else { " (no anchor rule evaluates it yet)" };
        log::info!("ruleset generation {g}: anchor \"{path}\": {n} rules from {file} in {ms:.1} ms{note}");
        Ok((String::new(), json!({"anchor": path, "rules": n, "generation": g, "loaded": true, "ms": ms})))
    }

    /// `xpfctl -a PATH -F rules`: anchor PATH emptied (what the main ruleset gave it too).
    pub fn flush_anchor(&mut self, path: &str) -> Result<(String, Value), String> {
        if !xpf_conf::compile::valid_anchor_path(path) {
            return Err(format!("-a {path}: not an anchor rules can be loaded into"));
        }
        let empty = xpf_conf::parse::parse("", "-F", &[]);
        let (_, cur) = self.slot.current();
        let r = cur.with_anchor(path, &empty, self.anchors.next_nr, &ifindex_of).map_err(|e| e.msg)?;
        let g = self.put(r, None);
        self.anchors
            .loads
            .insert(path.to_string(), AnchorLoad { parsed: empty, file: "-F".into(), first_nr: self.anchors.next_nr });
        log::info!("ruleset generation {g}: anchor \"{path}\" flushed");
        Ok(("rules cleared\n".into(), json!({"anchor": path, "generation": g})))
    }

    /// `-s Anchors [-a PATH]` (pfctl -sA): the anchors directly under PATH (the main ruleset
    /// without -a), each by its path; with -v every anchor below, depth first, names in order
    /// at each level as pf's anchor tree keeps them. An anchor exists once a rule names it
    /// (`anchor "ftp-proxy/*"` makes `ftp-proxy`), a body or a file gives it rules, or `xpfctl
    /// -a` loads it, and so do the anchors its path runs through.
    pub(crate) fn show_anchors(&self, under: Option<&str>, verbose: u8) -> Result<(String, Value), String> {
        let parsed = &self.loaded.parsed;
        let mut paths: Vec<String> = xpf_conf::compile::anchor_paths(&parsed.rules).into_iter().flatten().collect();
        paths.extend(parsed.xrules.iter().filter_map(|r| r.anchor.clone()).filter(|n| !n.is_empty()));
        for (path, a) in &self.anchors.loads {
            paths.push(path.clone());
            paths.extend(
                xpf_conf::compile::anchor_paths(&a.parsed.rules).into_iter().flatten().map(|p| format!("{path}/{p}")),
            );
        }
        let rows = anchor_rows(&paths, under.unwrap_or(""), verbose > 0)?;
        let text: String = rows.iter().map(|p| format!("  {p}\n")).collect();
        Ok((text, json!(rows)))
    }

    /// `-s rules [-a PATH|'*']`: the main ruleset with its anchors' rules inside braces (the
    /// rules loaded at run time where they replace a body), or one anchor's rules.
    pub(crate) fn show_rules(&self, anchor: Option<&str>, verbose: u8) -> Result<(String, Value), String> {
        let (_, cur) = self.slot.current();
        let sums = if verbose > 0 { self.rule_sums()? } else { Default::default() };
        let lists = cur.rule_lists();
        let loaders = self.inserted.clone();
        let mut out = Rows { text: String::new(), data: Vec::new(), verbose, sums, lists, loaders, counts: Vec::new() };
        match anchor {
            None | Some("*") => {
                // FreeBSD's scrub rules first, as pfctl lists them; without counters: here they
                // select packets xpf normalizes anyway (docs/pfconf.md).
                for r in &self.loaded.parsed.scrubs {
                    let line = xpf_conf::print::scrub(r);
                    out.line(0, &line, false);
                    out.data.push(json!({"scrub": true, "rule": line}));
                }
                self.rows_of_main(&cur, 0, self.loaded.parsed.rules.len(), 0, &mut out)
            }
            Some(path) => match cur.anchor(path) {
                Some(info) => {
                    let a = &self.anchors.loads[path];
                    self.rows_of_loaded(&a.parsed, &info.evaluations, info.first_nr, 0, &mut out);
                }
                None => {
                    // An anchor the main ruleset gives a body: that body.
                    let paths = xpf_conf::compile::anchor_paths(&self.loaded.parsed.rules);
                    let rules = &self.loaded.parsed.rules;
                    let Some(i) = paths.iter().position(|p| p.as_deref() == Some(path)).filter(|&i| rules[i].opens)
                    else {
                        return Err(format!("-a {path}: no such anchor"));
                    };
                    let end = xpf_conf::compile::body_end(rules, i);
                    self.rows_of_main(&cur, i + 1, end, rules[i].depth + 1, &mut out);
                }
            },
        }
        Ok((out.text, json!(out.data)))
    }

    /// Rows for main rules `lo..hi` (printed `base` levels less deep).
    fn rows_of_main(&self, cur: &Ruleset, lo: usize, hi: usize, base: u8, out: &mut Rows) {
        let rules = &self.loaded.parsed.rules;
        let paths = xpf_conf::compile::anchor_paths(rules);
        let mut i = lo;
        let mut open: Vec<u8> = Vec::new();
        while i < hi {
            let r = &rules[i];
            let d = r.depth - base;
            out.close(&mut open, d);
            // A `once` rule that fired is gone, as pfctl shows it: only with -vv.
            let expired = i < cur.len() && cur.expired(i);
            let loaded = paths[i].as_deref().map(|p| self.loaded_under(cur, p)).unwrap_or_default();
            if !(expired && out.verbose < 2) {
                out.rule(d, i as u32, r, cur.evaluations(i), expired, r.opens || !loaded.is_empty());
            }
            if !loaded.is_empty() {
                // Rules loaded at run time stand in for the body.
                open.push(d);
                for (name, info, a) in loaded {
                    let mut dd = d + 1;
                    if let Some(n) = name {
                        out.line(dd, &format!("anchor \"{n}\" all"), true);
                        open.push(dd);
                        dd += 1;
                    }
                    self.rows_of_loaded(&a.parsed, &info.evaluations, info.first_nr, dd, out);
                    if name.is_some() {
                        out.close(&mut open, dd - 1);
                    }
                }
                i = xpf_conf::compile::body_end(rules, i);
                out.close(&mut open, d);
                continue;
            }
            if r.opens {
                open.push(d);
            }
            i += 1;
        }
        out.close(&mut open, 0);
    }

    /// What the anchor rule at `path` evaluates of the anchors loaded at run time: the one
    /// loaded there, or for `P/*` each loaded under P (with its name).
    fn loaded_under<'a>(
        &'a self,
        cur: &Ruleset,
        path: &str,
    ) -> Vec<(Option<&'a str>, xpf_conf::compile::AnchorInfo, &'a AnchorLoad)> {
        let Some(prefix) = xpf_conf::compile::wildcard(path) else {
            return cur.anchor(path).zip(self.anchors.loads.get(path)).map(|(i, a)| (None, i, a)).into_iter().collect();
        };
        self.anchors
            .loads
            .iter()
            .filter_map(|(k, a)| Some((xpf_conf::compile::child_of(prefix, k)?, a, k)))
            .filter_map(|(name, a, k)| cur.anchor(k).map(|i| (Some(name), i, a)))
            .collect()
    }

    fn rows_of_loaded(&self, p: &Parsed, evals: &[u64], first: u32, base: u8, out: &mut Rows) {
        let mut open: Vec<u8> = Vec::new();
        for (j, r) in p.rules.iter().enumerate() {
            let d = base + r.depth;
            out.close(&mut open, d);
            out.rule(d, first + j as u32, r, evals.get(j).copied().unwrap_or(0), false, r.opens);
            if r.opens {
                open.push(d);
            }
        }
        out.close(&mut open, base);
    }

    /// Every rule in force, the main ruleset's and those loaded into anchors at run time:
    /// (number, rule, evaluations).
    pub(crate) fn every_rule<'a>(&'a self, cur: &Ruleset) -> Vec<(u32, &'a xpf_conf::ast::Rule, u64)> {
        let mut v: Vec<_> =
            self.loaded.parsed.rules.iter().enumerate().map(|(i, r)| (i as u32, r, cur.evaluations(i))).collect();
        for (path, a) in &self.anchors.loads {
            let Some(info) = cur.anchor(path) else { continue };
            for (j, r) in a.parsed.rules.iter().enumerate() {
                v.push((a.first_nr + j as u32, r, info.evaluations.get(j).copied().unwrap_or(0)));
            }
        }
        v
    }

    /// The rules with a label: (number, label, evaluations).
    pub(crate) fn labelled(&self, cur: &Ruleset) -> Vec<(u32, String, u64)> {
        self.every_rule(cur)
            .into_iter()
            .filter_map(|(nr, r, e)| r.label.as_deref().filter(|l| !l.is_empty()).map(|l| (nr, l.to_string(), e)))
            .collect()
    }
}

/// `-s rules` being written: text and JSON rows.
struct Rows {
    text: String,
    data: Vec<Value>,
    verbose: u8,
    sums: crate::dataplane::RuleSums,
    /// The lists of rules in force, and who loaded each (pf's `cpid`), by list.
    lists: Vec<xpf_conf::compile::RuleList>,
    loaders: std::collections::HashMap<usize, u32>,
    /// Rules written so far at each depth of the bodies open.
    counts: Vec<u32>,
}

impl Rows {
    fn line(&mut self, depth: u8, s: &str, opens: bool) {
        let _ = writeln!(self.text, "{}{s}{}", "  ".repeat(depth as usize), if opens { " {" } else { "" });
    }

    /// Closes the bodies opened at `depth` or deeper.
    fn close(&mut self, open: &mut Vec<u8>, depth: u8) {
        while open.last().is_some_and(|&d| d >= depth) {
            let d = open.pop().unwrap_or(0);
            self.line(d, "}", false);
        }
    }

    /// Rule `r` (number `nr`) at `depth`; `opens`: a body follows it.
    fn rule(&mut self, depth: u8, nr: u32, r: &xpf_conf::ast::Rule, evals: u64, expired: bool, opens: bool) {
        let mut line = xpf_conf::print::rule(r);
        if expired {
            line.push_str(" # expired");
        }
        let pad = "  ".repeat(depth as usize);
        let brace = if opens { " {" } else { "" };
        // pf numbers each ruleset from 0 (an anchor's body has its own count).
        let d = depth as usize;
        self.counts.truncate(d + 1);
        self.counts.resize(d + 1, 0);
        let own = self.counts[d];
        self.counts[d] += 1;
        if self.verbose > 1 {
            let _ = writeln!(self.text, "{pad}@{own} {line}{brace}");
        } else {
            let _ = writeln!(self.text, "{pad}{line}{brace}");
        }
        let c = self.sums.get(&nr).copied().unwrap_or_default();
        let (pk, by) = (c.packets[0] + c.packets[1], c.bytes[0] + c.bytes[1]);
        if self.verbose > 0 {
            // pfctl's two lines, in its columns.
            let _ = writeln!(
                self.text,
                "{pad}  [ Evaluations: {evals:<8}  Packets: {pk:<8}  Bytes: {by:<10}  States: {:<6}]",
                c.states
            );
            // Root only may load rules.
            let list = xpf_conf::compile::RuleList::find(&self.lists, nr);
            let pid = list.map_or(0, |l| self.loaders.get(&l.id).copied().unwrap_or_else(std::process::id));
            let _ = writeln!(self.text, "{pad}  [ Inserted: uid 0 pid {pid} State Creations: {:<6}]", c.created);
        }
        self.data.push(json!({"nr": nr, "rule": line, "evaluations": evals, "states": c.states,
            "state_creations": c.created, "packets": pk, "bytes": by, "packets_in": c.packets[0],
            "bytes_in": c.bytes[0], "packets_out": c.packets[1], "bytes_out": c.bytes[1],
            "expired": expired, "depth": depth}));
    }
}

/// The rows of `-s Anchors [-a under]` from the anchor paths rules name (a wildcard `P/*`
/// names `P`) and loads made: every path and the anchors it runs through, the children of
/// `under` in name order, each followed by its own when `deep` (pf's order: the paths' own
/// order would put `a-b` before `a/c`).
fn anchor_rows(paths: &[String], under: &str, deep: bool) -> Result<Vec<String>, String> {
    let mut all = std::collections::BTreeSet::new();
    for p in paths {
        // `P/*` names `P` (and `*` none).
        let p = xpf_conf::compile::wildcard(p).unwrap_or(p).trim_end_matches('/');
        for (i, _) in p.match_indices('/').chain(std::iter::once((p.len(), ""))) {
            if i > 0 {
                all.insert(p[..i].to_string());
            }
        }
    }
    let base = under.trim_matches('/');
    if !base.is_empty() && !all.contains(base) {
        return Err(format!("-a {base}: no such anchor"));
    }
    fn walk(all: &std::collections::BTreeSet<String>, prefix: &str, deep: bool, out: &mut Vec<String>) {
        let kids: Vec<&String> = all
            .range(prefix.to_string()..)
            .take_while(|p| p.starts_with(prefix))
            .filter(|p| xpf_conf::compile::child_of(prefix, p).is_some())
            .collect();
        for k in kids {
            out.push(k.clone());
            if deep {
                walk(all, &format!("{k}/"), deep, out);
            }
        }
    }
    let mut rows = Vec::new();
    walk(&all, &if base.is_empty() { String::new() } else { format!("{base}/") }, deep, &mut rows);
    Ok(rows)
}

#[cfg(test)]
mod anchor_rows_tests {
    use super::anchor_rows;

    #[test]
    fn anchors_list_as_pfctl_sa_does() {
        let p: Vec<String> = ["ftp-proxy/*", "a/c", "a-b", "x/y/z", "a"].iter().map(|s| s.to_string()).collect();
        assert_eq!(anchor_rows(&p, "", false).unwrap(), vec!["a", "a-b", "ftp-proxy", "x"]);
        // Depth first, each anchor's children after it: a/c before a-b.
        assert_eq!(anchor_rows(&p, "", true).unwrap(), vec!["a", "a/c", "a-b", "ftp-proxy", "x", "x/y", "x/y/z"]);
        assert_eq!(anchor_rows(&p, "x", false).unwrap(), vec!["x/y"]);
        assert_eq!(anchor_rows(&p, "x/", true).unwrap(), vec!["x/y", "x/y/z"]);
        assert_eq!(anchor_rows(&p, "ftp-proxy", true).unwrap(), Vec::<String>::new());
        assert!(anchor_rows(&p, "nope", false).is_err());
        assert_eq!(anchor_rows(&["*".to_string()], "", true).unwrap(), Vec::<String>::new());
    }
}
