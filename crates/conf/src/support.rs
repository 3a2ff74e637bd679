//! What xpf enforces. The parser reads all of OpenBSD's pf.conf (so that `xpfctl -nvf` prints
//! what pfctl prints); this pass stands between parsing and loading: every construct the
//! engine does not enforce is refused with `FILE:LINE: xpf does not support 'X' yet`, so a
//! ruleset that loads means what it says. `xpfd -f`, `xpfctl -f` and `xpfctl -nf` run it.
//!
//! [`refusals`] walks every field of every [`Rule`] and every statement-level setting by an
//! exhaustive destructuring: a field added to the AST fails to compile here until it is
//! either enforced or refused (the test `every_rule_option_is_refused_or_evaluated` then
//! holds the enforced ones to an evaluation test).

use crate::ast::*;
use crate::parse::{ConfError, Parsed};

/// What loading `p` would promise that xpf cannot keep, one error per construct and line, in
/// file order; and the warnings (constructs that load with a caveat, said once per ruleset).
pub fn refusals(p: &Parsed) -> (Vec<ConfError>, Vec<String>) {
    let mut errs = Vec::new();
    let mut warn = Vec::new();
    let mut no = |file: &str, line: u32, what: &str| {
        let e = ConfError { file: file.into(), line, msg: format!("xpf does not support '{what}' yet"), bare: false };
        if !errs.contains(&e) {
            errs.push(e);
        }
    };
    for (text, file, line) in &p.settings {
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.get(1).copied().unwrap_or("") {
            // Enforced: block-policy (the rules carry it), timeout, limit, reassemble,
            // state-policy, skip; ruleset-optimization changes no verdict (pfctl's optimizer
            // only reorders and merges rules that decide alike).
            "block-policy" | "timeout" | "limit" | "state-policy" | "skip" | "ruleset-optimization" => {}
            "reassemble" if !text.contains("no-df") => {}
            "reassemble" => no(file, *line, "set reassemble no-df"),
            "optimization" if matches!(words.get(2).copied(), Some("normal" | "default")) => {}
            "optimization" => no(file, *line, &format!("set optimization {}", words.get(2).unwrap_or(&""))),
            w => no(file, *line, &format!("set {w}")),
        }
    }
    for q in &p.queues {
        no(&q.file, q.line, "queue");
    }
    let mut logged = false;
    for r in &p.rules {
        let mut refuse = |what: &str| no(&r.file, r.line, what);
        // Exhaustive on purpose: a new field does not compile until it is placed.
        let Rule {
            action: _,
            ret,
            dir: _,
            log,
            quick: _,
            on: _,
            af: _,
            proto: _,
            src,
            src_port: _,
            dst,
            dst_port: _,
            flags: _,
            icmp: _,
            icmp6: _,
            tos,
            state,
            state_explicit: _,
            allow_opts: _,
            label: _,
            tag: _,
            tagged: _,
            state_opts,
            user,
            group,
            nat,
            rdr,
            binat,
            scrub,
            divert,
            rtable,
            af_to,
            depth: _,
            opens: _,
            route,
            set_prio,
            set_queue,
            set_tos,
            probability,
            anchor: _,
            line: _,
            file: _,
        } = r;
        // Enforced: every return variant (the engine's reply.rs).
        let _ = ret;
        if log.is_some() {
            logged = true;
        }
        for h in [src, dst] {
            match &h.kind {
                HostKind::Any | HostKind::Net(..) | HostKind::Range(..) | HostKind::Table(_) => {}
                HostKind::NoRoute => refuse("no-route"),
                HostKind::UrpfFailed => refuse("urpf-failed"),
                HostKind::SelfAddr => refuse("self"),
                HostKind::Dynamic { .. } => refuse("(interface) addresses"),
            }
        }
        // Enforced: `tos` matches the TOS byte without its ECN bits (pf_setup_pdesc).
        let _ = tos;
        match state {
            StateKind::No | StateKind::Keep | StateKind::Modulate => {}
            StateKind::Synproxy => refuse("synproxy state"),
        }
        let StateOpts {
            max: _,
            no_sync: _,
            pflow,
            source_track: _,
            max_src_states: _,
            max_src_conn: _,
            max_src_conn_rate: _,
            max_src_nodes: _,
            overload: _,
            if_bound: _,
            floating: _,
            sloppy: _,
            timeouts: _,
        } = state_opts;
        if *pflow {
            refuse("pflow");
        }
        if user.is_some() {
            refuse("user");
        }
        if group.is_some() {
            refuse("group");
        }
        // binat-to is expanded into its nat-to and rdr-to halves; each names itself.
        if binat.is_some() {
            refuse("binat-to");
        } else {
            if nat.is_some() {
                refuse("nat-to");
            }
            if rdr.is_some() {
                refuse("rdr-to");
            }
        }
        if scrub.is_some() {
            refuse("scrub");
        }
        match divert {
            None => {}
            Some(Divert::To(..)) => refuse("divert-to"),
            Some(Divert::Reply) => refuse("divert-reply"),
            Some(Divert::Packet(_)) => refuse("divert-packet"),
        }
        if rtable.is_some() {
            refuse("rtable");
        }
        if af_to.is_some() {
            refuse("af-to");
        }
        match route {
            None => {}
            Some((RouteKind::RouteTo, _)) => refuse("route-to"),
            Some((RouteKind::ReplyTo, _)) => refuse("reply-to"),
            Some((RouteKind::DupTo, _)) => refuse("dup-to"),
        }
        if set_prio.is_some() {
            refuse("set prio");
        }
        if set_queue.is_some() {
            refuse("set queue");
        }
        if set_tos.is_some() {
            refuse("set tos");
        }
        if probability.is_some() {
            refuse("probability");
        }
    }
    if logged {
        warn.push("rules with 'log' load, but xpf writes no pflog yet: nothing is logged".into());
    }
    errs.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    (errs, warn)
}
