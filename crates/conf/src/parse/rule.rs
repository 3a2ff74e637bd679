//! Filter rules (`pass`, `block`, `match`, `anchor`), their options, and `antispoof`.

use super::*;

pub(super) fn rule(p: &mut P, line: u32, block_return: bool) -> R<Vec<Template>> {
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
    let mut t = Template::new(r);
    if p.eat("in") {
        t.r.dir = Dir::In;
    } else if p.eat("out") {
        t.r.dir = Dir::Out;
    }
    // `log` and `quick` come in either order.
    for _ in 0..2 {
        if p.eat("log") {
            t.r.log = Some(log_opts(p)?);
        }
        if p.eat("quick") {
            t.r.quick = true;
        }
    }
    on_af_proto_fromto(p, &mut t)?;
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
    if let Some(m) = t.r.state_opts.max {
        let o = &mut *t.r.state_opts;
        let has = |o: &StateOpts, x| o.timeouts.iter().any(|(t, _)| *t == x);
        if !has(o, xpf_state::Timeout::AdaptiveStart) && !has(o, xpf_state::Timeout::AdaptiveEnd) {
            o.timeouts.push((xpf_state::Timeout::AdaptiveStart, m / 10 * 6));
            o.timeouts.push((xpf_state::Timeout::AdaptiveEnd, m / 10 * 12));
        }
    }
    // binat-to is two rules: out with nat-to (static-port), in with rdr-to back. The target is
    // checked per combination in the expansion (pfctl's messages, once per line).
    if let Some(b) = t.r.binat.take() {
        let mut inb = t.clone();
        let mut out = t;
        out.r.dir = Dir::Out;
        out.binat = Some((*b).clone());
        out.r.nat = Some(Box::new(Pool { static_port: true, list: None, endpoint_independent: false, ..(*b).clone() }));
        inb.r.dir = Dir::In;
        inb.src = out.dst.clone();
        // The address the in half answers on: the target of the source's family.
        let fam = out.src.iter().chain(out.dst.iter()).map(Host::af).find(|a| *a != Af::Any).unwrap_or(out.r.af);
        let back = b.list.iter().flatten().find(|h| fam == Af::Any || h.af() == fam).unwrap_or(&b.host);
        inb.dst = vec![back.clone()];
        let orig = out.src.first().cloned().unwrap_or(Host::ANY);
        inb.r.rdr = Some(Box::new(Pool { sticky: b.sticky, ..Pool::to(orig) }));
        return Ok(vec![out, inb]);
    }
    Ok(vec![t])
}

/// A source-hash key as pfctl prints it: `0x` and 32 hex digits.
fn hex_key(k: &[u8]) -> String {
    format!("0x{}", k.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// `log`'s options after the word: `(all, matches, user, to IF)`.
fn log_opts(p: &mut P) -> R<Log> {
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
    Ok(l)
}

/// A rule's `on IF`, `inet`/`inet6`, `proto` and `from ... to ...` (or `all`), in that order;
/// FreeBSD's `route-to`, `reply-to` or `dup-to` may stand after the interface.
fn on_af_proto_fromto(p: &mut P, t: &mut Template) -> R<()> {
    if p.eat("on") {
        t.ifs = p.list(|p| {
            let neg = p.eat_punct("!");
            // An empty name (`on ""`) names no interface and prints as `on all`.
            match p.string()? {
                n if !crate::lex::is_word(&n) => Err("syntax error".into()),
                name => Ok(Iface { neg, name }),
            }
        })?;
    }
    if t.r.xlate.is_none() && (p.is("route-to") || p.is("reply-to") || p.is("dup-to")) {
        let kind = match p.string()?.as_str() {
            "route-to" => RouteKind::RouteTo,
            "reply-to" => RouteKind::ReplyTo,
            _ => RouteKind::DupTo,
        };
        t.r.route = Some(Box::new((kind, route_pool(p)?)));
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
    if !p.eat("all") {
        if p.eat("from") {
            hostport(p, &mut t.src, &mut t.src_ports)?;
        }
        if p.eat("to") {
            hostport(p, &mut t.dst, &mut t.dst_ports)?;
        }
    }
    Ok(())
}

/// FreeBSD's translation rules: `[no] nat|rdr|binat [pass [log [(...)]]] [on IF] [af]
/// [proto P] [from ... to ... | all] [tag T] [[!] tagged T] -> POOL [port P[:Q|:*]] [pool
/// options]` (`no` without the arrow), and `nat-anchor|rdr-anchor|binat-anchor "name"` with
/// the same match (a named anchor, empty until loaded).
pub(super) fn xrule(p: &mut P, line: u32) -> R<Vec<Template>> {
    let no = p.eat("no");
    let word = p.string()?;
    let (kind, anchor) = match word.as_str() {
        "nat" => (XlateKind::Nat, false),
        "rdr" => (XlateKind::Rdr, false),
        "binat" => (XlateKind::Binat, false),
        "nat-anchor" if !no => (XlateKind::Nat, true),
        "rdr-anchor" if !no => (XlateKind::Rdr, true),
        "binat-anchor" if !no => (XlateKind::Binat, true),
        _ => return Err("syntax error".into()),
    };
    let mut r = rule_shell(Action::Pass, line);
    r.state = StateKind::No;
    let mut pass = false;
    if anchor {
        r.anchor = Some(p.name()?);
    } else if p.eat("pass") {
        if no {
            return Err("\"pass\" not valid with \"no\"".into());
        }
        pass = true;
        if p.eat("log") {
            r.log = Some(log_opts(p)?);
        }
    }
    r.xlate = Some(Xlate { kind, no, pass });
    let mut t = Template::new(r);
    on_af_proto_fromto(p, &mut t)?;
    if kind == XlateKind::Binat && !anchor && t.src.is_empty() {
        return Err("syntax error".into());
    }
    loop {
        if p.eat("tag") {
            t.r.tag = Some(p.name()?);
        } else if p.eat("tagged") {
            t.r.tagged = Some((false, p.name()?));
        } else if p.eat_punct("!") {
            if !p.eat("tagged") {
                return Err("syntax error".into());
            }
            t.r.tagged = Some((true, p.name()?));
        } else if p.eat("rtable") {
            let v = p.string()?;
            t.r.rtable = Some(v.parse().map_err(|_| format!("invalid rtable id {v}"))?);
        } else {
            break;
        }
    }
    if anchor {
        if p.punct("{") {
            return Err(unsupported(&format!("{word} {{ ... }}")));
        }
    } else if p.eat_punct("->") {
        if no {
            return Err("translation rule with 'no' does not need '->'".into());
        }
        let pl = pool(p, kind == XlateKind::Nat)?;
        match kind {
            XlateKind::Nat => t.r.nat = Some(Box::new(pl)),
            XlateKind::Rdr => t.r.rdr = Some(Box::new(pl)),
            XlateKind::Binat => {
                if pl.port.is_some() || pl.kind != PoolKind::None || pl.sticky || pl.endpoint_independent {
                    return Err("syntax error".into());
                }
                t.binat = Some(pl.clone());
                t.r.binat = Some(Box::new(pl));
            }
        }
    } else if !no {
        return Err("translation rule requires '-> address'".into());
    }
    if !p.done() {
        return Err("syntax error".into());
    }
    Ok(vec![t])
}

/// `antispoof [log] [quick] for IF [inet|inet6] [label]`: per interface, drop what comes in on
/// other interfaces from its networks, and for a non-loopback interface what claims one of its
/// own addresses (pfctl's expansion).
pub(super) fn antispoof(p: &mut P, line: u32) -> R<Vec<Template>> {
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
    let tmpl = |r: &Rule, ifs: Vec<Iface>, src: Vec<Host>| Template { ifs, src, ..Template::new(r.clone()) };
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
        // A group: its members' networks and addresses (pfctl's ifa_grouplookup), the rule
        // on the group.
        let each = crate::ifaddr::addresses_each(&name)
            .ok_or_else(|| format!("{BARE}no IP address found for {name}\ncould not parse host specification"))?;
        let fam =
            |v: Vec<Host>| -> Vec<Host> { v.into_iter().filter(|h| base.af == Af::Any || h.af() == base.af).collect() };
        let hosts = |m: Option<&str>| each.iter().flat_map(|a| interface_hosts(a, m, None, false)).collect::<Vec<_>>();
        let nets = fam(hosts(Some("network")));
        if !nets.is_empty() {
            out.push(tmpl(&base, on, nets));
        }
        // pfctl leaves out the second rule for a loopback interface only (a group has no
        // interface flags).
        if crate::ifaddr::is_loopback(&name) != Some(true) {
            let own = fam(hosts(None));
            if !own.is_empty() {
                out.push(tmpl(&base, vec![], own));
            }
        }
    }
    Ok(out)
}

/// A rule with pf's defaults for `action`, before its options are read.
pub(super) fn rule_shell(action: Action, line: u32) -> Rule {
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
        fragment: false,
        label: None,
        tag: None,
        tagged: None,
        state_opts: StateOptsBox::default(),
        user: None,
        group: None,
        nat: None,
        rdr: None,
        binat: None,
        scrub: None,
        probability: None,
        received_on: None,
        once: false,
        max_pkt_rate: None,
        anchor: None,
        xlate: None,
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
        file: "".into(),
    }
}

pub(super) fn block_return_spec(p: &mut P, r: &mut Rule) -> R<()> {
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

pub(super) fn filter_opts(p: &mut P, t: &mut Template) -> R<()> {
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
            t.r.route = Some(Box::new((kind, route_pool(p)?)));
        } else if p.is("nat-to") || p.is("rdr-to") || p.is("binat-to") {
            let which = p.string()?;
            let pool = pool(p, which == "nat-to")?;
            match which.as_str() {
                "nat-to" => t.r.nat = Some(Box::new(pool)),
                "rdr-to" => t.r.rdr = Some(Box::new(pool)),
                _ => t.r.binat = Some(Box::new(pool)),
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
                            t.r.set_queue = Some(Box::new((a, Some(b))));
                        } else {
                            t.r.set_queue = Some(Box::new((p.string()?, None)));
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
            t.r.af_to = Some(Box::new((af, from, to)));
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
        } else if p.eat("fragment") {
            t.r.fragment = true;
        } else if p.eat("label") {
            t.r.label = Some(p.name()?);
        } else if p.eat("tag") {
            t.r.tag = Some(p.name()?);
        } else if p.eat("tagged") {
            t.r.tagged = Some((false, p.name()?));
        } else if p.eat("once") {
            t.r.once = true;
        } else if p.eat("received-on") {
            t.r.received_on = Some(Box::new(received_on(p, false)?));
        } else if p.eat("max-pkt-rate") {
            let n = |p: &mut P| -> R<u32> { p.string()?.parse().map_err(|_| "syntax error".to_string()) };
            let a = n(p)?;
            p.expect_punct("/")?;
            let b = n(p)?;
            if a == 0 || b == 0 {
                return Err(format!("invalid max-pkt-rate {a}/{b}"));
            }
            t.r.max_pkt_rate = Some((a, b));
        } else if p.eat_punct("!") {
            if p.eat("received-on") {
                t.r.received_on = Some(Box::new(received_on(p, true)?));
                continue;
            }
            if !p.eat("tagged") {
                return Err("syntax error".into());
            }
            t.r.tagged = Some((true, p.name()?));
        } else if p.word() == Some("queue") {
            return Err(super::stmt::altq("queue"));
        } else if let Some(w) = p.word().filter(|w| UNSUPPORTED_OPTIONS.contains(w)) {
            return Err(unsupported(w));
        } else {
            return Err("syntax error".into());
        }
    }
    Ok(())
}

/// `received-on`'s interface: one name (pfctl takes no list or `any` there).
fn received_on(p: &mut P, neg: bool) -> R<Iface> {
    match p.string()? {
        n if !crate::lex::is_word(&n) || n.is_empty() => Err("syntax error".into()),
        name => Ok(Iface { neg, name }),
    }
}

pub(super) fn state_opts(p: &mut P, o: &mut StateOpts) -> R<()> {
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
            // Source limits need source tracking (pfctl): `max-src-states` alone tracks
            // globally (one node a source, shared by every rule that tracks globally) unless
            // told `rule`; the node, connection and connection-rate limits are a rule's own,
            // and refused with `source-track global`.
            let per_rule = [
                (o.max_src_nodes.is_some(), "max-src-nodes"),
                (o.max_src_conn.is_some(), "max-src-conn"),
                (o.max_src_conn_rate.is_some(), "max-src-conn-rate"),
            ];
            if explicit == Some(false) {
                if let Some((_, name)) = per_rule.iter().find(|(set, _)| *set) {
                    return Err(format!("'{name}' is incompatible with 'source-track global'"));
                }
            }
            if per_rule.iter().any(|(set, _)| *set) {
                o.source_track = Some(true);
            } else if o.max_src_states.is_some() && o.source_track.is_none() {
                o.source_track = Some(false);
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

/// A routing target: OpenBSD's pool of next hops, or FreeBSD's `(IF ADDR)` (the interface
/// to leave by and the next hop on it), with the pool's options after it.
fn route_pool(p: &mut P) -> R<Pool> {
    // `(IF ADDR)`, not an interface's addresses `(IF)` / `(IF:peer)`; or a list of them.
    let hop_at = |p: &P, n: usize| {
        matches!(p.peek_at(n), Tok::Punct("("))
            && matches!(p.peek_at(n + 1), Tok::Word(_))
            && !matches!(p.peek_at(n + 2), Tok::Punct(")"))
    };
    let list = p.punct("{") && hop_at(p, 1);
    if !list && !hop_at(p, 0) {
        return pool(p, false);
    }
    let hop = |p: &mut P| -> R<(String, Host)> {
        p.expect_punct("(")?;
        let ifname = p.string()?;
        if !crate::lex::is_word(&ifname) {
            return Err("syntax error".into());
        }
        let hs = hosts(p)?;
        p.expect_punct(")")?;
        match &hs[..] {
            [h] if !h.neg && matches!(h.kind, HostKind::Net(..)) => Ok((ifname, h.clone())),
            _ => Err("invalid host for route spec".into()),
        }
    };
    let hops = if list {
        p.expect_punct("{")?;
        let mut v = vec![hop(p)?];
        while !p.eat_punct("}") {
            p.eat_punct(",");
            v.push(hop(p)?);
        }
        let af = v[0].1.af();
        if v.iter().any(|(_, h)| h.af() != af) {
            return Err("all pool addresses must be in the same address family".into());
        }
        v
    } else {
        vec![hop(p)?]
    };
    let mut pl = pool_options(p, Pool::to(hops[0].1.clone()), false)?;
    // Several next hops take turns unless told (pfctl's default for a list).
    if hops.len() > 1 && pl.kind == PoolKind::None {
        pl.kind = PoolKind::RoundRobin;
    }
    pl.hops = hops;
    Ok(pl)
}

pub(super) fn pool(p: &mut P, nat: bool) -> R<Pool> {
    let hosts: Vec<Host> = p.list(hosts)?.into_iter().flatten().collect();
    if hosts.is_empty() {
        return Err("could not parse host specification".into());
    }
    // A target is an address, a network, an interface or a table: never negated, never
    // `no-route` or `urpf-failed` (pfctl's grammar has no place for them).
    if hosts.iter().any(|h| h.neg || matches!(h.kind, HostKind::NoRoute | HostKind::UrpfFailed)) {
        return Err("syntax error".into());
    }
    let mut pl = Pool::to(hosts[0].clone());
    if hosts.len() > 1 {
        pl.list = Some(hosts);
    }
    pool_options(p, pl, nat)
}

/// A pool's `port` and options after its targets.
fn pool_options(p: &mut P, mut pl: Pool, nat: bool) -> R<Pool> {
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
        } else if p.eat("least-states") {
            pl.kind = PoolKind::LeastStates;
        } else if p.eat("source-hash") {
            // The key: 0x and 32 hex digits, or a string whose MD5 is the key (pfctl's way);
            // none, a random one drawn here, as pfctl draws it: it stays the rule's until the
            // next load (a recompile for an address or route change keeps each source's
            // address) and prints as the key in use.
            let key = match p.peek().clone() {
                Tok::Word(w) if w.starts_with("0x") => {
                    p.next();
                    if w.len() != 34 || !w[2..].bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err("hash key must be 128 bits, in hex".into());
                    }
                    Some(w.to_ascii_lowercase())
                }
                Tok::Word(w) | Tok::Str(w)
                    if !["sticky-address", "static-port", "port", "endpoint-independent", "map-e-portset"]
                        .contains(&w.as_str()) =>
                {
                    p.next();
                    use md5::Digest;
                    let d = md5::Md5::digest(w.as_bytes());
                    Some(hex_key(&d))
                }
                _ => Some(hex_key(&xpf_state::os_random::<16>())),
            };
            pl.kind = PoolKind::SourceHash(key);
        } else if p.eat("sticky-address") {
            pl.sticky = true;
        } else if nat && p.eat("static-port") {
            pl.static_port = true;
        } else if nat && p.eat("endpoint-independent") {
            pl.endpoint_independent = true;
        } else if nat && p.eat("map-e-portset") {
            pl.mape = Some(portset(p)?);
        } else {
            if pl.mape.is_some() && (pl.port.is_some() || pl.static_port) {
                // The set is the ports: a range or static-port beside it would not be held.
                return Err("map-e-portset with a port range or static-port".into());
            }
            return Ok(finish(pl));
        }
    }
}

/// `map-e-portset OFFSET/LEN/PSID` (FreeBSD): numbers in decimal or 0x hex, OFFSET at least
/// 1 (the ports whose OFFSET high bits are all zero are not the set's), LEN at least 1,
/// together at most 16, PSID below 2^LEN.
fn portset(p: &mut P) -> R<(u8, u8, u16)> {
    // The lexer makes `/` a mark of its own: three words between two of them.
    let mut w = p.string()?;
    for _ in 0..2 {
        if !p.eat_punct("/") {
            return Err(format!("map-e-portset {w}: OFFSET/LEN/PSID"));
        }
        w.push('/');
        w.push_str(&p.string()?);
    }
    let num = |v: &str| match v.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => v.parse::<u32>().ok(),
    };
    let parts: Vec<Option<u32>> = w.split('/').map(num).collect();
    let [Some(offset), Some(len), Some(psid)] = parts[..] else {
        return Err(format!("map-e-portset {w}: OFFSET/LEN/PSID"));
    };
    if offset == 0 || len == 0 || offset + len > 16 {
        return Err(format!(
            "map-e-portset {w}: the offset and the psid length are at least 1 and at most 16 together"
        ));
    }
    if psid >= 1 << len {
        return Err(format!("map-e-portset {w}: psid {psid} does not fit in {len} bits"));
    }
    Ok((offset as u8, len as u8, psid as u16))
}

pub(super) fn hostport(p: &mut P, out: &mut Vec<Host>, ports: &mut Vec<PortOp>) -> R<()> {
    if !p.is("port") {
        *out = p.list(hosts)?.into_iter().flatten().collect();
    }
    if p.eat("port") {
        *ports = p.list(port)?;
    }
    Ok(())
}
