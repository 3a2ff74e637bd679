//! pf.conf's grammar (the OpenBSD 7.7 dialect), by recursive descent over one logical line at a
//! time. A rule line is parsed into a `Template` holding lists, then expanded into rules.

use crate::ast::*;
use crate::lex::{lex_line, logical_lines, Tok, Token};
use crate::names;
use std::collections::HashMap;
use std::net::IpAddr;

/// A pf.conf error, `FILE:LINE: message` as pfctl prints it (a few of pfctl's messages, about
/// a value rather than a place, come bare).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfError {
    pub file: String,
    pub line: u32,
    pub msg: String,
    pub bare: bool,
}

impl std::fmt::Display for ConfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.bare {
            write!(f, "{}", self.msg)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.msg)
        }
    }
}

/// Inside the parser an error is a string of one or more lines; a line starting with BARE is
/// printed without `FILE:LINE:`.
const BARE: char = '\u{1}';

fn to_errors(file: &str, line: u32, msg: &str) -> Vec<ConfError> {
    msg.lines()
        .map(|l| match l.strip_prefix(BARE) {
            Some(b) => ConfError { file: file.into(), line, msg: b.into(), bare: true },
            None => ConfError { file: file.into(), line, msg: l.into(), bare: false },
        })
        .collect()
}

/// What parsing gave: the rules, in order, and every error (pfctl reports all, then refuses).
#[derive(Debug, Default)]
pub struct Parsed {
    pub rules: Vec<Rule>,
    pub errors: Vec<ConfError>,
    pub macros: HashMap<String, String>,
    pub block_return: bool,
    /// What `pfctl -nv` prints while parsing, before the rules: macro definitions and `set`
    /// options, in order.
    pub header: Vec<String>,
    /// `set timeout` values.
    pub timeouts: Vec<(xpf_state::Timeout, u32)>,
    /// `set limit` values, by pf's name (states, frags, src-nodes, tables, table-entries).
    pub limits: Vec<(String, u32)>,
    /// Tables: declared ones and the `__automatic_N` ones pfctl makes for address lists.
    pub tables: Vec<Table>,
    auto_tables: u32,
    pub queues: Vec<Queue>,
    /// `set skip on` interfaces: not filtered at all.
    pub skip: Vec<String>,
}

/// A table as declared (`table <name> ...`) or made for a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: String,
    pub konst: bool,
    pub persist: bool,
    pub counters: bool,
    /// In order: address lists (merged when adjacent) and files.
    pub parts: Vec<TablePart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TablePart {
    Hosts(Vec<Host>),
    File(String),
}

/// A rule line before list expansion.
#[derive(Debug, Clone)]
struct Template {
    r: Rule,
    ifs: Vec<Iface>,
    protos: Vec<u8>,
    src: Vec<Host>,
    src_ports: Vec<PortOp>,
    dst: Vec<Host>,
    dst_ports: Vec<PortOp>,
    icmp: Vec<(u8, Option<u8>)>,
    users: Vec<PortOp>,
    groups: Vec<PortOp>,
}

struct P<'a> {
    t: &'a [Token],
    i: usize,
    /// The interface a scoped address named (fe80::1%lo0): the rule is then on it.
    scope: Option<String>,
}

type R<T> = Result<T, String>;

impl<'a> P<'a> {
    fn peek(&self) -> &Tok {
        self.t.get(self.i).map_or(&Tok::Eof, |t| &t.tok)
    }
    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        self.i += 1;
        t
    }
    fn word(&self) -> Option<&str> {
        match self.peek() {
            Tok::Word(w) => Some(w),
            _ => None,
        }
    }
    fn is(&self, w: &str) -> bool {
        self.word() == Some(w)
    }
    fn eat(&mut self, w: &str) -> bool {
        if self.is(w) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn punct(&self, p: &str) -> bool {
        matches!(self.peek(), Tok::Punct(q) if *q == p)
    }
    fn eat_punct(&mut self, p: &str) -> bool {
        if self.punct(p) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect_punct(&mut self, p: &str) -> R<()> {
        if self.eat_punct(p) {
            Ok(())
        } else {
            Err("syntax error".into())
        }
    }
    fn string(&mut self) -> R<String> {
        match self.next() {
            Tok::Word(w) | Tok::Str(w) => Ok(w),
            _ => Err("syntax error".into()),
        }
    }
    /// A name (label, tag, anchor): a string, but not a bare number, which pfctl's lexer makes
    /// a NUMBER token the grammar does not take there.
    fn name(&mut self) -> R<String> {
        match self.peek() {
            Tok::Word(w) if !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit()) => Err("syntax error".into()),
            _ => self.string(),
        }
    }
    fn done(&self) -> bool {
        matches!(self.peek(), Tok::Eof | Tok::Newline)
    }

    /// `x` or `{ x, y ... }` (commas optional, as in pfctl).
    fn list<T>(&mut self, mut one: impl FnMut(&mut Self) -> R<T>) -> R<Vec<T>> {
        if self.eat_punct("{") {
            let mut v = Vec::new();
            while !self.eat_punct("}") {
                if self.done() {
                    return Err("syntax error".into());
                }
                v.push(one(self)?);
                self.eat_punct(",");
            }
            Ok(v)
        } else {
            Ok(vec![one(self)?])
        }
    }
}

/// Parses pf.conf text. `file` names it in errors (`stdin` for `-f -`); `defines` are `-D`
/// macros, which a definition in the file does not override.
pub fn parse(src: &str, file: &str, defines: &[(String, String)]) -> Parsed {
    parse_in(src, file, defines, None)
}

/// As [`parse`], with `base` the directory relative `include` paths are tried in after the
/// current one (the including file's directory; pfctl itself uses only the current one).
pub fn parse_in(src: &str, file: &str, defines: &[(String, String)], base: Option<&std::path::Path>) -> Parsed {
    let mut out = Parsed::default();
    let mut st = ParseState { fixed: defines.iter().map(|d| d.0.clone()).collect(), nr: 0, depth: 0, includes: 0 };
    for (k, v) in defines {
        out.macros.insert(k.clone(), v.clone());
    }
    parse_source(src, file, base, &mut out, &mut st);
    check_queues(&mut out, file);
    out
}

/// What parsing carries across included files.
struct ParseState {
    /// Macros given with -D, which the file does not redefine.
    fixed: Vec<String>,
    /// Rules so far (`$nr`).
    nr: u32,
    /// Inline anchor depth.
    depth: u8,
    /// Include nesting, bounded.
    includes: u8,
}

const MAX_INCLUDE_DEPTH: u8 = 16;

fn parse_source(src: &str, file: &str, base: Option<&std::path::Path>, out: &mut Parsed, st: &mut ParseState) {
    let fixed = st.fixed.clone();
    let mut nr = st.nr;
    let mut depth = st.depth;
    // A `{ }` list may run over several lines (pfctl's grammar allows newlines in it): the
    // tokens of a line with an unclosed list wait here for the lines that close it.
    let mut pending: Vec<Token> = Vec::new();
    'lines: for pieces in logical_lines(src) {
        let mut toks = std::mem::take(&mut pending);
        let last_line = pieces.last().map_or(0, |p| p.0);
        for (line, text) in &pieces {
            match lex_line(text, *line, &out.macros, &mut toks) {
                Ok(false) => {}
                Ok(true) => break, // a comment runs to the end of the logical line
                Err(e) => {
                    out.errors.extend(to_errors(file, e.line, &e.msg));
                    continue 'lines;
                }
            }
        }
        if toks.is_empty() {
            continue;
        }
        let open = toks.iter().filter(|t| t.tok == Tok::Punct("{")).count();
        let close = toks.iter().filter(|t| t.tok == Tok::Punct("}")).count();
        let anchor_body = matches!(toks.first().map(|t| &t.tok), Some(Tok::Word(w)) if w == "anchor")
            && toks.last().map(|t| &t.tok) == Some(&Tok::Punct("{"))
            && open == close + 1;
        if open > close && !anchor_body {
            pending = toks;
            continue;
        }
        // `}` closes an inline anchor.
        if matches!(toks.first().map(|t| &t.tok), Some(Tok::Punct("}"))) {
            if depth == 0 || toks.len() > 1 {
                out.errors.push(ConfError {
                    file: file.into(),
                    line: toks[0].line,
                    msg: "syntax error".into(),
                    bare: false,
                });
            } else {
                depth -= 1;
            }
            continue;
        }
        let mut p = P { t: &toks, i: 0, scope: None };
        // Macro definition: NAME = value...
        if let (Some(Tok::Word(name)), Some(Tok::Punct("="))) =
            (toks.first().map(|t| &t.tok), toks.get(1).map(|t| &t.tok))
        {
            let vals: Vec<String> = toks[2..]
                .iter()
                .map(|t| match &t.tok {
                    Tok::Word(w) | Tok::Str(w) => w.clone(),
                    Tok::Punct(q) => q.to_string(),
                    _ => String::new(),
                })
                .collect();
            let v = vals.join(" ");
            out.header.push(format!("{name} = \"{v}\""));
            if !fixed.contains(name) {
                out.macros.insert(name.clone(), v);
            }
            continue;
        }
        let res = match p.word() {
            Some("pass") | Some("block") | Some("match") | Some("anchor") => rule(&mut p, last_line, out.block_return),
            Some("antispoof") => antispoof(&mut p, last_line),
            Some("include") => {
                p.next();
                st.nr = nr;
                st.depth = depth;
                let r = include(&mut p, file, base, out, st).map(|()| Vec::new());
                nr = st.nr;
                r
            }
            Some("set") => {
                p.next();
                match set_option(&mut p, out) {
                    Ok(()) => Ok(Vec::new()),
                    Err(e) => Err(e),
                }
            }
            Some("queue") => {
                p.next();
                match queue(&mut p, last_line) {
                    Ok(q) => {
                        out.queues.push(q);
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e),
                }
            }
            Some("table") => {
                p.next();
                match table(&mut p) {
                    Ok(t) => {
                        out.header.push(crate::print::table(&t));
                        out.tables.push(t);
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e),
                }
            }
            Some(w) if UNSUPPORTED_STATEMENTS.contains(&w) => Err(unsupported(w)),
            _ => Err("syntax error".into()),
        };
        match res {
            Ok(tmpls) => {
                for t in tmpls {
                    match expand(&t, &mut nr) {
                        Ok(rules) => {
                            // A combination whose translation pool has no address of its family
                            // is left out, as pfctl leaves it; if none is left, the rule fails.
                            let n = rules.len();
                            let mut bad = None;
                            let mut kept = Vec::with_capacity(n);
                            for mut r in rules {
                                match resolve_pools(&mut r, out) {
                                    Ok(()) => kept.push(r),
                                    Err(e) => bad = Some(e),
                                }
                            }
                            let rules = kept;
                            match bad.filter(|_| rules.is_empty()) {
                                Some(e) => out.errors.extend(to_errors(file, last_line, &e)),
                                None => {
                                    for mut r in rules {
                                        r.depth = depth;
                                        let opens = r.opens;
                                        out.rules.push(r);
                                        if opens {
                                            depth += 1;
                                        }
                                    }
                                }
                            }
                        }
                        Err(msgs) => {
                            for m in msgs {
                                out.errors.extend(to_errors(file, last_line, &m));
                            }
                        }
                    }
                }
            }
            Err(msg) => {
                // Where pfctl's lexer stood: the token that did not fit, or the line's end.
                let line = toks.get(p.i.min(toks.len().saturating_sub(1))).map_or(last_line, |t| t.line);
                let line = if p.i >= toks.len() { last_line } else { line };
                out.errors.extend(to_errors(file, line, &msg));
            }
        }
    }
    if let Some(t) = pending.first() {
        out.errors.push(ConfError { file: file.into(), line: t.line, msg: "syntax error".into(), bare: false });
    }
    if depth > st.depth {
        out.errors.push(ConfError {
            file: file.into(),
            line: src.lines().count() as u32,
            msg: "syntax error".into(),
            bare: false,
        });
    }
    st.nr = nr;
}

/// `include "file"`: its statements are read in place, errors naming it.
fn include(p: &mut P, file: &str, base: Option<&std::path::Path>, out: &mut Parsed, st: &mut ParseState) -> R<()> {
    let path = p.string()?;
    if !p.done() {
        return Err("syntax error".into());
    }
    if st.includes >= MAX_INCLUDE_DEPTH {
        return Err(format!("include nesting too deep at {path}"));
    }
    let mut tries = vec![std::path::PathBuf::from(&path)];
    if let Some(b) = base {
        tries.push(b.join(&path));
    }
    if let Some(d) = std::path::Path::new(file).parent() {
        tries.push(d.join(&path));
    }
    let Some((found, text)) = tries.iter().find_map(|t| std::fs::read_to_string(t).ok().map(|s| (t.clone(), s))) else {
        return Err(format!("cannot open the include file {path}"));
    };
    st.includes += 1;
    let inner_base = found.parent().map(|d| d.to_path_buf());
    parse_source(&text, &path, inner_base.as_deref().or(base), out, st);
    st.includes -= 1;
    Ok(())
}

/// A translation target given as several addresses (a list, or an interface with several):
/// only those of the rule's family count; one left is the target, more become an automatic
/// table (round-robin unless told), as pfctl does.
fn resolve_pools(r: &mut Rule, out: &mut Parsed) -> R<()> {
    let af = r.af;
    for pl in [r.nat.as_mut(), r.rdr.as_mut()].into_iter().flatten() {
        let Some(list) = pl.list.take() else { continue };
        let l: Vec<Host> = list.into_iter().filter(|h| af == Af::Any || h.af() == Af::Any || h.af() == af).collect();
        match l.len() {
            0 => return Err("no translation address with matching address family found.".into()),
            1 => pl.host = l[0].clone(),
            _ => {
                let name = format!("__automatic_{}", out.auto_tables);
                out.auto_tables += 1;
                let tb = Table {
                    name: name.clone(),
                    konst: true,
                    persist: false,
                    counters: false,
                    parts: vec![TablePart::Hosts(l)],
                };
                out.header.push(crate::print::table(&tb));
                out.tables.push(tb);
                pl.host = Host { neg: false, kind: HostKind::Table(name) };
                if pl.kind == PoolKind::None {
                    pl.kind = PoolKind::RoundRobin;
                }
            }
        }
    }
    Ok(())
}

fn set_option(p: &mut P, out: &mut Parsed) -> R<()> {
    let num = |p: &mut P| -> R<u32> {
        let s = p.string()?;
        let v = if let Some(h) = s.strip_prefix("0x") { u32::from_str_radix(h, 16) } else { s.parse() };
        v.map_err(|_| "syntax error".to_string())
    };
    match p.string()?.as_str() {
        "block-policy" => {
            let v = p.string()?;
            out.block_return = match v.as_str() {
                "drop" => false,
                "return" => true,
                _ => return Err("syntax error".into()),
            };
            out.header.push(format!("set block-policy {v}"));
        }
        "optimization" => {
            let v = p.string()?;
            if !["default", "normal", "high-latency", "satellite", "aggressive", "conservative"].contains(&v.as_str()) {
                return Err(format!("unknown optimization {v}"));
            }
            out.header.push(format!("set optimization {v}"));
        }
        "timeout" => {
            let items = p.list(|p| {
                let name = p.string()?;
                let t = xpf_state::Timeout::from_name(&name).ok_or_else(|| format!("unknown timeout {name}"))?;
                Ok((t, num(p)?))
            })?;
            for (t, v) in items {
                out.header.push(format!("set timeout {} {v}", t.name()));
                out.timeouts.push((t, v));
            }
        }
        "limit" => {
            let items = p.list(|p| {
                let name = p.string()?;
                if !["states", "frags", "src-nodes", "tables", "table-entries", "pktdelay-pkts", "anchors"]
                    .contains(&name.as_str())
                {
                    return Err(format!("unknown limit {name}"));
                }
                Ok((name, num(p)?))
            })?;
            for (n, v) in items {
                out.header.push(format!("set limit {n} {v}"));
                out.limits.push((n, v));
            }
        }
        "loginterface" => {
            let v = p.string()?;
            out.header.push(format!("set loginterface {v}"));
        }
        "hostid" => {
            let v = num(p)?;
            if v == 0 {
                return Err("hostid must be non-zero".into());
            }
            out.header.push(format!("set hostid 0x{v:08x}"));
        }
        "reassemble" => {
            let v = p.string()?;
            if v != "yes" && v != "no" {
                return Err("syntax error".into());
            }
            let nodf = p.eat("no-df");
            out.header.push(format!("set reassemble {v} {}", if nodf { "no-df" } else { "" }));
        }
        "state-policy" => {
            let v = p.string()?;
            if v != "if-bound" && v != "floating" {
                return Err("syntax error".into());
            }
            out.header.push(format!("set state-policy {v}"));
        }
        "debug" => {
            let v = p.string()?;
            out.header.push(format!("set debug {v}"));
        }
        "skip" => {
            if !p.eat("on") {
                return Err("syntax error".into());
            }
            let ifs = p.list(|p| p.string())?;
            for i in &ifs {
                out.header.push(format!("set skip on {i}"));
            }
            out.skip.extend(ifs);
        }
        "ruleset-optimization" => {
            let v = p.string()?;
            if !["none", "basic", "profile"].contains(&v.as_str()) {
                return Err(format!("unknown ruleset-optimization {v}"));
            }
            out.header.push(format!("set ruleset-optimization {v}"));
        }
        w @ ("syncookies" | "fingerprints" | "require-order" | "state-defaults" | "prio") => {
            return Err(unsupported(&format!("set {w}")))
        }
        _ => return Err("syntax error".into()),
    }
    if p.done() {
        Ok(())
    } else {
        Err("syntax error".into())
    }
}

fn rule(p: &mut P, line: u32, block_return: bool) -> R<Vec<Template>> {
    let word = p.string()?;
    let action = match word.as_str() {
        "pass" => Action::Pass,
        "block" => Action::Block,
        _ => Action::Match,
    };
    let anchor = if word == "anchor" {
        match p.peek().clone() {
            Tok::Str(n) | Tok::Word(n)
                if !["in", "out", "on", "inet", "inet6", "proto", "from", "to", "all", "log", "quick"]
                    .contains(&n.as_str()) =>
            {
                // Unlike labels and tags, an anchor may be named by a number.
                p.next();
                Some(n)
            }
            _ => Some(String::new()),
        }
    } else {
        None
    };
    let mut r = rule_shell(action, line);
    if action == Action::Block && block_return {
        r.ret = Return::Return;
    }
    if anchor.is_some() {
        r.state = StateKind::No;
        r.anchor = anchor;
    }
    if action == Action::Block {
        block_return_spec(p, &mut r)?;
    }
    let mut t = Template {
        r,
        ifs: vec![],
        protos: vec![],
        src: vec![],
        src_ports: vec![],
        dst: vec![],
        dst_ports: vec![],
        icmp: vec![],
        users: vec![],
        groups: vec![],
    };
    if p.eat("in") {
        t.r.dir = Dir::In;
    } else if p.eat("out") {
        t.r.dir = Dir::Out;
    }
    // `log` and `quick` come in either order.
    for _ in 0..2 {
        if p.eat("log") {
            let mut l = Log::default();
            if p.eat_punct("(") {
                loop {
                    match p.string()?.as_str() {
                        "all" => l.all = true,
                        "matches" => l.matches = true,
                        "user" => l.user = true,
                        "to" => l.to = Some(p.string()?),
                        _ => return Err("syntax error".into()),
                    }
                    if p.eat_punct(")") {
                        break;
                    }
                    p.expect_punct(",")?;
                }
            }
            t.r.log = Some(l);
        }
        if p.eat("quick") {
            t.r.quick = true;
        }
    }
    if p.eat("on") {
        t.ifs = p.list(|p| {
            let neg = p.eat_punct("!");
            Ok(Iface { neg, name: p.string()? })
        })?;
    }
    if p.eat("inet") {
        t.r.af = Af::Inet;
    } else if p.eat("inet6") {
        t.r.af = Af::Inet6;
    }
    if p.eat("proto") {
        t.protos = p.list(|p| {
            let s = p.string()?;
            names::proto_number(&s).ok_or_else(|| format!("unknown protocol {s}"))
        })?;
    }
    if p.eat("all") {
    } else {
        if p.eat("from") {
            hostport(p, &mut t.src, &mut t.src_ports)?;
        }
        if p.eat("to") {
            hostport(p, &mut t.dst, &mut t.dst_ports)?;
        }
    }
    filter_opts(p, &mut t)?;
    if t.ifs.is_empty() {
        if let Some(sc) = p.scope.take() {
            t.ifs = vec![Iface { neg: false, name: sc }];
        }
    }
    if t.r.af_to.is_some() && t.r.route.is_some() {
        return Err("af-to cannot be used together with route-to, reply-to, dup-to".into());
    }
    if t.r.anchor.is_some() && t.r.state_explicit {
        return Err("cannot specify state handling on anchors".into());
    }
    if t.r.anchor.is_some() && p.eat_punct("{") {
        t.r.opens = true;
    }
    if !p.done() {
        return Err("syntax error".into());
    }
    if matches!(t.r.flags, Some(Flags::Set { .. })) && !t.protos.is_empty() && !t.protos.contains(&6) {
        return Err("flags only apply to tcp".into());
    }
    match (&t.r.divert, t.r.dir) {
        (Some(Divert::To(..)), Dir::Out) => return Err("divert-to used with outgoing rule".into()),
        (Some(Divert::Reply), Dir::In) => return Err("divert-reply used with incoming rule".into()),
        (Some(Divert::To(a, _)), _) => {
            let fam = if a.is_ipv4() { Af::Inet } else { Af::Inet6 };
            if t.r.af != Af::Any && t.r.af != fam {
                return Err("divert-to address family mismatch".into());
            }
            t.r.af = fam;
        }
        _ => {}
    }
    for tag in [t.r.tag.as_ref(), t.r.tagged.as_ref().map(|x| &x.1)].into_iter().flatten() {
        if tag.len() > 63 {
            return Err("tag too long, max 63 chars".into());
        }
    }
    // Adaptive timeouts follow a rule's `max` unless given (pfctl: 60% and 120% of it).
    let o = &mut t.r.state_opts;
    if let Some(m) = o.max {
        let has = |o: &StateOpts, x| o.timeouts.iter().any(|(t, _)| *t == x);
        if !has(o, xpf_state::Timeout::AdaptiveStart) && !has(o, xpf_state::Timeout::AdaptiveEnd) {
            o.timeouts.push((xpf_state::Timeout::AdaptiveStart, m / 10 * 6));
            o.timeouts.push((xpf_state::Timeout::AdaptiveEnd, m / 10 * 12));
        }
    }
    // binat-to is two rules: out with nat-to (static-port), in with rdr-to back. A target with
    // several addresses (an interface) keeps those of the rule's family.
    if let Some(mut b) = t.r.binat.take() {
        if matches!(b.host.kind, HostKind::Table(_)) || t.src.iter().any(|h| matches!(h.kind, HostKind::Table(_))) {
            return Err("binat-to requires a specified source and redirect address".into());
        }
        if let Some(list) = b.list.take() {
            let fam = t.src.iter().chain(t.dst.iter()).map(Host::af).find(|a| *a != Af::Any).unwrap_or(t.r.af);
            let l: Vec<Host> = list.into_iter().filter(|h| fam == Af::Any || h.af() == fam).collect();
            match l.len() {
                1 => b.host = l[0].clone(),
                _ => return Err("binat-to requires a specified source and redirect address".into()),
            }
        }
        let mut out = t.clone();
        out.r.dir = Dir::Out;
        out.r.nat = Some(Pool { static_port: true, ..b.clone() });
        let mut inb = t.clone();
        inb.r.dir = Dir::In;
        inb.src = t.dst.clone();
        inb.dst = vec![b.host.clone()];
        let orig = t.src.first().cloned().unwrap_or(Host::ANY);
        inb.r.rdr =
            Some(Pool { host: orig, port: None, kind: PoolKind::None, sticky: false, static_port: false, list: None });
        return Ok(vec![out, inb]);
    }
    Ok(vec![t])
}

/// `antispoof [log] [quick] for IF [inet|inet6] [label]`: per interface, drop what comes in on
/// other interfaces from its networks, and for a non-loopback interface what claims one of its
/// own addresses (pfctl's expansion).
fn antispoof(p: &mut P, line: u32) -> R<Vec<Template>> {
    p.next();
    // The rule part after `antispoof`, parsed as a block rule's header.
    let mut base = rule_shell(Action::Block, line);
    base.ret = Return::Drop;
    for _ in 0..2 {
        if p.eat("log") {
            base.log = Some(Log::default());
        }
        if p.eat("quick") {
            base.quick = true;
        }
    }
    if !p.eat("for") {
        return Err("syntax error".into());
    }
    let ifs = p.list(|p| {
        if p.eat_punct("(") {
            let n = p.string()?;
            p.expect_punct(")")?;
            Ok((n, true))
        } else {
            Ok((p.string()?, false))
        }
    })?;
    if p.eat("inet") {
        base.af = Af::Inet;
    } else if p.eat("inet6") {
        base.af = Af::Inet6;
    }
    if p.eat("label") {
        base.label = Some(p.string()?);
    }
    if !p.done() {
        return Err("syntax error".into());
    }
    base.dir = Dir::In;
    let mut out = Vec::new();
    let tmpl = |r: &Rule, ifs: Vec<Iface>, src: Vec<Host>| Template {
        r: r.clone(),
        ifs,
        protos: vec![],
        src,
        src_ports: vec![],
        dst: vec![],
        dst_ports: vec![],
        icmp: vec![],
        users: vec![],
        groups: vec![],
    };
    for (name, dynamic) in ifs {
        let on = vec![Iface { neg: true, name: name.clone() }];
        if dynamic {
            let h = Host {
                neg: false,
                kind: HostKind::Dynamic { ifname: name, modifier: Some("network".into()), prefix: None },
            };
            out.push(tmpl(&base, on, vec![h]));
            continue;
        }
        let addrs = crate::ifaddr::addresses(&name)
            .ok_or_else(|| format!("{BARE}no IP address found for {name}\ncould not parse host specification"))?;
        let fam =
            |v: Vec<Host>| -> Vec<Host> { v.into_iter().filter(|h| base.af == Af::Any || h.af() == base.af).collect() };
        let nets = fam(interface_hosts(&addrs, Some("network"), None, false));
        if !nets.is_empty() {
            out.push(tmpl(&base, on, nets));
        }
        if crate::ifaddr::is_loopback(&name) == Some(false) {
            let own = fam(interface_hosts(&addrs, None, None, false));
            if !own.is_empty() {
                out.push(tmpl(&base, vec![], own));
            }
        }
    }
    Ok(out)
}

/// A rule with pf's defaults for `action`, before its options are read.
fn rule_shell(action: Action, line: u32) -> Rule {
    Rule {
        action,
        ret: Return::Drop,
        dir: Dir::Both,
        log: None,
        quick: false,
        on: None,
        af: Af::Any,
        proto: None,
        src: Host::ANY,
        src_port: None,
        dst: Host::ANY,
        dst_port: None,
        flags: None,
        icmp: None,
        icmp6: false,
        tos: None,
        state: if action == Action::Pass { StateKind::Keep } else { StateKind::No },
        state_explicit: false,
        allow_opts: false,
        label: None,
        tag: None,
        tagged: None,
        state_opts: StateOpts::default(),
        user: None,
        group: None,
        nat: None,
        rdr: None,
        binat: None,
        scrub: None,
        probability: None,
        anchor: None,
        set_prio: None,
        set_queue: None,
        set_tos: None,
        divert: None,
        route: None,
        rtable: None,
        af_to: None,
        depth: 0,
        opens: false,
        line,
    }
}

fn block_return_spec(p: &mut P, r: &mut Rule) -> R<()> {
    let icmp_code = |p: &mut P, v6: bool| -> R<Option<u8>> {
        if !p.eat_punct("(") {
            return Ok(None);
        }
        let s = p.string()?;
        let c = names::icmp_code(&s, v6).ok_or_else(|| format!("unknown icmp code {s}"))?.1;
        p.expect_punct(")")?;
        Ok(Some(c))
    };
    if p.eat("drop") {
        r.ret = Return::Drop;
    } else if p.eat("return") {
        r.ret = Return::Return;
    } else if p.eat("return-rst") {
        let mut ttl = None;
        if p.eat_punct("(") {
            if !p.eat("ttl") {
                return Err("syntax error".into());
            }
            ttl = Some(p.string()?.parse().map_err(|_| "syntax error".to_string())?);
            p.expect_punct(")")?;
        }
        r.ret = Return::Rst { ttl };
    } else if p.eat("return-icmp") {
        let mut v6 = None;
        let v4 = if p.eat_punct("(") {
            let a = p.string()?;
            let a = names::icmp_code(&a, false).ok_or_else(|| format!("unknown icmp code {a}"))?.1;
            if p.eat_punct(",") {
                let b = p.string()?;
                v6 = Some(names::icmp_code(&b, true).ok_or_else(|| format!("unknown icmp6 code {b}"))?.1);
            }
            p.expect_punct(")")?;
            Some(a)
        } else {
            None
        };
        r.ret = Return::Icmp { v4, v6 };
    } else if p.eat("return-icmp6") {
        let v6 = icmp_code(p, true)?;
        r.ret = Return::Icmp { v4: None, v6 };
    }
    Ok(())
}

fn parse_addr(s: &str) -> Option<(IpAddr, Option<u8>)> {
    // A scoped IPv6 address (fe80::1%lo0): pfctl keeps the scope in the kernel's form and prints
    // the address without it.
    let s = match s.split_once('%') {
        Some((a, _)) if a.contains(':') => a,
        _ => s,
    };
    if let Ok(a) = s.parse::<IpAddr>() {
        return Some((a, None));
    }
    // pfctl's short forms: 10, 10.1, 10.1.2 (the rest zero), used with a prefix: 10/8.
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() < 4 && parts.iter().all(|x| !x.is_empty() && x.len() <= 3 && x.bytes().all(|b| b.is_ascii_digit())) {
        let mut b = [0u8; 4];
        for (i, x) in parts.iter().enumerate() {
            b[i] = x.parse().ok()?;
        }
        return Some((IpAddr::from(b), Some((parts.len() * 8) as u8)));
    }
    None
}

fn mask(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(v) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            IpAddr::from((u32::from(v) & m).to_be_bytes())
        }
        IpAddr::V6(v) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            IpAddr::from((u128::from(v) & m).to_be_bytes())
        }
    }
}

/// A host, or the several addresses a name stands for (`localhost`: 127.0.0.1 and ::1, as
/// the resolver gives them).
fn hosts(p: &mut P) -> R<Vec<Host>> {
    if p.is("localhost") {
        p.next();
        let (mut b4, mut b6) = (32u8, 128u8);
        if p.eat_punct("/") {
            let l: u8 = p.string()?.parse().map_err(|_| "syntax error".to_string())?;
            b4 = l.min(32);
            b6 = l.min(128);
        }
        let l4 = Host { neg: false, kind: HostKind::Net(mask(IpAddr::from([127, 0, 0, 1]), b4), b4) };
        let l6 = Host { neg: false, kind: HostKind::Net(mask(IpAddr::from(std::net::Ipv6Addr::LOCALHOST), b6), b6) };
        return Ok(vec![l4, l6]);
    }
    if p.punct("!") && matches!(p.t.get(p.i + 1).map(|t| &t.tok), Some(Tok::Word(w)) if w == "localhost") {
        p.next();
        let mut v = hosts(p)?;
        for h in &mut v {
            h.neg = true;
        }
        return Ok(v);
    }
    // An interface name: its addresses now (pfctl resolves them when it reads the file).
    if let Some(Tok::Word(w)) = p.t.get(p.i + p.punct("!") as usize).map(|t| &t.tok) {
        let (name, modifier) = match w.split_once(':') {
            Some((a, b)) => (a.to_string(), Some(b.to_string())),
            None => (w.clone(), None),
        };
        if w.parse::<IpAddr>().is_err()
            && parse_addr(w).is_none()
            && !["any", "self", "no-route", "urpf-failed"].contains(&w.as_str())
        {
            if let Some(addrs) = crate::ifaddr::addresses(&name) {
                let neg = p.eat_punct("!");
                p.next();
                let prefix = if p.eat_punct("/") {
                    Some(p.string()?.parse::<u8>().map_err(|_| "syntax error".to_string())?)
                } else {
                    None
                };
                return Ok(interface_hosts(&addrs, modifier.as_deref(), prefix, neg));
            }
        }
    }
    Ok(vec![host(p)?])
}

/// The hosts an interface stands for: every address (or `:network`, `:broadcast`, `:peer`,
/// `:0` for the first of each family), with an optional mask applied.
fn interface_hosts(
    addrs: &[crate::ifaddr::IfAddr],
    modifier: Option<&str>,
    prefix: Option<u8>,
    neg: bool,
) -> Vec<Host> {
    let mut out = Vec::new();
    let (mut seen4, mut seen6) = (false, false);
    for a in addrs {
        let v4 = a.addr.is_ipv4();
        let full = if v4 { 32 } else { 128 };
        let (addr, len) = match modifier {
            // pfctl leaves link-local networks out of `:network`.
            Some("network") if matches!(a.addr, IpAddr::V6(v) if v.segments()[0] & 0xffc0 == 0xfe80) => continue,
            Some("network") => (mask(a.addr, a.prefix), a.prefix),
            Some("broadcast") => match (a.dst, a.point_to_point, v4) {
                (Some(b), false, true) => (b, 32),
                _ => continue,
            },
            Some("peer") => match (a.dst, a.point_to_point) {
                (Some(b), true) => (b, full),
                _ => continue,
            },
            Some("0") => {
                let seen = if v4 { &mut seen4 } else { &mut seen6 };
                if *seen {
                    continue;
                }
                *seen = true;
                (a.addr, full)
            }
            _ => (a.addr, full),
        };
        let len = prefix.map_or(len, |p| p.min(full));
        out.push(Host { neg, kind: HostKind::Net(mask(addr, len), len) });
    }
    out
}

fn host(p: &mut P) -> R<Host> {
    if let Tok::Word(w) = p.peek() {
        if let Some((a, scope)) = w.split_once('%') {
            if a.contains(':') {
                p.scope = Some(scope.to_string());
            }
        }
    }
    let neg = p.eat_punct("!");
    let kind = if p.eat_punct("<") {
        let n = p.string()?;
        p.expect_punct(">")?;
        HostKind::Table(n)
    } else if p.eat_punct("(") {
        let s = p.string()?;
        p.expect_punct(")")?;
        if s.starts_with(|c: char| c.is_ascii_digit()) || s.contains("::") {
            return Err(format!("invalid interface name '{s}'"));
        }
        let (ifname, modifier) = match s.split_once(':') {
            Some((a, b)) => (a.to_string(), Some(b.to_string())),
            None => (s, None),
        };
        let prefix =
            if p.eat_punct("/") { Some(p.string()?.parse().map_err(|_| "syntax error".to_string())?) } else { None };
        HostKind::Dynamic { ifname, modifier, prefix }
    } else {
        let s = p.string()?;
        match s.as_str() {
            "any" => HostKind::Any,
            "no-route" => HostKind::NoRoute,
            "urpf-failed" => HostKind::UrpfFailed,
            "self" => HostKind::SelfAddr,
            _ => {
                let Some((a, short)) = parse_addr(&s) else {
                    return Err(format!("{BARE}no IP address found for {s}\ncould not parse host specification"));
                };
                let max = if a.is_ipv4() { 32 } else { 128 };
                if p.eat_punct("/") {
                    let l: u32 = p.string()?.parse().map_err(|_| "syntax error".to_string())?;
                    if l > 128 {
                        return Err(format!("{BARE}netmask is too large: /{l}\ncould not parse host specification"));
                    }
                    // A v4 mask above 32 is refused when the rule is expanded, as pfctl does.
                    HostKind::Net(mask(a, l.min(max as u32) as u8), l as u8)
                } else if p.is("-") {
                    p.next();
                    let b = p.string()?;
                    let (b, _) = parse_addr(&b).ok_or_else(|| "could not parse host specification".to_string())?;
                    HostKind::Range(a, b)
                } else if let Some(l) = short {
                    HostKind::Net(mask(a, l), l)
                } else {
                    HostKind::Net(a, max)
                }
            }
        }
    };
    Ok(Host { neg, kind })
}

/// A user or group operand: a number or a name (this machine's, as pf's `user` matches local
/// sockets), with the port operators.
fn id_op(p: &mut P, group: bool) -> R<PortOp> {
    let id = |s: &str| -> R<u16> {
        if let Ok(n) = s.parse::<u32>() {
            return u16::try_from(n).map_err(|_| format!("illegal {} value {n}", if group { "gid" } else { "uid" }));
        }
        let c = std::ffi::CString::new(s).map_err(|_| "syntax error".to_string())?;
        // SAFETY: c is a valid C string; the returned pointer is read at once.
        let v = unsafe {
            if group {
                let g = libc::getgrnam(c.as_ptr());
                (!g.is_null()).then(|| (*g).gr_gid)
            } else {
                let u = libc::getpwnam(c.as_ptr());
                (!u.is_null()).then(|| (*u).pw_uid)
            }
        };
        v.and_then(|x| u16::try_from(x).ok())
            .ok_or_else(|| format!("unknown {} {s}", if group { "group" } else { "user" }))
    };
    op_spec(p, &id, false)
}

fn port_num(s: &str) -> R<u16> {
    if let Some(h) = s.strip_prefix("0x") {
        let n = u64::from_str_radix(h, 16).map_err(|_| format!("unknown port {s}"))?;
        return u16::try_from(n).map_err(|_| format!("illegal port value {n}"));
    }
    if let Ok(n) = s.parse::<u64>() {
        return u16::try_from(n).map_err(|_| format!("illegal port value {n}"));
    }
    names::port_number(s).ok_or_else(|| format!("unknown port {s}"))
}

fn port(p: &mut P) -> R<PortOp> {
    op_spec(p, &port_num, true)
}

/// An operator and operand(s), for ports, users and groups: `= n`, `!= n`, `< n`, `<= n`,
/// `> n`, `>= n`, `a >< b`, `a <> b`, a bare `n`, and for ports `a:b`.
fn op_spec(p: &mut P, val: &dyn Fn(&str) -> R<u16>, colon_range: bool) -> R<PortOp> {
    for op in ["=", "!=", "<", "<=", ">", ">="] {
        if p.eat_punct(op) {
            let n = val(&p.string()?)?;
            return Ok(match op {
                "=" => PortOp::Eq(n),
                "!=" => PortOp::Ne(n),
                "<" => PortOp::Lt(n),
                "<=" => PortOp::Le(n),
                ">" => PortOp::Gt(n),
                _ => PortOp::Ge(n),
            });
        }
    }
    let a = p.string()?;
    if colon_range {
        if let Some((x, y)) = a.split_once(':') {
            return Ok(PortOp::Range(val(x)?, val(y)?));
        }
    }
    let a = val(&a)?;
    if p.eat_punct("><") {
        return Ok(PortOp::Inside(a, val(&p.string()?)?));
    }
    if p.eat_punct("<>") {
        return Ok(PortOp::Outside(a, val(&p.string()?)?));
    }
    Ok(PortOp::Eq(a))
}

fn hostport(p: &mut P, out: &mut Vec<Host>, ports: &mut Vec<PortOp>) -> R<()> {
    if !p.is("port") {
        *out = p.list(hosts)?.into_iter().flatten().collect();
    }
    if p.eat("port") {
        *ports = p.list(port)?;
    }
    Ok(())
}

const FLAG_CHARS: &str = "FSRPAUEW";

fn flag_bits(s: &str) -> R<u8> {
    let mut b = 0u8;
    for c in s.chars() {
        let i = FLAG_CHARS.find(c).ok_or_else(|| "syntax error".to_string())?;
        b |= 1 << i;
    }
    Ok(b)
}

fn filter_opts(p: &mut P, t: &mut Template) -> R<()> {
    while !p.done() && (t.r.anchor.is_none() || !p.punct("{")) {
        if p.eat("flags") {
            if p.eat("any") {
                t.r.flags = Some(Flags::Any);
                continue;
            }
            // pfctl's grammar: flags F/M or flags /M (a lone F or an empty mask is an error).
            let bits = if p.punct("/") { 0 } else { flag_bits(&p.string()?)? };
            p.expect_punct("/")?;
            let mask = match p.peek() {
                Tok::Word(_) => flag_bits(&p.string()?)?,
                _ => return Err("syntax error".into()),
            };
            if bits & mask != bits {
                return Err("flags always false".into());
            }
            t.r.flags = Some(Flags::Set { bits, mask });
        } else if p.is("icmp-type") || p.is("icmp6-type") {
            let v6 = p.string()? == "icmp6-type";
            t.r.icmp6 = v6;
            t.icmp = p.list(|p| {
                let s = p.string()?;
                let ty = names::icmp_type(&s, v6).ok_or_else(|| format!("unknown icmp-type {s}"))?;
                let code = if p.eat("code") {
                    let c = p.string()?;
                    Some(names::icmp_code(&c, v6).ok_or_else(|| format!("unknown icmp-code {c}"))?.1)
                } else {
                    None
                };
                Ok((ty, code))
            })?;
        } else if p.eat("tos") {
            let s = p.string()?;
            t.r.tos = Some(tos_value(&s)?);
        } else if p.eat("no") {
            if !p.eat("state") {
                return Err("syntax error".into());
            }
            t.r.state = StateKind::No;
        } else if p.eat("keep") || p.is("modulate") || p.is("synproxy") {
            let k = if p.eat("modulate") {
                StateKind::Modulate
            } else if p.eat("synproxy") {
                StateKind::Synproxy
            } else {
                StateKind::Keep
            };
            if !p.eat("state") {
                return Err("syntax error".into());
            }
            t.r.state = k;
            t.r.state_explicit = true;
            if p.eat_punct("(") {
                state_opts(p, &mut t.r.state_opts)?;
            }
        } else if p.is("user") || p.is("group") {
            let g = p.string()? == "group";
            let v = p.list(|p| id_op(p, g))?;
            // A later `user` goes first, as pfctl links them.
            let l = if g { &mut t.groups } else { &mut t.users };
            for (i, x) in v.into_iter().enumerate() {
                l.insert(i, x);
            }
        } else if p.is("divert-to") || p.is("divert-reply") || p.is("divert-packet") {
            if t.r.divert.is_some() {
                return Err("more than one divert option".into());
            }
            let w = p.string()?;
            t.r.divert = Some(match w.as_str() {
                "divert-reply" => Divert::Reply,
                "divert-packet" => {
                    if !p.eat("port") {
                        return Err("syntax error".into());
                    }
                    Divert::Packet(port_num(&p.string()?)?)
                }
                _ => {
                    // The first address of the host, of the rule's family when it has one.
                    let hs = hosts(p)?;
                    let fam = t.r.af;
                    let a = match hs.iter().find(|h| fam == Af::Any || h.af() == fam).or(hs.first()).map(|h| &h.kind) {
                        Some(HostKind::Net(a, _)) => *a,
                        _ => return Err("could not parse host specification".into()),
                    };
                    if !p.eat("port") {
                        return Err("syntax error".into());
                    }
                    Divert::To(a, port_num(&p.string()?)?)
                }
            });
        } else if p.is("route-to") || p.is("reply-to") || p.is("dup-to") {
            let kind = match p.string()?.as_str() {
                "route-to" => RouteKind::RouteTo,
                "reply-to" => RouteKind::ReplyTo,
                _ => RouteKind::DupTo,
            };
            t.r.route = Some((kind, pool(p, false)?));
        } else if p.is("nat-to") || p.is("rdr-to") || p.is("binat-to") {
            let which = p.string()?;
            let pool = pool(p, which == "nat-to")?;
            match which.as_str() {
                "nat-to" => t.r.nat = Some(pool),
                "rdr-to" => t.r.rdr = Some(pool),
                _ => t.r.binat = Some(pool),
            }
        } else if p.eat("set") {
            // `set prio`, `set queue`, `set tos`, alone or in parentheses.
            let paren = p.eat_punct("(");
            loop {
                let w = p.string()?;
                match w.as_str() {
                    "prio" => {
                        let one = |p: &mut P| -> R<u8> {
                            let s = p.string()?;
                            match s.parse::<i64>() {
                                Ok(v) if (0..=7).contains(&v) => Ok(v as u8),
                                Ok(_) => Err("prio must be 0 - 7".into()),
                                Err(_) => Err("syntax error".into()),
                            }
                        };
                        if p.eat_punct("(") {
                            let a = one(p)?;
                            p.eat_punct(",");
                            let b = one(p)?;
                            p.expect_punct(")")?;
                            t.r.set_prio = Some((a, b));
                        } else {
                            if p.done() {
                                return Err("syntax error".into());
                            }
                            let a = one(p)?;
                            t.r.set_prio = Some((a, a));
                        }
                    }
                    "queue" => {
                        if p.eat_punct("(") {
                            let a = p.string()?;
                            p.expect_punct(",")?;
                            let b = p.string()?;
                            p.expect_punct(")")?;
                            t.r.set_queue = Some((a, Some(b)));
                        } else {
                            t.r.set_queue = Some((p.string()?, None));
                        }
                    }
                    "tos" => {
                        let s = p.string()?;
                        t.r.set_tos = Some(tos_value(&s)?);
                    }
                    _ => return Err("syntax error".into()),
                }
                if !paren || p.eat_punct(")") {
                    break;
                }
                p.expect_punct(",")?;
            }
        } else if p.eat("af-to") {
            let af = if p.eat("inet") {
                Af::Inet
            } else if p.eat("inet6") {
                Af::Inet6
            } else {
                return Err("syntax error".into());
            };
            if !p.eat("from") {
                return Err("syntax error".into());
            }
            let from = host(p)?;
            let to = if p.eat("to") { Some(host(p)?) } else { None };
            t.r.af_to = Some((af, from, to));
        } else if p.eat("rtable") {
            let v = p.string()?;
            t.r.rtable = Some(v.parse().map_err(|_| format!("invalid rtable id {v}"))?);
        } else if p.eat("probability") {
            let v = p.string()?;
            let pct = match v.strip_suffix('%') {
                Some(x) => x.parse::<f64>(),
                None => v.parse::<f64>().map(|x| x * 100.0),
            }
            .map_err(|_| format!("invalid probability: {v}"))?;
            if !(0.0..=100.0).contains(&pct) {
                return Err(format!("invalid probability: {v}"));
            }
            t.r.probability = Some(pct);
        } else if p.eat("scrub") {
            t.r.scrub = Some(scrub_opts(p)?);
        } else if p.eat("allow-opts") {
            t.r.allow_opts = true;
        } else if p.eat("label") {
            t.r.label = Some(p.name()?);
        } else if p.eat("tag") {
            t.r.tag = Some(p.name()?);
        } else if p.eat("tagged") {
            t.r.tagged = Some((false, p.name()?));
        } else if p.eat_punct("!") {
            if !p.eat("tagged") {
                return Err("syntax error".into());
            }
            t.r.tagged = Some((true, p.name()?));
        } else if let Some(w) = p.word().filter(|w| UNSUPPORTED_OPTIONS.contains(w)) {
            return Err(unsupported(w));
        } else {
            return Err("syntax error".into());
        }
    }
    Ok(())
}

fn tos_value(s: &str) -> R<u8> {
    match s {
        "lowdelay" => return Ok(0x10),
        "throughput" => return Ok(0x08),
        "reliability" => return Ok(0x04),
        _ => {}
    }
    let v = if let Some(h) = s.strip_prefix("0x") { u8::from_str_radix(h, 16) } else { s.parse() };
    v.map_err(|_| format!("illegal tos value {s}"))
}

fn bandwidth(p: &mut P) -> R<Bandwidth> {
    let s = p.string()?;
    if let Some(x) = s.strip_suffix('%') {
        return x.parse().map(Bandwidth::Percent).map_err(|_| format!("invalid bandwidth {s}"));
    }
    let t = s.strip_suffix("b").unwrap_or(&s);
    let (num, mul) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1_000u64),
        Some('M') => (&t[..t.len() - 1], 1_000_000),
        Some('G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (t, 1),
    };
    num.parse::<u64>().map(|n| Bandwidth::Bits(n * mul)).map_err(|_| format!("invalid bandwidth {s}"))
}

fn queue(p: &mut P, line: u32) -> R<Queue> {
    let mut q = Queue { name: p.string()?, line, ..Queue::default() };
    let num = |p: &mut P| -> R<u32> { p.string()?.parse().map_err(|_| "syntax error".to_string()) };
    while !p.done() {
        let w = p.string()?;
        match w.as_str() {
            "on" => q.on = Some(p.string()?),
            "parent" => q.parent = Some(p.string()?),
            "bandwidth" => q.bandwidth = Some(bandwidth(p)?),
            "min" => q.min = Some(bandwidth(p)?),
            "max" => q.max = Some(bandwidth(p)?),
            "flows" => q.flows = Some(num(p)?),
            "quantum" => q.quantum = Some(num(p)?),
            "qlimit" => q.qlimit = Some(num(p)?),
            "default" => q.default = true,
            _ => return Err("syntax error".into()),
        }
        p.eat_punct(",");
    }
    if q.bandwidth.is_none() && q.flows.is_none() {
        return Err("no bandwidth or flow specification".into());
    }
    Ok(q)
}

/// pfctl's checks of the queue tree, after the whole file is read (bare `pfctl:` messages).
fn check_queues(out: &mut Parsed, file: &str) {
    let qs = out.queues.clone();
    if qs.is_empty() {
        return;
    }
    let has_children = |n: &str| qs.iter().any(|q| q.parent.as_deref() == Some(n));
    let mut msgs = Vec::new();
    for q in &qs {
        if q.default && has_children(&q.name) {
            msgs.push(format!("pfctl: default queue {} is not a leaf queue", q.name));
        }
        if q.flows.is_some() && has_children(&q.name) {
            msgs.push(format!("pfctl: flow queue {} is not a leaf queue", q.name));
        }
    }
    let hfsc = qs.iter().any(|q| q.bandwidth.is_some());
    if !out.errors.is_empty() {
        // The tree is checked when the file parsed; the reference is checked as it is read.
        msgs.clear();
    } else if msgs.is_empty() && hfsc {
        for q in &qs {
            if q.bandwidth.is_none() {
                msgs.push(format!("pfctl: queue {}: no bandwidth was specified", q.name));
            }
        }
        if msgs.is_empty() && !qs.iter().any(|q| q.default) {
            msgs.push("pfctl: no default queue specified".into());
        }
    }
    for r in &out.rules {
        if let Some((a, b)) = &r.set_queue {
            for n in std::iter::once(a).chain(b.iter()) {
                if !qs.iter().any(|q| &q.name == n) {
                    out.errors.push(ConfError {
                        file: file.into(),
                        line: r.line,
                        msg: format!("queue {n} is not defined"),
                        bare: false,
                    });
                }
            }
        }
    }
    // pfctl stops at the first problem of the tree.
    out.errors.extend(msgs.into_iter().take(1).map(|m| ConfError { file: file.into(), line: 0, msg: m, bare: true }));
}

fn table(p: &mut P) -> R<Table> {
    p.expect_punct("<")?;
    let name = p.string()?;
    p.expect_punct(">")?;
    if name.len() > 31 {
        return Err("table name too long, max 31 chars".to_string());
    }
    let mut t = Table { name, konst: false, persist: false, counters: false, parts: Vec::new() };
    while !p.done() {
        if p.eat("const") {
            t.konst = true;
        } else if p.eat("persist") {
            t.persist = true;
        } else if p.eat("counters") {
            t.counters = true;
        } else if p.eat("file") {
            let f = p.string()?;
            if let Err(e) = std::fs::metadata(&f) {
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    "No such file or directory".to_string()
                } else {
                    e.to_string()
                };
                return Err(format!("cannot load \"{f}\": {why}"));
            }
            t.parts.push(TablePart::File(f));
        } else if p.punct("{") {
            let hs: Vec<Host> = p.list(hosts)?.into_iter().flatten().collect();
            for h in &hs {
                match &h.kind {
                    HostKind::Table(_) => return Err("tables cannot contain tables".into()),
                    HostKind::Dynamic { .. } => return Err("dynamic addresses are not permitted inside tables".into()),
                    HostKind::NoRoute => return Err("\"no-route\" is not permitted inside tables".into()),
                    HostKind::UrpfFailed => return Err("\"urpf-failed\" is not permitted inside tables".into()),
                    HostKind::SelfAddr => return Err("\"self\" is not permitted inside tables".into()),
                    _ => {}
                }
            }
            match t.parts.last_mut() {
                Some(TablePart::Hosts(v)) => v.extend(hs),
                _ => t.parts.push(TablePart::Hosts(hs)),
            }
        } else {
            return Err("syntax error".into());
        }
    }
    Ok(t)
}

fn scrub_opts(p: &mut P) -> R<Scrub> {
    let mut sc = Scrub::default();
    p.expect_punct("(")?;
    let num = |p: &mut P| -> R<u64> { p.string()?.parse().map_err(|_| "syntax error".to_string()) };
    while !p.eat_punct(")") {
        let w = p.string()?;
        match w.as_str() {
            "no-df" => {
                if sc.no_df {
                    return Err("no-df cannot be respecified".into());
                }
                sc.no_df = true;
            }
            "random-id" => {
                if sc.random_id {
                    return Err("random-id cannot be respecified".into());
                }
                sc.random_id = true;
            }
            "min-ttl" => {
                if sc.min_ttl.is_some() {
                    return Err("min-ttl cannot be respecified".into());
                }
                let v = num(p)?;
                sc.min_ttl = Some(u8::try_from(v).map_err(|_| format!("illegal min-ttl value {v}"))?);
            }
            "max-mss" => {
                if sc.max_mss.is_some() {
                    return Err("max-mss cannot be respecified".into());
                }
                let v = num(p)?;
                sc.max_mss = Some(u16::try_from(v).map_err(|_| format!("illegal max-mss value {v}"))?);
            }
            "set-tos" => {
                let s = p.string()?;
                let v = if let Some(h) = s.strip_prefix("0x") { u8::from_str_radix(h, 16) } else { s.parse() };
                sc.set_tos = Some(v.map_err(|_| format!("illegal tos value {s}"))?);
            }
            "reassemble" => {
                if !p.eat("tcp") {
                    return Err("syntax error".into());
                }
                sc.reassemble_tcp = true;
            }
            _ => return Err("syntax error".into()),
        }
        p.eat_punct(",");
    }
    Ok(sc)
}

fn state_opts(p: &mut P, o: &mut StateOpts) -> R<()> {
    let num = |p: &mut P| -> R<u32> { p.string()?.parse().map_err(|_| "syntax error".to_string()) };
    let mut explicit: Option<bool> = None;
    loop {
        let w = p.string()?;
        match w.as_str() {
            "max" => o.max = Some(num(p)?),
            "no-sync" => o.no_sync = true,
            "pflow" => o.pflow = true,
            "sloppy" => o.sloppy = true,
            "if-bound" => o.if_bound = true,
            "floating" => o.floating = true,
            "source-track" => {
                // Plain `source-track` is global, unless source limits make it per rule (below).
                explicit = if p.eat("global") {
                    Some(false)
                } else if p.eat("rule") {
                    Some(true)
                } else {
                    None
                };
                o.source_track = Some(explicit.unwrap_or(false));
            }
            "max-src-states" => o.max_src_states = Some(num(p)?),
            "max-src-conn" => o.max_src_conn = Some(num(p)?),
            "max-src-nodes" => o.max_src_nodes = Some(num(p)?),
            "max-src-conn-rate" => {
                let a = num(p)?;
                p.expect_punct("/")?;
                o.max_src_conn_rate = Some((a, num(p)?));
            }
            "overload" => {
                p.expect_punct("<")?;
                let t = p.string()?;
                p.expect_punct(">")?;
                let flush = p.eat("flush");
                let global = flush && p.eat("global");
                o.overload = Some((t, flush, global));
            }
            other => match xpf_state::Timeout::from_name(other) {
                Some(t) => o.timeouts.push((t, num(p)?)),
                None => return Err("syntax error".into()),
            },
        }
        if p.eat_punct(")") {
            // Source limits need source tracking: pfctl makes it per rule unless told global.
            let limits = o.max_src_nodes.is_some()
                || o.max_src_states.is_some()
                || o.max_src_conn.is_some()
                || o.max_src_conn_rate.is_some();
            if explicit == Some(false) && o.max_src_nodes.is_some() {
                return Err("'max-src-nodes' is incompatible with 'source-track global'".into());
            }
            if limits && explicit != Some(false) {
                o.source_track = Some(true);
            }
            // The rate's interval keeps source nodes that long, unless told (pfctl).
            if let Some((_, secs)) = o.max_src_conn_rate {
                if !o.timeouts.iter().any(|(t, _)| *t == xpf_state::Timeout::SrcTrack) {
                    o.timeouts.push((xpf_state::Timeout::SrcTrack, secs));
                }
            }
            return Ok(());
        }
        p.expect_punct(",")?;
    }
}

fn pool(p: &mut P, nat: bool) -> R<Pool> {
    let hosts: Vec<Host> = p.list(hosts)?.into_iter().flatten().collect();
    if hosts.is_empty() {
        return Err("could not parse host specification".into());
    }
    let mut pl = Pool {
        host: hosts[0].clone(),
        port: None,
        kind: PoolKind::None,
        sticky: false,
        static_port: false,
        list: None,
    };
    if hosts.len() > 1 {
        pl.list = Some(hosts);
    }
    if p.eat("port") {
        let s = p.string()?;
        pl.port = Some(match s.split_once(':') {
            Some((a, b)) => (port_num(a)?, if b == "*" { 0 } else { port_num(b)? }),
            None => {
                let a = port_num(&s)?;
                (a, a)
            }
        });
    }
    let finish = |mut pl: Pool| {
        // A pool that can hold several addresses is round-robin unless told.
        let several = match &pl.host.kind {
            HostKind::Dynamic { modifier, .. } => modifier.as_deref() != Some("0"),
            HostKind::Table(_) => true,
            _ => false,
        };
        if pl.kind == PoolKind::None && several {
            pl.kind = PoolKind::RoundRobin;
        }
        pl
    };
    loop {
        if p.eat("bitmask") {
            pl.kind = PoolKind::Bitmask;
        } else if p.eat("random") {
            pl.kind = PoolKind::Random;
        } else if p.eat("round-robin") {
            pl.kind = PoolKind::RoundRobin;
        } else if p.eat("source-hash") {
            // The key: 0x and 32 hex digits, or a string whose MD5 is the key (pfctl's way).
            let key = match p.peek().clone() {
                Tok::Word(w) if w.starts_with("0x") => {
                    p.next();
                    if w.len() != 34 || !w[2..].bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err("hash key must be 128 bits, in hex".into());
                    }
                    Some(w.to_ascii_lowercase())
                }
                Tok::Word(w) | Tok::Str(w) if !["sticky-address", "static-port", "port"].contains(&w.as_str()) => {
                    p.next();
                    use md5::Digest;
                    let d = md5::Md5::digest(w.as_bytes());
                    Some(format!("0x{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>()))
                }
                _ => None,
            };
            pl.kind = PoolKind::SourceHash(key);
        } else if p.eat("sticky-address") {
            pl.sticky = true;
        } else if nat && p.eat("static-port") {
            pl.static_port = true;
        } else {
            return Ok(finish(pl));
        }
    }
}

const SKIPPING: &str = "skipping rule due to errors";

/// A pf.conf construct that pfctl accepts and xpf does not implement yet: said as such, so
/// that nobody mistakes it for a mistake in the file.
fn unsupported(what: &str) -> String {
    format!("xpf does not support '{what}' yet")
}

/// Statements of pf.conf (OpenBSD's and the older FreeBSD dialect's) that xpf does not read yet.
const UNSUPPORTED_STATEMENTS: &[&str] = &[
    "load",
    "nat",
    "rdr",
    "binat",
    "no",
    "scrub",
    "altq",
    "nat-anchor",
    "rdr-anchor",
    "binat-anchor",
    "scrub-anchor",
    "dummynet-anchor",
    "ether",
];

/// Rule options pfctl knows that xpf does not implement yet.
const UNSUPPORTED_OPTIONS: &[&str] =
    &["os", "received-on", "once", "max-pkt-rate", "prio", "queue", "fragment", "no-df", "rdomain", "pflow", "delay"];

fn one_or_none<T: Clone>(v: &[T]) -> Vec<Option<T>> {
    if v.is_empty() {
        vec![None]
    } else {
        v.iter().cloned().map(Some).collect()
    }
}

/// pfctl's expand_rule: every combination of interface, protocol, source and destination
/// (and their ports, and ICMP types), each one a rule if its address families agree.
fn expand(t: &Template, nr: &mut u32) -> Result<Vec<Rule>, Vec<String>> {
    let mut out = Vec::new();
    let mut errs = Vec::new();
    let srcs = if t.src.is_empty() { vec![Host::ANY] } else { t.src.clone() };
    let dsts = if t.dst.is_empty() { vec![Host::ANY] } else { t.dst.clone() };
    // pfctl's order: interface, protocol, ICMP type, source, destination, source port,
    // destination port.
    for on in one_or_none(&t.ifs) {
        for proto in one_or_none(&t.protos) {
            for ic in one_or_none(&t.icmp) {
                for s in &srcs {
                    for d in &dsts {
                        for sp in one_or_none(&t.src_ports) {
                            for dp in one_or_none(&t.dst_ports) {
                                for uid in one_or_none(&t.users) {
                                    for gid in one_or_none(&t.groups) {
                                        let mut r = t.r.clone();
                                        r.on = on.clone();
                                        r.proto = proto;
                                        r.src = s.clone();
                                        r.src_port = sp;
                                        r.dst = d.clone();
                                        r.dst_port = dp;
                                        r.user = uid;
                                        r.group = gid;
                                        r.icmp = ic;
                                        // The family: the rule's, or what the addresses pin.
                                        let mut af = r.af;
                                        let mut ok = true;
                                        let route_af = r.route.as_ref().map_or(Af::Any, |x| x.1.host.af());
                                        let fixed_af = [r.af, s.af(), d.af()]
                                            .into_iter()
                                            .find(|a| *a != Af::Any)
                                            .unwrap_or(Af::Any);
                                        if r.route.is_some() {
                                            let mut ce: Vec<String> = Vec::new();
                                            if route_af != Af::Any && fixed_af != Af::Any && route_af != fixed_af {
                                                ce.push("af mismatch in routing spec".into());
                                            }
                                            if r.state == StateKind::No {
                                                ce.push("route-to, reply-to and dup-to require keep state".into());
                                            }
                                            if r.action == Action::Block {
                                                ce.push(
                                                    "route-to, reply-to and dup-to are not supported on block rules"
                                                        .into(),
                                                );
                                            }
                                            if !ce.is_empty() {
                                                errs.extend(ce);
                                                errs.push(SKIPPING.into());
                                                continue;
                                            }
                                        }
                                        let pool_af = [r.nat.as_ref(), r.rdr.as_ref(), r.route.as_ref().map(|x| &x.1)]
                                            .into_iter()
                                            .flatten()
                                            .filter(|p| p.list.is_none())
                                            .map(|p| p.host.af())
                                            .find(|a| *a != Af::Any)
                                            .unwrap_or(Af::Any);
                                        for a in [s.af(), d.af(), pool_af] {
                                            if a != Af::Any {
                                                if af == Af::Any {
                                                    af = a;
                                                } else if af != a {
                                                    ok = false;
                                                }
                                            }
                                        }
                                        if !ok {
                                            continue;
                                        }
                                        if (sp.is_some() || dp.is_some()) && !matches!(proto, Some(6) | Some(17)) {
                                            errs.push("port only applies to tcp/udp".to_string());
                                            errs.push(SKIPPING.into());
                                            continue;
                                        }
                                        if let Some(l) = [s, d].iter().find_map(|h| match h.kind {
                                            HostKind::Net(a, l) if a.is_ipv4() && l > 32 => Some(l),
                                            _ => None,
                                        }) {
                                            errs.push(format!("{BARE}netmask {l} invalid for IPv4 address"));
                                            errs.push(SKIPPING.into());
                                            continue;
                                        }
                                        match (af, proto) {
                                            (Af::Inet6, Some(1)) => {
                                                errs.push("proto icmp doesn't match address family inet6".into());
                                                errs.push(SKIPPING.into());
                                                continue;
                                            }
                                            (Af::Inet, Some(58)) => {
                                                errs.push("proto icmp6 doesn't match address family inet".into());
                                                errs.push(SKIPPING.into());
                                                continue;
                                            }
                                            _ => {}
                                        }
                                        if ic.is_some()
                                            && (t.r.icmp6 != (proto == Some(58))
                                                || (af == Af::Inet6) != t.r.icmp6 && af != Af::Any)
                                        {
                                            errs.push("icmp-type mismatch".into());
                                            errs.push(SKIPPING.into());
                                            continue;
                                        }
                                        r.af = af;
                                        // A dynamic address's mask wider than the family has is dropped.
                                        for h in [&mut r.src, &mut r.dst] {
                                            if let HostKind::Dynamic { prefix: pf @ Some(_), .. } = &mut h.kind {
                                                if af == Af::Inet && pf.is_some_and(|l| l > 32) {
                                                    *pf = None;
                                                }
                                            }
                                        }
                                        // Flags and sequence modulation are TCP's: pfctl drops them for
                                        // the other protocols of a list.
                                        if matches!(proto, Some(p) if p != 6) {
                                            r.flags = None;
                                            if matches!(r.state, StateKind::Modulate | StateKind::Synproxy) {
                                                r.state = StateKind::Keep;
                                            }
                                        }
                                        if r.flags.is_none()
                                            && r.anchor.is_none()
                                            && r.action != Action::Block
                                            && r.state != StateKind::No
                                            && matches!(proto, None | Some(6))
                                        {
                                            r.flags = Some(Flags::Set { bits: 0x02, mask: 0x12 });
                                        }
                                        if let Some(l) = &r.label {
                                            r.label = Some(label_macros(l, &r, *nr));
                                        }
                                        if let Some(l) = &r.tag {
                                            r.tag = Some(label_macros(l, &r, *nr));
                                        }
                                        if let Some((n, l)) = &r.tagged {
                                            r.tagged = Some((*n, label_macros(l, &r, *nr)));
                                        }
                                        // `rdr-to ... port a:*`: as wide as the destination range.
                                        if let (Some(p), Some(PortOp::Range(x, y))) = (r.rdr.as_mut(), dp) {
                                            if let Some((a, 0)) = p.port {
                                                p.port = Some((a, a.saturating_add(y.saturating_sub(x))));
                                            }
                                        }
                                        *nr += 1;
                                        out.push(r);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if out.is_empty() {
        errs.push("rule expands to no valid combination".into());
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(errs)
    }
}

fn label_macros(l: &str, r: &Rule, nr: u32) -> String {
    let mut s = l.to_string();
    let pairs = [
        ("$if", r.on.as_ref().map_or("any".to_string(), |i| i.name.clone())),
        ("$srcaddr", format!("{}{}", if r.src.neg { "! " } else { "" }, crate::print::host_label(&r.src))),
        ("$dstaddr", format!("{}{}", if r.dst.neg { "! " } else { "" }, crate::print::host_label(&r.dst))),
        ("$srcport", r.src_port.map_or(String::new(), crate::print::port_label)),
        ("$dstport", r.dst_port.map_or(String::new(), crate::print::port_label)),
        ("$proto", names::proto_name(r.proto.unwrap_or(0)).map_or(r.proto.unwrap_or(0).to_string(), str::to_string)),
        ("$nr", nr.to_string()),
    ];
    for (k, v) in pairs {
        s = s.replace(k, &v);
    }
    s
}
