//! Rulesets at campus scale, as a generator from a member database writes them, and a
//! ClassBench-style random set; the campus policy also in nftables, twice (an expert's sets
//! and concatenations, and rule by rule), for the kernel's side of the comparison.
//!
//! The campus: members on public addresses (44.0.0.0/11, 250 to a /24), the outside on em0,
//! the campus on em1. Per /24 two anchors (pf's answer to per-network chains): inbound
//! services per member (`quick` passes, some `quick` blocks of a network, non-quick passes
//! that later global rules may override) and outbound blocks (SMTP, trackers). A few hundred
//! global rules before the anchors (bogons, a blocklist, bad ports, infrastructure
//! services, match rules with a scrub and a tag) and after them (per-department admin
//! access, blocked UDP ports, ICMP echo, outbound by tag). Every rule is a [`Rule`] of one
//! model, which prints as pf.conf and as nftables and evaluates as nftables does (first
//! match over the flat list), so a test holds the printed forms to one meaning.

use std::fmt::Write;

/// An address test of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum A {
    Any,
    Net(u32, u8),
    Table(&'static str),
}

/// A port test: exact, or any.
pub type P = Option<u16>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub pass: bool,
    pub quick: bool,
    /// true: `in on em0`, false: `out on em0`.
    pub inbound: bool,
    /// 6, 17, 1 or 0 (any).
    pub proto: u8,
    pub src: A,
    pub dst: A,
    pub dport: P,
    /// The anchor it is in: (inbound, /24 network); None: the main ruleset.
    pub anchor: Option<(bool, u32)>,
    /// Printed in pf as `tagged CAMPUS` (the tag of the match rule on the same source).
    pub tagged: bool,
    /// ICMP echo request only.
    pub echo: bool,
}

impl Rule {
    fn new(pass: bool, quick: bool, inbound: bool, proto: u8, src: A, dst: A, dport: P) -> Rule {
        Rule { pass, quick, inbound, proto, src, dst, dport, anchor: None, tagged: false, echo: false }
    }
}

/// A generated policy: pf.conf text, the nftables forms, the model and its tables.
pub struct Policy {
    pub pf: String,
    pub nft_expert: String,
    pub nft_naive: String,
    pub rules: Vec<Rule>,
    pub tables: Vec<(&'static str, Vec<(u32, u8)>)>,
    /// Rules pf compiles the text to (anchor rules and the em1 and match rules included).
    pub compiled: usize,
    pub members: usize,
}

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.bits() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub fn ip(a: u32) -> String {
    let b = a.to_be_bytes();
    format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3])
}

fn net(a: u32, l: u8) -> String {
    if l == 32 {
        ip(a)
    } else {
        format!("{}/{l}", ip(a))
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}

/// The campus's public range and its members' first address.
pub const CAMPUS: (u32, u8) = (v4(44, 0, 0, 0), 10);
const INFRA: u32 = v4(44, 63, 255, 0);
pub const SERVICES: [u16; 5] = [22, 80, 443, 3389, 8080];
const BAD_TCP: [u16; 12] = [23, 111, 135, 137, 138, 139, 445, 513, 514, 1433, 2049, 6000];
const BAD_UDP: [u16; 8] = [69, 111, 137, 138, 161, 1434, 1900, 5353];

/// Member `k`'s public address: 250 to a /24, from 44.0.0.2.
pub fn member(k: usize) -> u32 {
    CAMPUS.0 + (k as u32 / 250) * 256 + (k as u32 % 250) + 2
}

pub fn members_for(n: usize) -> usize {
    // About 3.27 compiled rules per member with its share of anchor rules; globals ~ 420
    // (fewer below 5,000 rules).
    let globals = 420 * n.min(5_000) / 5_000;
    (n.saturating_sub(globals) * 100 / 327).max(1)
}

/// The campus ruleset of about `n` compiled rules.
pub fn campus(n: usize, seed: u64) -> Policy {
    let mut g = Rng::new(seed);
    let mut before = Vec::new();
    let mut after = Vec::new();
    let any = A::Any;
    before.push(Rule::new(false, true, true, 0, A::Table("bogons"), any, None));
    before.push(Rule::new(false, true, true, 0, A::Table("blocklist"), any, None));
    // A small site has fewer of each kind of global rule: `share(k)` of k.
    let share = |k: usize| (k * n.min(5_000) / 5_000).max(1);
    for &p in &BAD_TCP[..share(BAD_TCP.len())] {
        before.push(Rule::new(false, true, true, 6, any, any, Some(p)));
    }
    for &p in &BAD_UDP[..share(BAD_UDP.len())] {
        before.push(Rule::new(false, true, true, 17, any, any, Some(p)));
    }
    // Infrastructure: DNS, mail, web, VPN on 44.63.255.0/24.
    for h in 1..=share(40) as u32 {
        let svc: &[(u8, u16)] = match h % 4 {
            0 => &[(17, 53), (6, 53)],
            1 => &[(6, 25), (6, 587), (6, 993)],
            2 => &[(6, 80), (6, 443)],
            _ => &[(17, 1194), (6, 22)],
        };
        for &(p, port) in svc {
            before.push(Rule::new(true, true, true, p, any, A::Net(INFRA + h, 32), Some(port)));
        }
    }
    let members = members_for(n);
    let nets = members.div_ceil(250);
    let mut body = Vec::new();
    let mut trackers = Vec::new();
    for t in 0..64u32 {
        trackers.push((v4(185, 100, 0, 0) + t * 1024, 22));
    }
    for s in 0..nets {
        let base = CAMPUS.0 + s as u32 * 256;
        let (lo, hi) = (s * 250, ((s + 1) * 250).min(members));
        let mut inb = Vec::new();
        let mut outb = Vec::new();
        for k in lo..hi {
            let m = A::Net(member(k), 32);
            let mut svc: Vec<u16> = SERVICES.iter().copied().filter(|_| g.chance(30)).collect();
            svc.truncate(3);
            for p in svc {
                inb.push(Rule::new(true, true, true, 6, any, m, Some(p)));
            }
            if g.chance(10) {
                let r = (g.bits() as u32) & 0xffff_0000;
                inb.push(Rule::new(false, true, true, 0, A::Net(r, 16), m, None));
            }
            if g.chance(50) {
                inb.push(Rule::new(true, false, true, 17, any, m, Some(51820)));
            }
            if g.chance(30) {
                let r = (g.bits() as u32) & 0xffff_ff00;
                inb.push(Rule::new(true, false, true, 6, A::Net(r, 24), m, Some(5900)));
            }
            if g.chance(70) {
                outb.push(Rule::new(false, true, false, 6, m, any, Some(25)));
            }
            if g.chance(20) {
                outb.push(Rule::new(false, true, false, 0, m, A::Table("trackers"), None));
            }
        }
        for (inbound, rules) in [(true, inb), (false, outb)] {
            for mut r in rules {
                r.anchor = Some((inbound, base));
                body.push(r);
            }
        }
    }
    // Departments: admin ssh from their bastion to their /16, blocked UDP ports.
    for d in 0..share(100) as u32 {
        after.push(Rule::new(
            true,
            false,
            true,
            6,
            A::Net(v4(203, 0, 113, d as u8), 32),
            A::Net(CAMPUS.0 + (d % 64) * 65536, 16),
            Some(22),
        ));
    }
    for d in 0..share(80) as u16 {
        after.push(Rule::new(false, false, true, 17, any, any, Some(1000 + d)));
    }
    let mut echo = Rule::new(true, false, true, 1, any, any, None);
    echo.echo = true;
    after.push(echo);
    let mut out = Rule::new(true, false, false, 0, A::Net(CAMPUS.0, CAMPUS.1), any, None);
    out.tagged = true;
    after.push(out);
    let mut rules = before;
    rules.extend(body);
    rules.extend(after);
    let mut blocklist = Vec::new();
    for _ in 0..200 {
        let a = g.bits() as u32;
        if g.chance(50) {
            blocklist.push((a & 0xffff_ff00 | 0x0100_0000, 24));
        } else {
            blocklist.push((a | 0x0100_0000, 32));
        }
    }
    // Keep the blocklist off the campus and the bogons (a generator checks its feeds).
    blocklist.retain(|&(a, _)| a >> 24 != 44 && a >> 24 != 10 && a >> 24 < 224 && a >> 24 != 127);
    let bogons = vec![
        (v4(0, 0, 0, 0), 8),
        (v4(10, 0, 0, 0), 8),
        (v4(127, 0, 0, 0), 8),
        (v4(169, 254, 0, 0), 16),
        (v4(172, 16, 0, 0), 12),
        (v4(192, 168, 0, 0), 16),
        (v4(224, 0, 0, 0), 3),
    ];
    let tables = vec![("bogons", bogons), ("blocklist", blocklist), ("trackers", trackers)];
    let (pf, compiled) = print_pf(&rules, &tables);
    Policy {
        nft_naive: print_nft_naive(&rules, &tables),
        nft_expert: print_nft_expert(&rules, &tables),
        pf,
        rules,
        tables,
        compiled,
        members,
    }
}

fn pf_addr(a: &A) -> String {
    match a {
        A::Any => "any".into(),
        A::Net(x, l) => net(*x, *l),
        A::Table(t) => format!("<{t}>"),
    }
}

fn pf_rule(r: &Rule, in_anchor: bool) -> String {
    let mut s = String::from(if r.pass { "pass" } else { "block" });
    s.push_str(if r.inbound { " in" } else { " out" });
    if r.quick {
        s.push_str(" quick");
    }
    if !in_anchor {
        s.push_str(" on em0");
    }
    match r.proto {
        0 => {}
        1 => s.push_str(" inet proto icmp"),
        6 => s.push_str(" proto tcp"),
        _ => s.push_str(" proto udp"),
    }
    if r.tagged {
        s.push_str(" tagged CAMPUS");
        return s + "\n";
    }
    let _ = write!(s, " from {} to {}", pf_addr(&r.src), pf_addr(&r.dst));
    if let Some(p) = r.dport {
        let _ = write!(s, " port {p}");
    }
    if r.echo {
        s.push_str(" icmp-type echoreq");
    }
    s + "\n"
}

fn print_pf(rules: &[Rule], tables: &[(&str, Vec<(u32, u8)>)]) -> (String, usize) {
    let mut s = String::with_capacity(rules.len() * 56);
    s.push_str("# A campus ruleset as a generator writes it (xpf-bench rules --campus).\n");
    s.push_str("set limit states 1000000\n");
    for (name, entries) in tables {
        let _ = write!(s, "table <{name}> const {{");
        for (a, l) in entries {
            let _ = write!(s, " {}", net(*a, *l));
        }
        s.push_str(" }\n");
    }
    s.push_str("block all\n");
    s.push_str("pass in quick on em1 from 44.0.0.0/10\npass out quick on em1\n");
    s.push_str("match in on em0 proto tcp scrub (max-mss 1440)\nmatch out on em0 from 44.0.0.0/10 tag CAMPUS\n");
    let mut compiled = 5;
    let mut open: Option<(bool, u32)> = None;
    for r in rules {
        if r.anchor != open {
            if open.is_some() {
                s.push_str("}\n");
            }
            if let Some((inbound, base)) = r.anchor {
                let b = base.to_be_bytes();
                let name = format!("campus/{}/{}.{}.{}", if inbound { "in" } else { "out" }, b[0], b[1], b[2]);
                if inbound {
                    let _ = writeln!(s, "anchor \"{name}\" in on em0 to {}/24 {{", ip(base));
                } else {
                    let _ = writeln!(s, "anchor \"{name}\" out on em0 from {}/24 {{", ip(base));
                }
                compiled += 1;
            }
            open = r.anchor;
        }
        s.push_str(&pf_rule(r, r.anchor.is_some()));
        compiled += 1;
    }
    if open.is_some() {
        s.push_str("}\n");
    }
    (s, compiled)
}

fn nft_proto(r: &Rule) -> &'static str {
    match r.proto {
        6 => "tcp",
        17 => "udp",
        _ => "",
    }
}

fn nft_addr(side: &str, a: &A) -> String {
    match a {
        A::Any => String::new(),
        A::Net(x, l) => format!(" ip {side} {}", net(*x, *l)),
        A::Table(t) => format!(" ip {side} @{t}"),
    }
}

fn nft_rule(r: &Rule) -> String {
    let mut s = String::from(if r.inbound { "iifname \"em0\"" } else { "oifname \"em0\"" });
    s.push_str(&nft_addr("saddr", &r.src));
    s.push_str(&nft_addr("daddr", &r.dst));
    match (r.proto, r.dport) {
        (1, _) if r.echo => s.push_str(" icmp type echo-request"),
        (1, _) => s.push_str(" meta l4proto icmp"),
        (0, _) => {}
        (_, Some(p)) => {
            let _ = write!(s, " {} dport {p}", nft_proto(r));
        }
        (_, None) => {
            let _ = write!(s, " meta l4proto {}", nft_proto(r));
        }
    }
    s.push_str(if r.pass { " accept\n" } else { " drop\n" });
    s
}

fn nft_head(s: &mut String, tables: &[(&str, Vec<(u32, u8)>)]) {
    s.push_str("table inet xpfcampus {\n");
    for (name, entries) in tables {
        let _ = write!(s, "  set {name} {{\n    type ipv4_addr\n    flags interval\n    auto-merge\n    elements = {{");
        for (i, (a, l)) in entries.iter().enumerate() {
            let _ = write!(s, "{}{}", if i == 0 { " " } else { ", " }, net(*a, *l));
        }
        s.push_str(" }\n  }\n");
    }
}

const NFT_CHAIN: &str = "  chain forward {\n    type filter hook forward priority filter; policy drop;\n    ct state established,related accept\n    ct state invalid drop\n";

/// pf's order as first match: the `quick` rules in order, then the others from the last
/// back (the last match decides), then the default block. The em1 side passes everything
/// in pf; the kernel filters a forwarded packet once, so only em0's rules are written.
pub fn first_match_order(rules: &[Rule]) -> Vec<&Rule> {
    let mut v: Vec<&Rule> = rules.iter().filter(|r| r.quick).collect();
    v.extend(rules.iter().rev().filter(|r| !r.quick));
    v
}

fn print_nft_naive(rules: &[Rule], tables: &[(&str, Vec<(u32, u8)>)]) -> String {
    let mut s = String::with_capacity(rules.len() * 64);
    s.push_str("# The campus policy rule by rule (xpf-bench rules --campus), first match in pf's order.\n");
    nft_head(&mut s, tables);
    s.push_str(NFT_CHAIN);
    for r in first_match_order(rules) {
        s.push_str("    ");
        s.push_str(&nft_rule(r));
    }
    s.push_str("  }\n}\n");
    s
}

/// One set of the expert form: its name, type, elements, and the rule that uses it.
struct Set {
    name: &'static str,
    ty: &'static str,
    interval: bool,
    elems: Vec<String>,
}

fn print_nft_expert(rules: &[Rule], tables: &[(&str, Vec<(u32, u8)>)]) -> String {
    let mut s = String::with_capacity(rules.len() * 24);
    s.push_str("# The campus policy as an nftables expert writes it (xpf-bench rules --campus): sets,\n# concatenations; first match in pf's order.\n");
    nft_head(&mut s, tables);
    let mut sets: Vec<Set> = Vec::new();
    let mut chain = String::from(NFT_CHAIN);
    let add = |sets: &mut Vec<Set>, name: &'static str, ty: &'static str, interval: bool, e: String| match sets
        .iter_mut()
        .find(|x| x.name == name)
    {
        Some(x) => x.elems.push(e),
        None => sets.push(Set { name, ty, interval, elems: vec![e] }),
    };
    // The quick rules, by kind, in the order the kinds first appear (the generator's order).
    let mut kinds: Vec<&'static str> = Vec::new();
    let rule_of = |kinds: &mut Vec<&'static str>, k: &'static str, line: String, chain: &mut String| {
        if !kinds.contains(&k) {
            kinds.push(k);
            chain.push_str(&line);
        }
    };
    for r in first_match_order(rules) {
        let (pass, dport) = (r.pass, r.dport);
        match (r.quick, r.inbound, r.anchor.is_some(), r.proto, &r.src, &r.dst) {
            (true, true, false, 0, A::Table(t), A::Any) => {
                chain.push_str(&format!("    iifname \"em0\" ip saddr @{t} drop\n"));
            }
            (true, true, false, p @ (6 | 17), A::Any, A::Any) if !pass => {
                let (name, ty) = if p == 6 { ("bad_tcp", "tcp") } else { ("bad_udp", "udp") };
                add(&mut sets, name, "inet_service", false, dport.unwrap().to_string());
                rule_of(&mut kinds, name, format!("    iifname \"em0\" {ty} dport @{name} drop\n"), &mut chain);
            }
            (true, true, false, p, A::Any, A::Net(d, 32)) if pass => {
                let proto = if p == 6 { "tcp" } else { "udp" };
                add(
                    &mut sets,
                    "infra",
                    "ipv4_addr . inet_proto . inet_service",
                    false,
                    format!("{} . {proto} . {}", ip(*d), dport.unwrap()),
                );
                rule_of(
                    &mut kinds,
                    "infra",
                    "    iifname \"em0\" ip daddr . meta l4proto . th dport @infra accept\n".into(),
                    &mut chain,
                );
            }
            (true, true, true, 6, A::Any, A::Net(d, 32)) if pass => {
                add(
                    &mut sets,
                    "member_svc",
                    "ipv4_addr . inet_service",
                    false,
                    format!("{} . {}", ip(*d), dport.unwrap()),
                );
                rule_of(
                    &mut kinds,
                    "member_svc",
                    "    iifname \"em0\" ip daddr . tcp dport @member_svc accept\n".into(),
                    &mut chain,
                );
            }
            (true, true, true, 0, A::Net(sn, 16), A::Net(d, 32)) => {
                // A member's services come before its blocks: the pass set's rule first.
                if !sets.iter().any(|x| x.name == "member_svc") {
                    sets.push(Set {
                        name: "member_svc",
                        ty: "ipv4_addr . inet_service",
                        interval: false,
                        elems: Vec::new(),
                    });
                }
                rule_of(
                    &mut kinds,
                    "member_svc",
                    "    iifname \"em0\" ip daddr . tcp dport @member_svc accept\n".into(),
                    &mut chain,
                );
                add(&mut sets, "member_block", "ipv4_addr . ipv4_addr", true, format!("{} . {}", ip(*d), net(*sn, 16)));
                rule_of(
                    &mut kinds,
                    "member_block",
                    "    iifname \"em0\" ip daddr . ip saddr @member_block drop\n".into(),
                    &mut chain,
                );
            }
            (true, false, true, 6, A::Net(m, 32), A::Any) => {
                add(&mut sets, "no_smtp", "ipv4_addr", false, ip(*m));
                rule_of(
                    &mut kinds,
                    "no_smtp",
                    "    oifname \"em0\" ip saddr @no_smtp tcp dport 25 drop\n".into(),
                    &mut chain,
                );
            }
            (true, false, true, 0, A::Net(m, 32), A::Table(t)) => {
                add(&mut sets, "no_trackers", "ipv4_addr", false, ip(*m));
                rule_of(
                    &mut kinds,
                    "no_trackers",
                    format!("    oifname \"em0\" ip saddr @no_trackers ip daddr @{t} drop\n"),
                    &mut chain,
                );
            }
            // The non-quick rules, from the last back.
            (false, false, false, 0, A::Net(..), A::Any) if r.tagged => chain.push_str(&format!("    {}", nft_rule(r))),
            (false, true, false, 1, ..) => chain.push_str(&format!("    {}", nft_rule(r))),
            (false, true, false, 17, A::Any, A::Any) => {
                add(&mut sets, "dept_udp", "inet_service", false, dport.unwrap().to_string());
                rule_of(&mut kinds, "dept_udp", "    iifname \"em0\" udp dport @dept_udp drop\n".into(), &mut chain);
            }
            (false, true, false, 6, A::Net(b, 32), A::Net(d, 16)) => {
                add(&mut sets, "dept_ssh", "ipv4_addr . ipv4_addr", true, format!("{} . {}", ip(*b), net(*d, 16)));
                rule_of(
                    &mut kinds,
                    "dept_ssh",
                    "    iifname \"em0\" ip saddr . ip daddr @dept_ssh tcp dport 22 accept\n".into(),
                    &mut chain,
                );
            }
            (false, true, true, 6, A::Net(rn, 24), A::Net(d, 32)) => {
                add(&mut sets, "member_vnc", "ipv4_addr . ipv4_addr", true, format!("{} . {}", ip(*d), net(*rn, 24)));
                rule_of(
                    &mut kinds,
                    "member_vnc",
                    "    iifname \"em0\" ip daddr . ip saddr @member_vnc tcp dport 5900 accept\n".into(),
                    &mut chain,
                );
            }
            (false, true, true, 17, A::Any, A::Net(d, 32)) => {
                add(&mut sets, "member_wg", "ipv4_addr", false, ip(*d));
                rule_of(
                    &mut kinds,
                    "member_wg",
                    "    iifname \"em0\" ip daddr @member_wg udp dport 51820 accept\n".into(),
                    &mut chain,
                );
            }
            _ => panic!("the expert form has no place for {r:?}"),
        }
    }
    for x in &sets {
        let _ = write!(s, "  set {} {{\n    type {}\n", x.name, x.ty);
        if x.interval {
            s.push_str("    flags interval\n");
        }
        if x.elems.is_empty() {
            s.push_str("  }\n");
            continue;
        }
        s.push_str("    elements = {");
        for (i, e) in x.elems.iter().enumerate() {
            let _ = write!(s, "{}{e}", if i == 0 { " " } else { ", " });
        }
        s.push_str(" }\n  }\n");
    }
    s.push_str(&chain);
    s.push_str("  }\n}\n");
    s
}

/// A packet of the comparison: (inbound on em0, protocol, source, destination, port, echo).
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub inbound: bool,
    pub proto: u8,
    pub src: u32,
    pub dst: u32,
    pub dport: u16,
}

impl Probe {
    /// The connection's first packet as the engine's descriptor (a TCP SYN, or a datagram).
    pub fn pdesc(&self) -> xpf_wire::PDesc {
        xpf_wire::PDesc {
            src: xpf_wire::Addr::v4(self.src.to_be_bytes()),
            dst: xpf_wire::Addr::v4(self.dst.to_be_bytes()),
            sport: 40000,
            dport: self.dport,
            af: xpf_wire::pdesc::AF_INET,
            proto: self.proto,
            tcp_flags: if self.proto == 6 { xpf_wire::tcp::SYN } else { 0 },
            flags: xpf_wire::pdesc::pdf::HAS_PORTS,
            ..Default::default()
        }
    }
}

impl Policy {
    fn table(&self, t: &str) -> &[(u32, u8)] {
        &self.tables.iter().find(|x| x.0 == t).unwrap().1
    }

    fn addr(&self, a: &A, x: u32) -> bool {
        let inn = |n: u32, l: u8| l == 0 || (x ^ n) >> (32 - l as u32) == 0;
        match a {
            A::Any => true,
            A::Net(n, l) => inn(*n, *l),
            A::Table(t) => self.table(t).iter().any(|&(n, l)| inn(n, l)),
        }
    }

    /// The verdict of the nftables forms for a new connection's first packet (first match
    /// in [`first_match_order`]; default drop): true to pass.
    pub fn first_match(&self, p: &Probe) -> bool {
        for r in first_match_order(&self.rules) {
            let hit = r.inbound == p.inbound
                && (r.proto == 0 || r.proto == p.proto)
                && self.addr(&r.src, p.src)
                && self.addr(&r.dst, p.dst)
                && r.dport.is_none_or(|d| p.proto != 1 && d == p.dport);
            if hit {
                return r.pass;
            }
        }
        false
    }

    /// New connections of the campus, a mix of the allowed and the refused: inbound to a
    /// member's service (sometimes not offered), from a blocklisted source, to a bad port;
    /// outbound to the web, to SMTP, to a tracker.
    pub fn probes(&self, n: usize, seed: u64) -> Vec<Probe> {
        let mut g = Rng::new(seed);
        (0..n)
            .map(|_| {
                let m = member(g.below(self.members as u64) as usize);
                let outside = v4(198, 18, 0, 0) + g.below(1 << 17) as u32;
                let ports = [22, 80, 443, 3389, 8080, 51820, 5900, 25, 445, 1010];
                match g.below(10) {
                    0..=5 => {
                        let dport = ports[g.below(ports.len() as u64) as usize];
                        let proto = if dport == 51820 || dport == 1010 { 17 } else { 6 };
                        let src = match g.below(20) {
                            0 => self.table("blocklist")[g.below(self.table("blocklist").len() as u64) as usize].0 | 1,
                            _ => outside,
                        };
                        Probe { inbound: true, proto, src, dst: m, dport }
                    }
                    _ => {
                        let (dst, dport) = match g.below(10) {
                            0 => (self.table("trackers")[0].0 + 7, 443),
                            1..=2 => (outside, 25),
                            _ => (outside, 443),
                        };
                        Probe { inbound: false, proto: 6, src: m, dst, dport }
                    }
                }
            })
            .collect()
    }
}

/// A ClassBench-style random set of `n` rules (pf.conf): prefixes of varied lengths on both
/// addresses (from a few hundred base networks, as real ACLs cluster), exact ports, port
/// ranges and wildcards, TCP, UDP or any protocol, pass and block, some `quick`.
pub fn random(n: usize, seed: u64) -> String {
    let mut g = Rng::new(seed);
    let bases: Vec<u32> = (0..512).map(|_| g.bits() as u32).collect();
    let mut s = String::with_capacity(n * 72);
    s.push_str("# A ClassBench-style random ruleset (xpf-bench rules --random).\nblock all\n");
    let lens = [0u8, 8, 12, 16, 20, 21, 24, 24, 27, 28, 30, 32, 32, 32];
    let addr = |g: &mut Rng| {
        let l = lens[g.below(lens.len() as u64) as usize];
        if l == 0 {
            return "any".to_string();
        }
        let a = bases[g.below(bases.len() as u64) as usize] ^ (g.bits() as u32 & (u32::MAX >> (l / 2)));
        let m = if l == 32 { u32::MAX } else { !(u32::MAX >> l) };
        net(a & m, l)
    };
    for _ in 1..n {
        let action = if g.chance(60) { "pass" } else { "block" };
        let quick = if g.chance(30) { " quick" } else { "" };
        let dir = ["", " in", " out"][g.below(3) as usize];
        let proto = match g.below(10) {
            0..=5 => "tcp",
            6..=8 => "udp",
            _ => "",
        };
        let (src, dst) = (addr(&mut g), addr(&mut g));
        let _ = write!(s, "{action}{dir}{quick} on em0 inet");
        if proto.is_empty() {
            let _ = writeln!(s, " from {src} to {dst}");
            continue;
        }
        let sport = match g.below(10) {
            0..=7 => String::new(),
            8 => " port 1024:65535".into(),
            _ => format!(" port {}", g.below(65535) + 1),
        };
        let dport = match g.below(10) {
            0..=4 => format!(" port {}", [22, 25, 53, 80, 123, 443, 8080, 3306][g.below(8) as usize]),
            5 => format!(" port {}", g.below(65535) + 1),
            6 => " port 0:1023".into(),
            7 => {
                let lo = g.below(60000) + 1;
                format!(" port {lo}:{}", lo + g.below(1000))
            }
            _ => String::new(),
        };
        let _ = writeln!(s, " proto {proto} from {src}{sport} to {dst}{dport}");
    }
    s
}
