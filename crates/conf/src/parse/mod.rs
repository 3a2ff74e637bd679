//! pf.conf's grammar (the OpenBSD 7.7 dialect), by recursive descent over one logical line at a
//! time. A rule line is parsed into a `Template` holding lists, then expanded into rules.
//!
//! This file drives it (lines, macros, errors, `include`); `host` reads addresses and
//! operands, `rule` filter rules and `antispoof`, `stmt` `set`, `table` and `queue`, and
//! `expand` turns a rule line into rules as pfctl does.

use crate::ast::*;
use crate::lex::{lex_line, logical_lines, recycle, Tok, Token};
use crate::names;
use std::collections::HashMap;
use std::net::IpAddr;

mod expand;
mod host;
mod rule;
mod stmt;
use expand::*;
use host::*;
use rule::*;
use stmt::*;

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
#[derive(Debug, Default, Clone)]
pub struct Parsed {
    pub rules: Vec<Rule>,
    /// FreeBSD-dialect translation rules (`nat`, `rdr`, `binat`), in their own ruleset as pf
    /// keeps them: evaluated before `rules`, numbered apart.
    pub xrules: Vec<Rule>,
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
    /// `set reassemble yes|no` (None: pf's default, yes).
    pub reassemble: Option<bool>,
    /// `set reassemble ... no-df`.
    pub reassemble_no_df: bool,
    /// `set state-policy if-bound` (pf's default is floating).
    pub if_bound: bool,
    /// `set loginterface`: the interface whose packets and bytes `-s info` counts (pf's
    /// "Interface Stats").
    pub loginterface: Option<String>,
    /// `set debug`: the level of xpfd's own messages from this load on.
    pub debug: Option<String>,
    /// `set state-defaults`: options every rule that keeps state takes (`pflow`, `no-sync`).
    pub state_defaults: StateOpts,
    /// `set hostid`: the creator id this firewall's states carry to its sync peer.
    pub hostid: Option<u32>,
    /// `set syncookies` (None: pf's default, never).
    pub syncookies: Option<xpf_engine::syncookie::Mode>,
    /// Every `set` statement as pfctl -nv prints it, with the file and line it came from.
    pub settings: Vec<(String, std::sync::Arc<str>, u32)>,
    /// `load anchor NAME from FILE`: the name, the file as written, and where it was said.
    pub loads: Vec<Load>,
    /// FreeBSD's normalization rules (`scrub ...`), each as the `match` rule that selects the
    /// same packets (printed back as a scrub rule by [`crate::print::scrub`]). They decide
    /// nothing: xpf normalizes every packet and reassembles every fragmented datagram, which
    /// is what such a rule asks for its packets (see [`scrub_statement`]).
    pub scrubs: Vec<Rule>,
}

impl Parsed {
    /// Every address the rules name: sources, destinations, translation and routing pools
    /// (with their lists), `af-to`'s; the filter rules' and the translation rules'.
    pub fn hosts(&self) -> impl Iterator<Item = &Host> {
        self.rules.iter().chain(&self.xrules).chain(&self.scrubs).flat_map(|r| {
            let pools = [r.nat.as_deref(), r.rdr.as_deref(), r.binat.as_deref(), r.route.as_deref().map(|x| &x.1)];
            let af_to = r.af_to.as_deref().map(|x| (&x.1, x.2.as_ref()));
            [&r.src, &r.dst]
                .into_iter()
                .chain(
                    pools.into_iter().flatten().flat_map(|p| std::iter::once(&p.host).chain(p.list.iter().flatten())),
                )
                .chain(af_to.into_iter().flat_map(|(a, b)| std::iter::once(a).chain(b)))
        })
    }

    /// Whether an address the rules name follows the interfaces' addresses (`self`, `(if)`):
    /// the ruleset is compiled again when they change.
    pub fn follows_addresses(&self) -> bool {
        self.hosts().any(|h| matches!(h.kind, HostKind::SelfAddr | HostKind::Dynamic { .. }))
    }

    /// Every interface name the ruleset uses where pf takes an interface or a group: `on`,
    /// `received-on`, `(if)` addresses, `set skip on`, `set loginterface`.
    pub fn interface_names(&self) -> impl Iterator<Item = &str> {
        let rules = self.rules.iter().chain(&self.xrules).chain(&self.scrubs);
        let ons = rules.flat_map(|r| r.on.iter().chain(r.received_on.as_deref()).map(|i| i.name.as_str()));
        let dynamic = self.hosts().filter_map(|h| match &h.kind {
            HostKind::Dynamic { ifname, .. } => Some(ifname.as_str()),
            _ => None,
        });
        ons.chain(dynamic).chain(self.skip.iter().map(String::as_str)).chain(self.loginterface.as_deref())
    }
}

/// A `load anchor` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    pub anchor: String,
    pub path: String,
    pub file: std::sync::Arc<str>,
    pub line: u32,
    /// Where a relative path is tried after the current directory (the file's own).
    pub dir: Option<std::path::PathBuf>,
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
    /// Where it was declared (0 for the tables pfctl makes for address lists).
    pub line: u32,
    pub file: std::sync::Arc<str>,
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
    /// The out half of a `binat-to` line: its target as written, checked per combination the
    /// way pfctl checks it; when the line fails, its in half is not expanded.
    binat: Option<Pool>,
}

impl Template {
    /// A rule with no lists yet (each list empty means "any").
    fn new(r: Rule) -> Template {
        Template {
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
            binat: None,
        }
    }
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
        self.peek_at(0)
    }
    /// The token `n` after the current one (lookahead).
    fn peek_at(&self, n: usize) -> &'a Tok {
        self.t.get(self.i + n).map_or(&Tok::Eof, |t| &t.tok)
    }
    /// The current token, stepping past it (borrowed: most callers only step).
    fn next(&mut self) -> &'a Tok {
        let t = self.peek_at(0);
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
            Tok::Word(w) | Tok::Str(w) => Ok(w.clone()),
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
    parse_at(src, file, defines, base, 0)
}

/// [`parse_in`] for a file `loads` levels of `load anchor` deep.
fn parse_at(src: &str, file: &str, defines: &[(String, String)], base: Option<&std::path::Path>, loads: u8) -> Parsed {
    let (pieces, helpers) = pieces_for(src.len());
    parse_split(src, file, defines, base, loads, (pieces, helpers, false)).0
}

/// A parse's start: the -D macros, and room for a rule a line of `text`, about (a large
/// ruleset's list grows once, not by copies of it: at 1.6M rules the doublings moved gigabytes
/// into fresh pages).
fn start(text: &str, defines: &[(String, String)]) -> (Parsed, ParseState) {
    let mut out = Parsed::default();
    out.macros.extend(defines.iter().cloned());
    out.rules.reserve(memchr::memchr_iter(b'\n', text.as_bytes()).count());
    (out, ParseState::new(defines))
}

/// [`parse_at`] in `pieces` pieces with `helpers` threads (in one go when fewer than two), and
/// how many pieces were taken as parsed ahead; `ahead_first` as for [`parse_pieces`].
fn parse_split(
    src: &str,
    file: &str,
    defines: &[(String, String)],
    base: Option<&std::path::Path>,
    loads: u8,
    (pieces, helpers, ahead_first): (usize, usize, bool),
) -> (Parsed, usize) {
    let (mut out, mut st) = start(src, defines);
    let starts = piece_starts(src, pieces);
    let stood = match starts.is_empty() {
        true => None,
        false => parse_pieces(src, file, defines, base, &starts, (helpers, ahead_first), &mut out, &mut st),
    };
    if stood.is_none() {
        (out, st) = start(src, defines);
        parse_source(src, file, base, &mut out, &mut st);
    } else {
        // The helpers' rules were moved into `out` and their buffers freed into their threads'
        // malloc arenas, which keep them (hundreds of MB at a million rules): given back here.
        // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the system
        // (16-23 ms after a parse of 1.6M rules).
        unsafe { libc::malloc_trim(0) };
    }
    check_queues(&mut out, file);
    load_anchors(&mut out, defines, loads);
    (out, stood.unwrap_or(0))
}

/// `load anchor NAME from FILE`: FILE's rules become the body of every anchor rule of the main
/// ruleset named NAME that has no body of its own, as if written inline after it (they are
/// evaluated there, and print there); pfctl reads such a file when it loads the main one, and
/// so does every load here (a reload reads it again). A load naming no such anchor is an
/// error: its rules would never be evaluated. Its tables join the main ruleset's (a name both
/// declare is an error: pf keeps an anchor's tables apart); options, queues and translation
/// rules in it are refused.
fn load_anchors(out: &mut Parsed, defines: &[(String, String)], depth: u8) {
    for ld in std::mem::take(&mut out.loads) {
        let err = |msg: String| ConfError { file: ld.file.to_string(), line: ld.line, msg, bare: false };
        // A file that loads itself (or a longer cycle) stops here, as includes do.
        if depth >= MAX_INCLUDE_DEPTH {
            out.errors.push(err(format!("load anchor \"{}\": nesting too deep at {}", ld.anchor, ld.path)));
            continue;
        }
        let mut tries = vec![std::path::PathBuf::from(&ld.path)];
        if let Some(d) = &ld.dir {
            tries.push(d.join(&ld.path));
        }
        let Some((found, text)) = tries.iter().find_map(|t| std::fs::read_to_string(t).ok().map(|s| (t.clone(), s)))
        else {
            out.errors.push(err(format!("load anchor \"{}\": cannot open {}", ld.anchor, ld.path)));
            continue;
        };
        let dir = found.parent().map(|d| d.to_path_buf());
        let sub = parse_at(&text, &ld.path, defines, dir.as_deref(), depth + 1);
        out.errors.extend(sub.errors);
        if !sub.settings.is_empty() || !sub.xrules.is_empty() || !sub.queues.is_empty() {
            out.errors.push(err(format!(
                "load anchor \"{}\": {} holds options, queues or translation rules; xpf loads only filter rules and tables into an anchor",
                ld.anchor, ld.path
            )));
            continue;
        }
        // pf keeps an anchor's tables apart; xpf has one namespace, so a name the main
        // ruleset (or another anchor) already declares is an error, not a silent merge.
        if let Some(t) = sub.tables.iter().find(|t| out.tables.iter().any(|o| o.name == t.name)) {
            out.errors.push(err(format!(
                "load anchor \"{}\": table <{}> is declared in the main ruleset too; xpf keeps one table namespace",
                ld.anchor, t.name
            )));
            continue;
        }
        out.tables.extend(sub.tables);
        let at: Vec<usize> = (0..out.rules.len())
            .filter(|&i| out.rules[i].anchor.as_deref() == Some(ld.anchor.as_str()) && !out.rules[i].opens)
            .collect();
        if at.is_empty() {
            out.errors.push(err(format!("load anchor \"{}\": no anchor rule without a body names it", ld.anchor)));
            continue;
        }
        // From the last, so that the places before stay where they are.
        for &i in at.iter().rev() {
            let depth = out.rules[i].depth + 1;
            out.rules[i].opens = true;
            let body = sub.rules.iter().cloned().map(|mut r| {
                r.depth += depth;
                r
            });
            out.rules.splice(i + 1..i + 1, body);
        }
    }
}

/// What parsing carries across included files.
struct ParseState {
    /// Macros given with -D, which the file does not redefine.
    fixed: Vec<String>,
    /// Rules so far (`$nr`).
    nr: u32,
    /// The same for translation rules.
    xnr: u32,
    /// Inline anchor depth.
    depth: u8,
    /// Include nesting, bounded.
    includes: u8,
}

impl ParseState {
    fn new(defines: &[(String, String)]) -> ParseState {
        ParseState { fixed: defines.iter().map(|d| d.0.clone()).collect(), nr: 0, xnr: 0, depth: 0, includes: 0 }
    }
}

const MAX_INCLUDE_DEPTH: u8 = 16;

/// Where a parse of one source stands between its logical lines: what a line leaves for the
/// next.
struct Walk<'f> {
    file: &'f str,
    /// The file's name, shared by its rules.
    f: std::sync::Arc<str>,
    base: Option<&'f std::path::Path>,
    fixed: Vec<String>,
    /// One buffer for every line's tokens. A `{ }` list may run over several lines (pfctl's
    /// grammar allows newlines in it): with `pending`, a line's tokens stay in it for the
    /// lines that close the list.
    toks: Vec<Token>,
    /// The words' buffers of lines done, for the next lines' words.
    spare: Vec<String>,
    pending: bool,
    depth: u8,
    nr: u32,
    /// Set when this walk is a piece of a large file parsed ahead of the lines before it.
    piece: Option<Piece>,
}

/// What a piece parsed ahead met that it cannot stand for without the lines before it.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// A statement other than a filter rule or an anchor's closing `}` (a macro, an option,
    /// a table, an include, a translation rule): the piece stops there and is parsed in order.
    foreign: bool,
    /// It holds `block` rules, whose return policy is `set block-policy`'s.
    blocks: bool,
    /// The lowest anchor depth its `}` lines closed down to (it starts at [`PIECE_DEPTH`]).
    lowest: u8,
    /// The deepest its inline anchors opened to.
    highest: u8,
}

/// How deep inline anchors nest: pf's anchor stack (PF_ANCHOR_STACK_MAX) holds 64 levels, and
/// pf skips an anchor rule past it at every packet; xpf refuses it at load.
const MAX_ANCHOR_DEPTH: u8 = 64;

impl<'f> Walk<'f> {
    fn new(file: &'f str, base: Option<&'f std::path::Path>, st: &ParseState) -> Walk<'f> {
        Walk {
            file,
            f: file.into(),
            base,
            fixed: st.fixed.clone(),
            toks: Vec::with_capacity(64),
            spare: Vec::with_capacity(64),
            pending: false,
            depth: st.depth,
            nr: st.nr,
            piece: None,
        }
    }

    /// Parses one logical line (its physical pieces numbered from `off` + 1). False when a
    /// piece parsed ahead met a statement it cannot stand for.
    fn line(
        &mut self,
        pieces: &[(u32, std::borrow::Cow<str>)],
        off: u32,
        out: &mut Parsed,
        st: &mut ParseState,
    ) -> bool {
        let Walk { file, f, base, fixed, toks, spare, pending, depth, nr, piece } = self;
        let (file, base) = (*file, *base);

        if !std::mem::take(pending) {
            recycle(toks, spare);
        }
        let last_line = pieces.last().map_or(0, |p| p.0) + off;
        for (line, text) in pieces {
            match lex_line(text, *line + off, &out.macros, toks, spare) {
                Ok(false) => {}
                Ok(true) => break, // a comment runs to the end of the logical line
                Err(e) => {
                    out.errors.extend(to_errors(file, e.line, &e.msg));
                    return true;
                }
            }
        }
        if toks.is_empty() {
            return true;
        }
        let open = toks.iter().filter(|t| t.tok == Tok::Punct("{")).count();
        let close = toks.iter().filter(|t| t.tok == Tok::Punct("}")).count();
        let anchor_body = matches!(toks.first().map(|t| &t.tok), Some(Tok::Word(w)) if w == "anchor")
            && toks.last().map(|t| &t.tok) == Some(&Tok::Punct("{"))
            && open == close + 1;
        if open > close && !anchor_body {
            *pending = true;
            return true;
        }
        // `}` closes an inline anchor.
        if matches!(toks.first().map(|t| &t.tok), Some(Tok::Punct("}"))) {
            if *depth == 0 || toks.len() > 1 {
                out.errors.push(ConfError {
                    file: file.into(),
                    line: toks[0].line,
                    msg: "syntax error".into(),
                    bare: false,
                });
            } else {
                *depth -= 1;
                if let Some(pc) = piece.as_mut() {
                    pc.lowest = pc.lowest.min(*depth);
                }
            }
            return true;
        }
        let mut p = P { t: toks.as_slice(), i: 0, scope: None };
        // A piece parsed ahead stands for filter rules only (see [`parse_pieces`]).
        if let Some(pc) = piece.as_mut() {
            let defines = matches!(toks.get(1).map(|t| &t.tok), Some(Tok::Punct("=")));
            match p.word() {
                Some("pass" | "match" | "anchor" | "antispoof") if !defines => {}
                Some("block") if !defines => pc.blocks = true,
                _ => {
                    pc.foreign = true;
                    return false;
                }
            }
        }
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
            return true;
        }
        let res = match p.word() {
            Some("pass") | Some("block") | Some("match") | Some("anchor") => rule(&mut p, last_line, out.block_return),
            Some("antispoof") => antispoof(&mut p, last_line),
            Some("scrub") => scrub_statement(&mut p, last_line, file, out).map(|()| Vec::new()),
            Some("no") if matches!(p.peek_at(1), Tok::Word(w) if w == "scrub") => Err(unsupported("no scrub")),
            Some("nat" | "rdr" | "binat" | "no" | "nat-anchor" | "rdr-anchor" | "binat-anchor") => {
                xrule(&mut p, last_line)
            }
            Some("include") => {
                p.next();
                st.nr = *nr;
                st.depth = *depth;
                let r = include(&mut p, file, base, out, st).map(|()| Vec::new());
                *nr = st.nr;
                r
            }
            Some("set") => {
                p.next();
                let before = out.header.len();
                match set_option(&mut p, out) {
                    Ok(()) => {
                        let f: std::sync::Arc<str> = file.into();
                        for h in &out.header[before..] {
                            out.settings.push((h.trim_end().to_string(), f.clone(), last_line));
                        }
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e),
                }
            }
            Some("queue") => {
                p.next();
                match queue(&mut p, last_line) {
                    Ok(mut q) => {
                        q.file = file.into();
                        out.queues.push(q);
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e),
                }
            }
            Some("load") => {
                p.next();
                match load(&mut p) {
                    Ok((anchor, path)) => {
                        // As `include`: the file's own directory, else the base one.
                        let own = std::path::Path::new(file).parent().filter(|d| !d.as_os_str().is_empty());
                        let dir = own.or(base).map(|d| d.to_path_buf());
                        out.loads.push(Load { anchor, path, file: file.into(), line: last_line, dir });
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e),
                }
            }
            Some("table") => {
                p.next();
                match table(&mut p) {
                    Ok(mut t) => {
                        t.line = last_line;
                        t.file = file.into();
                        out.header.push(crate::print::table(&t));
                        out.tables.push(t);
                        Ok(Vec::new())
                    }
                    Err(e) => Err(e),
                }
            }
            Some("altq") => Err(stmt::altq("altq on")),
            Some(w) if UNSUPPORTED_STATEMENTS.contains(&w) => Err(unsupported(w)),
            _ => Err("syntax error".into()),
        };
        match res {
            Ok(tmpls) => {
                for t in tmpls {
                    let binat = t.binat.is_some();
                    let xlate = t.r.xlate.is_some();
                    let counter = if xlate { &mut st.xnr } else { &mut *nr };
                    match expand(&t, counter, out) {
                        Ok(mut rules) => {
                            // A combination whose translation pool has no address of its family
                            // is left out, as pfctl leaves it; if none is left, the rule fails.
                            let mut bad = None;
                            rules.retain_mut(|r| match resolve_pools(r, out) {
                                Ok(()) => true,
                                Err(e) => {
                                    bad = Some(e);
                                    false
                                }
                            });
                            match bad.filter(|_| rules.is_empty()) {
                                Some(e) => out.errors.extend(to_errors(file, last_line, &e)),
                                None => {
                                    for mut r in rules {
                                        r.file = f.clone();
                                        if xlate {
                                            out.xrules.push(r);
                                            continue;
                                        }
                                        r.depth = *depth;
                                        let opens = r.opens;
                                        out.rules.push(r);
                                        if opens {
                                            if let Some(pc) = piece.as_mut() {
                                                pc.highest = pc.highest.max(*depth + 1);
                                                if (*depth + 1).saturating_sub(PIECE_DEPTH) > MAX_ANCHOR_DEPTH {
                                                    pc.foreign = true;
                                                    return false;
                                                }
                                            } else if *depth == MAX_ANCHOR_DEPTH {
                                                out.errors.extend(to_errors(
                                                    file,
                                                    last_line,
                                                    &format!("anchor nesting deeper than {MAX_ANCHOR_DEPTH}: pf evaluates anchors {MAX_ANCHOR_DEPTH} deep (its anchor stack) and skips deeper ones"),
                                                ));
                                            }
                                            *depth = depth.saturating_add(1);
                                        }
                                    }
                                }
                            }
                        }
                        Err(msgs) => {
                            for m in msgs {
                                out.errors.extend(to_errors(file, last_line, &m));
                            }
                            if binat {
                                break;
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
        true
    }

    /// The end of the source (`lines` of them): a list or an inline anchor left open is an
    /// error.
    fn finish(self, lines: u32, out: &mut Parsed, st: &mut ParseState) {
        if let Some(t) = self.toks.first().filter(|_| self.pending) {
            out.errors.push(ConfError {
                file: self.file.into(),
                line: t.line,
                msg: "syntax error".into(),
                bare: false,
            });
        }
        if self.depth > st.depth {
            out.errors.push(ConfError { file: self.file.into(), line: lines, msg: "syntax error".into(), bare: false });
        }
        st.nr = self.nr;
    }
}

/// A file of this many bytes or more is parsed in pieces of [`PIECE_BYTES`], by this thread
/// from the front and by helpers on the other cores (at most [`MAX_HELPERS`]) from the back: a
/// generated ruleset of a million rules is tens of megabytes of rule lines, and parsing them
/// is most of a reload's time.
const PIECES_FROM: usize = 8 << 20;
const PIECE_BYTES: usize = 1 << 20;
const MAX_HELPERS: usize = 7;

/// The anchor depth a piece parsed ahead starts at: the depth of the lines before it is not
/// known yet, and its `}` lines may close their anchors.
const PIECE_DEPTH: u8 = 128;

/// The most helpers a parse may have (see [`set_helpers`]).
static HELPERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(MAX_HELPERS);

/// At most `n` threads help a large file's parse from now on (the cores other than the
/// parsing thread's, at most [`MAX_HELPERS`], unless told fewer). xpfd leaves its workers'
/// cores to them: beside a busy worker a helper only slows the parse (a reload of 1.6M rules
/// under iperf3 parsed in 9.7-11.1 s with one, 5.8-6.7 s without).
pub fn set_helpers(n: usize) {
    HELPERS.store(n.min(MAX_HELPERS), std::sync::atomic::Ordering::Relaxed);
}

/// How many pieces a source of `len` bytes is parsed in, and by how many helpers: one piece
/// and none for a small file, one core, or no helper allowed.
fn pieces_for(len: usize) -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let helpers = (cores - 1).min(HELPERS.load(std::sync::atomic::Ordering::Relaxed));
    if len < PIECES_FROM || helpers == 0 {
        return (1, 0);
    }
    (len / PIECE_BYTES, helpers)
}

/// Where pieces 2 to `n` of `src` begin, (byte offset, line number), each at the start of a
/// line whose line before does not continue into it.
fn piece_starts(src: &str, n: usize) -> Vec<(usize, u32)> {
    let b = src.as_bytes();
    let (mut starts, mut at, mut line) = (Vec::new(), 0, 1u32);
    for k in 1..n {
        let mut from = (k * src.len() / n).max(at);
        // The next line that the one before does not continue (`\` before its newline).
        let start = loop {
            let Some(nl) = memchr::memchr(b'\n', &b[from..]).map(|i| from + i) else { break None };
            let text = b[..nl].strip_suffix(b"\r").unwrap_or(&b[..nl]);
            if !text.ends_with(b"\\") {
                break Some(nl + 1);
            }
            from = nl + 1;
        };
        let Some(start) = start.filter(|&s| s < src.len()) else { break };
        line += memchr::memchr_iter(b'\n', &b[at..start]).count() as u32;
        starts.push((start, line));
        at = start;
    }
    starts
}

/// A piece of the file parsed on a core of its own, ahead of the lines before it.
struct Ahead {
    out: Parsed,
    piece: Piece,
    depth: u8,
    nr: u32,
    pending: bool,
    /// Its text ended inside a logical line.
    cut: bool,
    /// The `set block-policy` it took for its `block` rules.
    block_return: bool,
}

impl Ahead {
    /// Parses `text`, lines numbered from `line`, as if the lines before it were filter rules
    /// only (the -D macros the only ones; it stops at a `$`); either of `stop` asks it to give
    /// up.
    fn parse(
        text: &str,
        line: u32,
        file: &str,
        defines: &[(String, String)],
        block_return: bool,
        stop: [&std::sync::atomic::AtomicBool; 2],
    ) -> Ahead {
        let (mut out, mut st) = start(text, defines);
        (out.block_return, st.depth) = (block_return, PIECE_DEPTH);
        let mut w = Walk::new(file, None, &st);
        let mut piece = Piece { foreign: false, blocks: false, lowest: PIECE_DEPTH, highest: PIECE_DEPTH };
        // A macro's value, or a label's `$nr`, is what the lines before make it.
        if memchr::memchr(b'$', text.as_bytes()).is_some() {
            piece.foreign = true;
        }
        w.piece = Some(piece);
        let mut lines = logical_lines(text);
        if !piece.foreign {
            for pieces in &mut lines {
                if stop.iter().any(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
                    // Given up: it stands for nothing.
                    if let Some(p) = w.piece.as_mut() {
                        p.foreign = true;
                    }
                    break;
                }
                if !w.line(&pieces, line - 1, &mut out, &mut st) {
                    break;
                }
            }
        }
        let piece = w.piece.unwrap_or(piece);
        Ahead { piece, depth: w.depth, nr: w.nr, pending: w.pending, cut: lines.cut(), block_return, out }
    }

    /// Whether its rules are what parsing it after `w`'s lines gives: it met only filter rules,
    /// it ended where a logical line ends, its `block` rules took the policy in force, it closed
    /// no anchor the lines before did not open nor nested one past pf's stack, and it made no
    /// table (a translation pool's
    /// table is printed in the header).
    fn stands(&self, w: &Walk, block_return: bool, last: bool) -> bool {
        !self.piece.foreign
            && !w.pending
            && (!self.cut || last)
            && !self.pending
            && (!self.piece.blocks || self.block_return == block_return)
            && w.depth < PIECE_DEPTH
            && PIECE_DEPTH - self.piece.lowest <= w.depth
            && u16::from(self.piece.highest - PIECE_DEPTH) + u16::from(w.depth) <= u16::from(MAX_ANCHOR_DEPTH)
            && self.out.header.is_empty()
    }
}

/// Where `set block-policy` statements stand in `src` (commented ones left out) and whether
/// each says `return`: a piece's `block` rules are parsed ahead with the last one before it (a
/// guess, checked against the parse: a string may hold the words).
fn block_policies(src: &str) -> Vec<(usize, bool)> {
    let b = src.as_bytes();
    memchr::memmem::find_iter(b, b"block-policy")
        .filter(|&i| {
            let line = memchr::memrchr(b'\n', &b[..i]).map_or(0, |n| n + 1);
            memchr::memchr(b'#', &b[line..i]).is_none()
        })
        .map(|i| (i, src[i + "block-policy".len()..].trim_start().starts_with("return")))
        .collect()
}

/// The policy the last of `policies` before byte `at` sets (pf's default, drop, if none).
fn block_policy_at(policies: &[(usize, bool)], at: usize) -> bool {
    match policies.partition_point(|p| p.0 < at) {
        0 => false,
        i => policies[i - 1].1,
    }
}

/// Parses `src` in pieces: this thread walks them in order from the front, `helpers` threads
/// parse them ahead from the back, as if the lines before each were filter rules only, until
/// the two meet. A piece parsed ahead is taken as it is when that holds (renumbered and put at
/// the depth of the anchors open before it), else parsed here again after the lines before
/// it; a piece a helper is still parsing when this thread comes to it is given up and parsed
/// here (a helper starved of its core never holds this thread). Returns how many pieces
/// were taken as parsed ahead; None when a piece's start was not a logical line's (a quoted
/// string ran over it): the caller parses the file in one go.
#[allow(clippy::too_many_arguments)]
fn parse_pieces(
    src: &str,
    file: &str,
    defines: &[(String, String)],
    base: Option<&std::path::Path>,
    starts: &[(usize, u32)],
    (helpers, ahead_first): (usize, bool),
    out: &mut Parsed,
    st: &mut ParseState,
) -> Option<usize> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let n = starts.len();
    let ends: Vec<usize> = starts.iter().skip(1).map(|s| s.0).chain([src.len()]).collect();
    // Each piece is parsed by whoever claims it first: this thread ascending, helpers
    // descending from `back`.
    let claimed: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    // A piece this thread reached before its helper was done with it: given up, parsed here.
    let abandoned: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
    let back = AtomicUsize::new(n);
    let stop = AtomicBool::new(false);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Ahead)>();
    let policies = block_policies(src);
    std::thread::scope(|s| {
        for _ in 0..helpers {
            let (tx, claimed, abandoned, back, stop, ends, policies) =
                (tx.clone(), &claimed, &abandoned, &back, &stop, &ends, &policies);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(k) = back.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| b.checked_sub(1)) else {
                        break;
                    };
                    let k = k - 1;
                    if claimed[k].swap(true, Ordering::AcqRel) {
                        break; // this thread is there: the pieces before are its own
                    }
                    let (from, line) = starts[k];
                    let block_return = block_policy_at(policies, from);
                    let a = Ahead::parse(&src[from..ends[k]], line, file, defines, block_return, [stop, &abandoned[k]]);
                    if tx.send((k, a)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        // Tests: every piece parsed ahead before this thread starts, so that which stand is
        // not a matter of timing.
        let mut ahead: Vec<Option<Ahead>> = (0..n).map(|_| None).collect();
        if ahead_first {
            while let Ok((j, a)) = rx.recv() {
                ahead[j] = Some(a);
            }
        }
        let give_up = || {
            stop.store(true, Ordering::Relaxed);
            None
        };
        let mut w = Walk::new(file, base, st);
        let mut lines = logical_lines(&src[..starts[0].0]);
        for pieces in &mut lines {
            w.line(&pieces, 0, out, st);
        }
        if lines.cut() {
            return give_up();
        }
        // The rules of pieces taken, moved into `out` together (on two cores).
        let mut held: Vec<Vec<Rule>> = Vec::new();
        let mut stood = 0;
        for k in 0..n {
            let last = k + 1 == n;
            if claimed[k].swap(true, Ordering::AcqRel) {
                // A helper's: taken when it is done, else given up and parsed here, so that a
                // helper starved of its core (a busy worker's) never holds this thread.
                while let Ok((j, a)) = rx.try_recv() {
                    ahead[j] = Some(a);
                }
                if ahead[k].is_none() {
                    abandoned[k].store(true, Ordering::Relaxed);
                }
            }
            if let Some(a) = ahead[k].take() {
                if a.stands(&w, out.block_return, last) {
                    let d = w.depth;
                    let shift = |x: u8| x - (PIECE_DEPTH - d);
                    let mut rules = a.out.rules;
                    for r in &mut rules {
                        r.depth = shift(r.depth);
                    }
                    held.push(rules);
                    out.errors.extend(a.out.errors);
                    w.depth = shift(a.depth);
                    w.nr += a.nr;
                    stood += 1;
                    continue;
                }
            }
            move_rules(&mut out.rules, std::mem::take(&mut held));
            let (from, line) = starts[k];
            let mut lines = logical_lines(&src[from..ends[k]]);
            for pieces in &mut lines {
                w.line(&pieces, line - 1, out, st);
            }
            if lines.cut() && !last {
                return give_up();
            }
        }
        move_rules(&mut out.rules, held);
        w.finish(src.lines().count() as u32, out, st);
        Some(stood)
    })
}

/// Moves the rules of `from`, in order, to the end of `to`, on two cores when they are many:
/// what the move costs is the first touch of `to`'s pages (on this VM 0.2-0.4 s for the 400
/// MB of 800,000 rules), which two cores take at once.
fn move_rules(to: &mut Vec<Rule>, mut from: Vec<Vec<Rule>>) {
    let total: usize = from.iter().map(Vec::len).sum();
    if total == 0 {
        return;
    }
    to.reserve(total);
    let len = to.len();
    // Two groups of whole vectors, the first about half the rules.
    let (mut cut, mut first) = (0, 0);
    while cut < from.len() && first + from[cut].len() <= total / 2 {
        first += from[cut].len();
        cut += 1;
    }
    {
        let (d0, d1) = to.spare_capacity_mut()[..total].split_at_mut(first);
        let (g0, g1) = from.split_at(cut);
        let mov = |g: &[Vec<Rule>], d: &mut [std::mem::MaybeUninit<Rule>]| {
            let mut at = 0;
            for v in g {
                let d = &mut d[at..at + v.len()];
                // SAFETY: `d` is v.len() slots of `to`'s spare room, apart from the other
                // group's; the rules are moved bitwise, and `from`'s vectors forget them below
                // without dropping them.
                unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), d.as_mut_ptr().cast::<Rule>(), v.len()) };
                at += v.len();
            }
        };
        if total < 4096 {
            mov(g0, d0);
            mov(g1, d1);
        } else {
            std::thread::scope(|sc| {
                sc.spawn(|| mov(g1, d1));
                mov(g0, d0);
            });
        }
    }
    // SAFETY: every rule of `from` now lives in `to` (the `total` slots after its length were
    // written above); `from`'s vectors keep their buffers, freed without the rules' drops.
    unsafe {
        for v in &mut from {
            v.set_len(0);
        }
        to.set_len(len + total);
    }
}

/// [`parse_in`] in `n` pieces with `helpers` threads whatever the size of `src` (tests hold it
/// to the parse in one go), and how many pieces after the first were taken as parsed ahead;
/// with `ahead_first`, every piece after the first is parsed ahead before the first is.
#[doc(hidden)]
pub fn parse_in_pieces(
    src: &str,
    file: &str,
    defines: &[(String, String)],
    base: Option<&std::path::Path>,
    n: usize,
    helpers: usize,
    ahead_first: bool,
) -> (Parsed, usize) {
    parse_split(src, file, defines, base, 0, (n, helpers, ahead_first))
}

fn parse_source(src: &str, file: &str, base: Option<&std::path::Path>, out: &mut Parsed, st: &mut ParseState) {
    let mut w = Walk::new(file, base, st);
    for pieces in logical_lines(src) {
        w.line(&pieces, 0, out, st);
    }
    w.finish(src.lines().count() as u32, out, st);
}

const FLAG_CHARS: &str = "FSRPAUEW";

fn scrub_opts(p: &mut P) -> R<Scrub> {
    let mut sc = Scrub::default();
    p.expect_punct("(")?;
    while !p.eat_punct(")") {
        if !scrub_opt(p, &mut sc)? {
            if p.string()? != "reassemble" || !p.eat("tcp") {
                return Err("syntax error".into());
            }
            sc.reassemble_tcp = true;
        }
        p.eat_punct(",");
    }
    Ok(sc)
}

/// One of the scrub options that act on each packet (`no-df`, `random-id`, `min-ttl N`,
/// `max-mss N`, `set-tos T`) at `p`, taken into `sc` as pfctl's scrub_opt takes it; false
/// (nothing taken) when `p` is at another word.
fn scrub_opt(p: &mut P, sc: &mut Scrub) -> R<bool> {
    const OPTS: [&str; 5] = ["no-df", "random-id", "min-ttl", "max-mss", "set-tos"];
    let Some(w) = p.word().and_then(|w| OPTS.into_iter().find(|&o| o == w)) else { return Ok(false) };
    p.i += 1;
    let again = || Err(format!("{w} cannot be respecified"));
    // `min-ttl N`, `max-mss N`: a number of the option's width, once.
    fn number<T: TryFrom<u64>>(p: &mut P, w: &str, slot: &mut Option<T>) -> R<()> {
        if slot.is_some() {
            return Err(format!("{w} cannot be respecified"));
        }
        let v: u64 = p.string()?.parse().map_err(|_| "syntax error".to_string())?;
        *slot = Some(T::try_from(v).map_err(|_| format!("illegal {w} value {v}"))?);
        Ok(())
    }
    match w {
        "no-df" if std::mem::replace(&mut sc.no_df, true) => return again(),
        "random-id" if std::mem::replace(&mut sc.random_id, true) => return again(),
        "min-ttl" => number(p, w, &mut sc.min_ttl)?,
        "max-mss" => number(p, w, &mut sc.max_mss)?,
        "set-tos" => {
            let s = p.string()?;
            let v = if let Some(h) = s.strip_prefix("0x") { u8::from_str_radix(h, 16) } else { s.parse() };
            sc.set_tos = Some(v.map_err(|_| format!("illegal tos value {s}"))?);
        }
        _ => {}
    }
    Ok(true)
}

const SKIPPING: &str = "skipping rule due to errors";

/// `anchor NAME from FILE` after `load`.
fn load(p: &mut P) -> R<(String, String)> {
    if !p.eat("anchor") {
        return Err("syntax error".into());
    }
    let name = p.string()?;
    if !p.eat("from") {
        return Err("syntax error".into());
    }
    let path = p.string()?;
    if !p.done() {
        return Err("syntax error".into());
    }
    Ok((name, path))
}

/// FreeBSD's normalization rule, `scrub [in|out] [on IF] [af] [proto] HOSTS [options]`
/// (pfSense and OPNsense write one per interface). xpf normalizes every packet and
/// reassembles every fragmented datagram (OpenBSD's way: `set reassemble yes`, its default),
/// which is what a scrub rule asks for the packets it selects with `fragment reassemble`, its
/// default option: such a rule is taken, checked as the `match` rule selecting the same
/// packets is, and printed as pfctl prints it. The options that act on each packet (`no-df`,
/// `random-id`, `min-ttl`, `max-mss`, `set-tos`) are the rule's `scrub (...)`: the compiled
/// ruleset gives every packet the first matching scrub rule's ([`crate::Ruleset`]'s
/// `packet_scrub`). `reassemble tcp` and the other fragment modes (`crop`, `drop-ovl`) are
/// refused by name, as is `no scrub` (which asks for packets to be left alone) and a scrub
/// rule with `set reassemble no`.
fn scrub_statement(p: &mut P, line: u32, file: &str, out: &mut Parsed) -> R<()> {
    let mut t: Vec<Token> = Vec::with_capacity(p.t.len());
    t.push(Token { tok: Tok::Word("match".into()), line: p.t[p.i].line });
    p.i += 1;
    let mut sc = Scrub::default();
    while p.i < p.t.len() {
        // The options that act on each packet, as a match rule's `scrub (...)` takes them.
        if scrub_opt(p, &mut sc)? {
            continue;
        }
        if p.eat("fragment") {
            match p.word() {
                Some("reassemble") => {
                    p.i += 1;
                    continue;
                }
                Some(m @ ("crop" | "drop-ovl")) => {
                    return Err(format!("xpf does not support 'fragment {m}' on a scrub rule yet"))
                }
                _ => return Err("syntax error".into()),
            }
        }
        match p.word() {
            Some("reassemble") => return Err("xpf does not support 'reassemble tcp' yet".into()),
            _ => t.push(p.t[p.i].clone()),
        }
        p.i += 1;
    }
    if out.reassemble == Some(false) {
        return Err("a scrub rule asks for reassembly, which `set reassemble no` turns off".into());
    }
    let mut p = P { t: &t, i: 0, scope: None };
    let tmpls = rule(&mut p, line, false)?;
    let f: std::sync::Arc<str> = file.into();
    let scrub = (sc != Scrub::default()).then_some(sc);
    for mut tm in tmpls {
        tm.r.scrub = scrub.clone();
        let mut nr = 0;
        let rules = expand(&tm, &mut nr, out).map_err(|m| m.join("\n"))?;
        for mut r in rules {
            r.file = f.clone();
            // FreeBSD's grammar gives a scrub rule its direction, interface, family, protocol
            // and addresses; anything else the match rule's parser took would go unenforced.
            let plain = Rule {
                dir: r.dir,
                on: r.on.clone(),
                af: r.af,
                proto: r.proto,
                src: r.src.clone(),
                src_port: r.src_port,
                dst: r.dst.clone(),
                dst_port: r.dst_port,
                file: r.file.clone(),
                scrub: scrub.clone(),
                ..rule_shell(Action::Match, r.line)
            };
            if r != plain {
                let named = [
                    (r.log.is_some(), "log"),
                    (r.quick, "quick"),
                    (r.label.is_some(), "label"),
                    (r.tag.is_some(), "tag"),
                ];
                return Err(match named.iter().find(|(set, _)| *set) {
                    Some((_, o)) => format!("xpf does not support '{o}' on a scrub rule yet"),
                    None => "xpf takes a scrub rule's interface, direction, family, protocol and addresses, and no other option yet".into(),
                });
            }
            out.header.push(crate::print::scrub(&r));
            out.scrubs.push(r);
        }
    }
    Ok(())
}

/// A pf.conf construct that pfctl accepts and xpf does not implement yet: said as such, so
/// that nobody mistakes it for a mistake in the file.
fn unsupported(what: &str) -> String {
    format!("xpf does not support '{what}' yet")
}

/// Statements of pf.conf (OpenBSD's and the older FreeBSD dialect's) that xpf does not read yet.
const UNSUPPORTED_STATEMENTS: &[&str] = &["scrub-anchor", "dummynet-anchor", "ether"];

/// Rule options pfctl knows that xpf does not implement yet.
const UNSUPPORTED_OPTIONS: &[&str] = &["os", "prio", "no-df", "rdomain", "pflow", "delay"];
