//! pfctl's expansion of a rule line into rules: lists, families, translation pools, label
//! macros, and the checks pfctl makes on each combination.

use super::*;

/// A translation target given as several addresses (a list, or an interface with several):
/// only those of the rule's family count; one left is the target, more become an automatic
/// table (round-robin unless told), as pfctl does.
pub(super) fn resolve_pools(r: &mut Rule, out: &mut Parsed) -> R<()> {
    let af = r.af;
    let route = r.route.as_mut().map(|x| &mut x.1);
    for (pl, what) in [(r.nat.as_deref_mut(), "translation"), (r.rdr.as_deref_mut(), "translation"), (route, "routing")]
    {
        let Some(pl) = pl else { continue };
        let Some(list) = pl.list.take() else { continue };
        let l: Vec<Host> = list.into_iter().filter(|h| fits(h, af)).collect();
        match l.len() {
            0 => return Err(format!("no {what} address with matching address family found.")),
            1 => pl.host = l[0].clone(),
            _ => {
                pl.host = auto_table(l, out);
                if pl.kind == PoolKind::None {
                    pl.kind = PoolKind::RoundRobin;
                }
            }
        }
    }
    Ok(())
}

/// pfctl's collapse of a translation or routing list, made for every combination of a rule
/// before its family is checked: several addresses of one family (of the rule's, when it
/// names one) become an automatic table, and pin the combination to that family. A
/// combination then dropped for its family has still numbered a table, as in pfctl (`to lo0`
/// over ::1, fe80::1 and 127.0.0.1 with `rdr-to { 127.0.0.1, 127.0.0.2 }` makes three tables
/// and one rule). A list of mixed families, or of fewer addresses, waits for
/// [`resolve_pools`], which keeps those of the combination's family.
fn collapse_lists(r: &mut Rule, out: &mut Parsed) -> Af {
    let af = r.af;
    let mut pinned = Af::Any;
    let route = r.route.as_mut().map(|x| &mut x.1);
    for pl in [r.nat.as_deref_mut(), r.rdr.as_deref_mut(), route].into_iter().flatten() {
        let Some(list) = &pl.list else { continue };
        let kept: Vec<Host> = list.iter().filter(|h| fits(h, af)).cloned().collect();
        let fam = kept.first().map_or(Af::Any, Host::af);
        if kept.len() < 2 || fam == Af::Any || kept.iter().any(|h| h.af() != fam) {
            continue;
        }
        pl.list = None;
        pl.host = auto_table(kept, out);
        if pl.kind == PoolKind::None {
            pl.kind = PoolKind::RoundRobin;
        }
        if pinned == Af::Any {
            pinned = fam;
        }
    }
    pinned
}

/// Whether pool address `h` may serve a rule of family `af` (either unpinned, or the same).
fn fits(h: &Host, af: Af) -> bool {
    af == Af::Any || h.af() == Af::Any || h.af() == af
}

/// A pool of several addresses becomes a const table `__automatic_N`, printed with the header.
fn auto_table(hosts: Vec<Host>, out: &mut Parsed) -> Host {
    let name = format!("__automatic_{}", out.auto_tables);
    out.auto_tables += 1;
    let tb = Table {
        name: name.clone(),
        konst: true,
        persist: false,
        counters: false,
        parts: vec![TablePart::Hosts(hosts)],
        line: 0,
        file: "".into(),
    };
    out.header.push(crate::print::table(&tb));
    out.tables.push(tb);
    Host { neg: false, kind: HostKind::Table(name) }
}

/// pfctl's checks of one binat-to combination: a source that is one network (not a table or an
/// interface), a target that is one network of the same mask. `pool` None: no target address
/// of the family was left (already reported).
fn binat_checks(src: &Host, pool: Option<&Host>, af: Af) -> Vec<String> {
    let mut e = Vec::new();
    // An interface stands for one address only as `(if:0)`.
    let first_only =
        |h: &Host| matches!(&h.kind, HostKind::Dynamic { modifier, .. } if modifier.as_deref() == Some("0"));
    match &src.kind {
        HostKind::Table(n) => e.push(format!("invalid use of table <{n}> as the source address of a binat-to rule")),
        HostKind::Dynamic { ifname, .. } if !first_only(src) => {
            e.push(format!("invalid use of interface ({ifname}) as the source address of a binat-to rule"));
            e.push("dynamic interfaces must be used with :0 in a binat-to rule".into());
        }
        _ => {
            let bits = if af == Af::Inet6 { 128 } else { 32 };
            // The mask as pf holds it: a network's prefix, an interface's first address whole,
            // nothing for the other kinds.
            let mask = |h: Option<&Host>| match h.map(|h| &h.kind) {
                Some(HostKind::Net(_, l)) => (*l).min(bits),
                Some(HostKind::Dynamic { prefix, .. }) if h.is_some_and(first_only) => prefix.unwrap_or(bits).min(bits),
                _ => 0,
            };
            let network = |h: Option<&Host>| match h {
                None => true,
                Some(h) => matches!(h.kind, HostKind::Net(..)) || first_only(h),
            };
            if !network(Some(src)) || !network(pool) || mask(Some(src)) == 0 {
                e.push("binat-to requires a specified source and redirect address".into());
            }
            if mask(Some(src)) != 0 && mask(Some(src)) != mask(pool) {
                e.push("source and redir addresess must have a matching network mask in binat-rule".into());
            }
            if matches!(pool.map(|h| &h.kind), Some(HostKind::Table(_))) {
                e.push("tables cannot be used as the redirect address of a binat-to rule".into());
            }
        }
    }
    e
}

/// pfctl's `rule_consistent`: what one combination of a rule may not hold, in pfctl's order
/// and words, every problem of it (pfctl reports them all, then skips the rule). `af` is the
/// family the combination settled on.
fn consistent(r: &Rule, af: Af) -> Vec<String> {
    let mut e: Vec<String> = Vec::new();
    let tcp_udp = matches!(r.proto, Some(6) | Some(17));
    if !tcp_udp && (r.src_port.is_some() || r.dst_port.is_some()) {
        e.push("port only applies to tcp/udp".into());
    }
    if !tcp_udp && r.user.is_some() {
        e.push("user only applies to tcp/udp".into());
    }
    if !tcp_udp && r.group.is_some() {
        e.push("group only applies to tcp/udp".into());
    }
    if r.icmp.is_some() && !matches!(r.proto, Some(1) | Some(58)) {
        e.push("icmp-type/code only applies to icmp".into());
    }
    if r.icmp.is_some() && af == Af::Any {
        e.push("must indicate address family with icmp-type/code".into());
    }
    if r.af_to.as_ref().is_some_and(|a| a.0 == af) {
        e.push("must indicate different address family with af-to".into());
    }
    let o = &*r.state_opts;
    if o.overload.is_some() && o.max_src_conn.is_none() && o.max_src_conn_rate.is_none() {
        e.push("'overload' requires 'max-src-conn' or 'max-src-conn-rate'".into());
    }
    match (r.proto, af) {
        (Some(1), Af::Inet6) => e.push("proto icmp doesn't match address family inet6".into()),
        (Some(58), Af::Inet) => e.push("proto icmp6 doesn't match address family inet".into()),
        _ => {}
    }
    if r.allow_opts && r.action != Action::Pass {
        e.push("allow-opts can only be specified for pass rules".into());
    }
    if matches!(r.ret, Return::Rst { .. }) && r.proto != Some(6) {
        e.push("return-rst can only be applied to TCP rules".into());
    }
    if r.action != Action::Pass && r.state != StateKind::No {
        e.push("keep state is great, but only for pass rules".into());
    }
    if r.route.is_some() && r.state == StateKind::No {
        e.push("route-to, reply-to and dup-to require keep state".into());
    }
    if o.sloppy && matches!(r.state, StateKind::Modulate | StateKind::Synproxy) {
        e.push("sloppy state matching cannot be used with synproxy state or modulate state".into());
    }
    let xlate = r.nat.is_some() || r.rdr.is_some();
    if xlate && r.action != Action::Match && r.state == StateKind::No {
        e.push("nat-to and rdr-to require keep state".into());
    }
    if xlate && r.dir == Dir::Both {
        e.push("nat-to and rdr-to require a direction".into());
    }
    if af == Af::Inet6 && r.scrub.as_ref().is_some_and(|s| s.no_df || s.random_id) {
        e.push("address family inet6 does not support scrub options no-df, random-id".into());
    }
    match r.action {
        Action::Match => {
            if r.divert.is_some() {
                e.push("divert is not supported on match rules".into());
            }
            if r.route.is_some() {
                e.push("route-to, reply-to and dup-to are not supported on match rules".into());
            }
            if r.af_to.is_some() {
                e.push("af-to is not supported on match rules".into());
            }
        }
        Action::Block if r.route.is_some() => {
            e.push("route-to, reply-to and dup-to are not supported on block rules".into());
        }
        _ => {}
    }
    e
}

pub(super) fn one_or_none<T: Clone>(v: &[T]) -> impl Iterator<Item = Option<T>> + '_ {
    let none = v.is_empty().then_some(None);
    v.iter().cloned().map(Some).chain(none)
}

/// pfctl's expand_rule: every combination of interface, protocol, source and destination
/// (and their ports, and ICMP types), each one a rule if its address families agree.
pub(super) fn expand(t: &Template, nr: &mut u32, parsed: &mut Parsed) -> Result<Vec<Rule>, Vec<String>> {
    let mut errs = Vec::new();
    let any = [Host::ANY];
    let srcs: &[Host] = if t.src.is_empty() { &any } else { &t.src };
    let dsts: &[Host] = if t.dst.is_empty() { &any } else { &t.dst };
    // Room for every combination at once (most rules are one).
    let n = [
        t.ifs.len(),
        t.protos.len(),
        t.icmp.len(),
        t.src_ports.len(),
        t.dst_ports.len(),
        t.users.len(),
        t.groups.len(),
    ]
    .iter()
    .fold(srcs.len() * dsts.len(), |n, &k| n.saturating_mul(k.max(1)));
    let mut out = Vec::with_capacity(n.min(1 << 16));
    // pfctl's order: interface, protocol, ICMP type, source, destination, source port,
    // destination port.
    for on in one_or_none(&t.ifs) {
        for proto in one_or_none(&t.protos) {
            for ic in one_or_none(&t.icmp) {
                for s in srcs {
                    for d in dsts {
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
                                        let list_af = collapse_lists(&mut r, parsed);
                                        // The family: the rule's, or what the addresses pin.
                                        let mut af = r.af;
                                        let mut ok = true;
                                        let route_af = r.route.as_ref().map_or(Af::Any, |x| x.1.host.af());
                                        let fixed_af = [r.af, s.af(), d.af()]
                                            .into_iter()
                                            .find(|a| *a != Af::Any)
                                            .unwrap_or(Af::Any);
                                        if r.route.is_some()
                                            && route_af != Af::Any
                                            && fixed_af != Af::Any
                                            && route_af != fixed_af
                                        {
                                            // pfctl goes on to its consistency checks.
                                            errs.push("af mismatch in routing spec".into());
                                            errs.extend(consistent(&r, fixed_af));
                                            errs.push(SKIPPING.into());
                                            continue;
                                        }
                                        // binat-to: its target's addresses of the rule's family
                                        // (None: none left, the pool stays empty).
                                        let mut binat_errs = Vec::new();
                                        let binat_pool = t.binat.as_ref().map(|b| {
                                            let fam = [r.af, s.af(), d.af()]
                                                .into_iter()
                                                .find(|a| *a != Af::Any)
                                                .unwrap_or(Af::Any);
                                            let all = b.list.clone().unwrap_or_else(|| vec![b.host.clone()]);
                                            let kept: Vec<Host> = all.into_iter().filter(|h| fits(h, fam)).collect();
                                            match kept.len() {
                                                0 => {
                                                    binat_errs.push("af mismatch in translation spec".to_string());
                                                    None
                                                }
                                                1 => Some(kept[0].clone()),
                                                _ => Some(auto_table(kept, parsed)),
                                            }
                                        });
                                        if let (Some(pool), Some(b)) = (&binat_pool, &t.binat) {
                                            r.nat = pool.as_ref().map(|h| {
                                                Box::new(Pool {
                                                    host: h.clone(),
                                                    static_port: true,
                                                    list: None,
                                                    ..b.clone()
                                                })
                                            });
                                        }
                                        // A routing pool's list pins the family when all its
                                        // addresses are of one (pfctl); a translation pool's
                                        // list is filtered by the family instead.
                                        let route_list_af =
                                            r.route.as_ref().and_then(|x| x.1.list.as_ref()).and_then(|l| {
                                                let a = l.first()?.af();
                                                l.iter().all(|h| h.af() == a).then_some(a)
                                            });
                                        let pool_af =
                                            [r.nat.as_deref(), r.rdr.as_deref(), r.route.as_ref().map(|x| &x.1)]
                                                .into_iter()
                                                .flatten()
                                                .filter(|p| p.list.is_none())
                                                .map(|p| p.host.af())
                                                .chain(route_list_af)
                                                .chain([list_af])
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
                                            errs.extend(binat_errs);
                                            continue;
                                        }
                                        if let Some(pool) = binat_pool {
                                            binat_errs.extend(binat_checks(s, pool.as_ref(), af));
                                            if !binat_errs.is_empty() {
                                                errs.extend(binat_errs);
                                                errs.push(SKIPPING.into());
                                                continue;
                                            }
                                        }
                                        if let Some(l) = [s, d].iter().find_map(|h| match h.kind {
                                            HostKind::Net(a, l) if a.is_ipv4() && l > 32 => Some(l),
                                            _ => None,
                                        }) {
                                            errs.push(format!("{BARE}netmask {l} invalid for IPv4 address"));
                                            errs.push(SKIPPING.into());
                                            continue;
                                        }
                                        // FreeBSD's translation rules have checks of their own (rule.rs).
                                        if t.r.xlate.is_none() {
                                            let ce = consistent(&r, af);
                                            if !ce.is_empty() {
                                                errs.extend(ce);
                                                errs.push(SKIPPING.into());
                                                continue;
                                            }
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
                                            && !r.fragment
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

pub(super) fn label_macros(l: &str, r: &Rule, nr: u32) -> String {
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

#[cfg(test)]
mod tests {
    /// The messages a one-line ruleset is refused with (empty: it loads).
    fn refused(line: &str) -> Vec<String> {
        crate::parse::parse(&format!("{line}\n"), "t.conf", &[]).errors.into_iter().map(|e| e.msg).collect()
    }

    /// FreeBSD's scrub rules: taken with what xpf does to every packet (normalization,
    /// reassembly) and the options that act on each packet, printed as pfctl prints them,
    /// kept out of the filter rules; `reassemble tcp`, other fragment modes, `no scrub`,
    /// rule options beyond a scrub rule's and `set reassemble no` refused.
    #[test]
    fn scrub_rules_that_ask_for_reassembly_load_and_the_rest_are_refused_by_name() {
        let p = crate::parse::parse(
            "ext = \"em0\"\nscrub in all\nscrub on $ext inet all fragment reassemble\n\
             scrub out proto tcp from 10.0.0.0/8 to any\npass all\n",
            "t.conf",
            &[],
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.scrubs.len(), 3);
        assert_eq!(p.rules.len(), 1, "scrub rules are not filter rules");
        assert_eq!(
            crate::print::parsed(&p),
            "ext = \"em0\"\nscrub in all fragment reassemble\nscrub on em0 inet all fragment reassemble\n\
             scrub out inet proto tcp from 10.0.0.0/8 to any fragment reassemble\npass all flags S/SA\n"
        );
        assert_eq!(p.interface_names().collect::<Vec<_>>(), ["em0"], "its interface must exist at load");
        // The per-packet options, in any order, printed in pfctl's.
        let p = crate::parse::parse(
            "scrub in all no-df
scrub on em0 all set-tos 16 max-mss 1400 random-id min-ttl 9 fragment reassemble
",
            "t.conf",
            &[],
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(
            crate::print::parsed(&p),
            "scrub in all no-df fragment reassemble\n\
             scrub on em0 all random-id min-ttl 9 max-mss 1400 set-tos 0x10 fragment reassemble\n"
        );
        let got = refused("scrub in inet6 all random-id");
        assert_eq!(got[0], "address family inet6 does not support scrub options no-df, random-id", "{got:?}");
        for (line, msg) in [
            ("scrub in all no-df no-df", "no-df cannot be respecified"),
            ("scrub in all min-ttl 256", "illegal min-ttl value 256"),
            ("scrub in all reassemble tcp", "xpf does not support 'reassemble tcp' yet"),
            ("scrub in all fragment crop", "xpf does not support 'fragment crop' on a scrub rule yet"),
            ("no scrub in on em0 all", "xpf does not support 'no scrub' yet"),
            ("scrub in log all", "xpf does not support 'log' on a scrub rule yet"),
            ("scrub in all tag T", "xpf does not support 'tag' on a scrub rule yet"),
            (
                "scrub in all nat-to 10.0.0.1",
                "xpf takes a scrub rule's interface, direction, family, protocol and addresses",
            ),
            (
                "set reassemble no\nscrub in all",
                "a scrub rule asks for reassembly, which `set reassemble no` turns off",
            ),
            (
                "scrub in all\nset reassemble no",
                "`set reassemble no` turns off the reassembly the scrub rules before it ask for",
            ),
        ] {
            let got = refused(line);
            assert!(got.len() == 1 && got[0].starts_with(msg), "{line}: {got:?}");
        }
    }

    /// Bandwidths as pfctl reads them (strtod, then b, K, M or G, the last three with an
    /// optional b, bit, B or Bit) and prints them; FreeBSD's ALTQ refused by name on every line
    /// of it, never as a bare syntax error.
    #[test]
    fn bandwidths_read_as_pfctl_reads_them_and_altq_is_refused_by_name() {
        let p = crate::parse::parse(
            "queue r on em0 bandwidth 1.5Mb\nqueue a parent r bandwidth 600Kbit\n\
             queue b parent r bandwidth 0.5MB max 1.2M\nqueue c parent r bandwidth 2300b default\npass all\n",
            "t.conf",
            &[],
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let printed: Vec<String> = p.queues.iter().map(crate::print::queue).collect();
        assert_eq!(
            printed,
            [
                "queue r on em0 bandwidth 1500K",
                "queue a parent r bandwidth 600K",
                "queue b parent r bandwidth 500K, max 1200K",
                "queue c parent r bandwidth 2300 default"
            ]
        );
        assert_eq!(refused("queue r on em0 bandwidth 10Mbps"), ["unknown unit Mbps"]);
        assert_eq!(refused("queue r on em0 bandwidth 1.2.3M"), ["invalid bandwidth 1.2.3M"]);
        assert_eq!(refused("queue r on em0 bandwidth 1.5"), ["unknown unit "]);
        assert_eq!(
            refused("queue r on em0 bandwidth 100M\nqueue a parent r bandwidth 101%"),
            ["bandwidth spec out of range"]
        );
        let p = crate::parse::parse(
            "queue r on em0 bandwidth 100M\nqueue a parent r bandwidth 12.5% default\n",
            "t.conf",
            &[],
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(crate::print::queue(&p.queues[1]), "queue a parent r bandwidth 12% default");
        for (line, what) in [
            ("altq on em0 cbq bandwidth 5Mb queue { std, http }", "altq on"),
            ("queue std bandwidth 10% cbq(default)", "cbq"),
            ("queue q_pri priority 7", "priority"),
            ("queue ssh bandwidth 20% { ssh_interactive, ssh_bulk }", "{ child, ... }"),
            ("pass out on em0 proto tcp queue (q_def, q_pri)", "queue"),
        ] {
            let m = refused(line);
            assert_eq!(m.len(), 1, "{line}: {m:?}");
            assert!(m[0].starts_with(&format!("xpf does not support ALTQ's '{what}' yet")), "{line}: {m:?}");
        }
    }

    #[test]
    fn what_pfctls_consistency_checks_refuse_is_refused_in_its_words() {
        let skip = |m: &[&str]| {
            let mut v: Vec<String> = m.iter().map(|s| s.to_string()).collect();
            v.push("skipping rule due to errors".into());
            v.push("rule expands to no valid combination".into());
            v
        };
        for (line, msgs) in [
            ("pass in proto icmp to port 80", vec!["port only applies to tcp/udp"]),
            ("pass in inet proto tcp icmp-type echoreq", vec!["icmp-type/code only applies to icmp"]),
            ("pass in proto icmp icmp-type echoreq", vec!["must indicate address family with icmp-type/code"]),
            ("pass in keep state (overload <b>)", vec!["'overload' requires 'max-src-conn' or 'max-src-conn-rate'"]),
            ("block in allow-opts", vec!["allow-opts can only be specified for pass rules"]),
            ("match in allow-opts", vec!["allow-opts can only be specified for pass rules"]),
            ("block return-rst in proto udp", vec!["return-rst can only be applied to TCP rules"]),
            ("block return-rst in", vec!["return-rst can only be applied to TCP rules"]),
            ("block in keep state", vec!["keep state is great, but only for pass rules"]),
            ("match in modulate state", vec!["keep state is great, but only for pass rules"]),
            (
                "pass in proto tcp modulate state (sloppy)",
                vec!["sloppy state matching cannot be used with synproxy state or modulate state"],
            ),
            ("pass in on lo no state rdr-to 192.0.2.1", vec!["nat-to and rdr-to require keep state"]),
            ("pass on lo nat-to 192.0.2.1", vec!["nat-to and rdr-to require a direction"]),
            ("match on lo rdr-to 192.0.2.1", vec!["nat-to and rdr-to require a direction"]),
            (
                "pass on lo no state nat-to 192.0.2.1",
                vec!["nat-to and rdr-to require keep state", "nat-to and rdr-to require a direction"],
            ),
            (
                "pass in inet6 scrub (no-df)",
                vec!["address family inet6 does not support scrub options no-df, random-id"],
            ),
            (
                "match in route-to 10.0.0.1",
                vec![
                    "route-to, reply-to and dup-to require keep state",
                    "route-to, reply-to and dup-to are not supported on match rules",
                ],
            ),
        ] {
            assert_eq!(refused(line), skip(&msgs), "{line}");
        }
        // Their lawful neighbours load; binat-to is its two halves, each with its direction.
        for line in [
            "pass in inet proto icmp icmp-type echoreq",
            "pass in inet6 proto icmp6 icmp6-type echoreq",
            "pass in proto tcp keep state (max-src-conn 5, overload <b>)",
            "block return-rst in proto tcp",
            "pass in allow-opts",
            "match out on lo nat-to 192.0.2.1",
            "match out on lo no state nat-to 192.0.2.1",
            "pass in on lo nat-to 192.0.2.1",
            "pass out on lo rdr-to 192.0.2.1",
            "pass on lo from 10.0.0.1 binat-to 192.0.2.1",
            "pass in inet scrub (no-df, random-id)",
            "pass in proto tcp flags any keep state (sloppy)",
        ] {
            assert_eq!(refused(line), Vec::<String>::new(), "{line}");
        }
    }

    /// A list of one family becomes its automatic table in every combination, as pfctl
    /// collapses it before checking the family: the combinations of the other family are left
    /// out (and have numbered tables), the rule keeps the family the list pins.
    #[test]
    fn a_pool_list_pins_the_family_and_numbers_a_table_per_combination() {
        let p = crate::parse::parse(
            "match in on lo from any to { ::1, 127.0.0.1 } rdr-to { 127.0.0.1, 127.0.0.2 }\n\
             match out on lo nat-to { 192.0.2.1, 192.0.2.2 } random\n",
            "t.conf",
            &[],
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let names: Vec<&str> = p.tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["__automatic_0", "__automatic_1", "__automatic_2"]);
        let printed = crate::print::parsed(&p);
        assert!(
            printed.contains("match in on lo inet from any to 127.0.0.1 rdr-to <__automatic_1> round-robin\n"),
            "{printed}"
        );
        assert!(printed.contains("match out on lo inet all nat-to <__automatic_2> random\n"), "{printed}");
        assert_eq!(p.rules.len(), 2, "{printed}");
        // No combination of the list's family: refused.
        assert_eq!(
            refused("match in on lo from any to ::1 rdr-to { 127.0.0.1, 127.0.0.2 }"),
            ["rule expands to no valid combination"]
        );
    }
}
