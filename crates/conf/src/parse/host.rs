//! Hosts, addresses, interfaces and the operands of ports, users and groups.

use super::*;

/// A host, or the several addresses a name stands for (`localhost`: 127.0.0.1 and ::1, as
/// the resolver gives them).
pub(super) fn hosts(p: &mut P) -> R<Vec<Host>> {
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
    if p.punct("!") && matches!(p.peek_at(1), Tok::Word(w) if w == "localhost") {
        p.next();
        let mut v = hosts(p)?;
        for h in &mut v {
            h.neg = true;
        }
        return Ok(v);
    }
    // An interface name: its addresses now (pfctl resolves them when it reads the file).
    if let Tok::Word(w) = p.peek_at(p.punct("!") as usize) {
        if !["any", "self", "no-route", "urpf-failed", "route"].contains(&w.as_str())
            && w.parse::<IpAddr>().is_err()
            && parse_addr(w).is_none()
        {
            let (name, modifier) = match w.split_once(':') {
                Some((a, b)) => (a.to_string(), Some(b.to_string())),
                None => (w.clone(), None),
            };
            // A group stands for its members, each taken as an interface (pfctl's
            // ifa_grouplookup).
            if let Some(each) = crate::ifaddr::addresses_each(&name) {
                let neg = p.eat_punct("!");
                p.next();
                let prefix = if p.eat_punct("/") {
                    Some(p.string()?.parse::<u8>().map_err(|_| "syntax error".to_string())?)
                } else {
                    None
                };
                return Ok(each.iter().flat_map(|a| interface_hosts(a, modifier.as_deref(), prefix, neg)).collect());
            }
        }
    }
    Ok(vec![host(p)?])
}

/// The hosts an interface stands for: every address (or `:network`, `:broadcast`, `:peer`,
/// `:0` for the first of each family), with an optional mask applied.
pub(super) fn interface_hosts(
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

pub(super) fn host(p: &mut P) -> R<Host> {
    if let Tok::Word(w) = p.peek() {
        if let Some((a, scope)) = w.split_once('%') {
            if a.contains(':') {
                p.scope = Some(scope.to_string());
            }
        }
    }
    let neg = p.eat_punct("!");
    let kind = if p.eat_punct("<") {
        let n = super::stmt::table_name(p.string()?)?;
        p.expect_punct(">")?;
        HostKind::Table(n)
    } else if p.eat_punct("(") {
        let s = p.string()?;
        p.expect_punct(")")?;
        // A name printed bare must read back as itself (found by the pfconf fuzz target:
        // `( . )` printed as `(.)`).
        if s.starts_with(|c: char| c.is_ascii_digit()) || s.contains("::") || !crate::lex::is_word(&s) {
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
            "route" if matches!(p.peek(), Tok::Str(_)) => HostKind::RouteLabel(p.string()?),
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

pub(super) fn parse_addr(s: &str) -> Option<(IpAddr, Option<u8>)> {
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
    // (Asked of every host word that is no full address, `any` among them: no allocation.)
    let mut b = [0u8; 4];
    let mut n = 0;
    for x in s.split('.') {
        if n == 3 || x.is_empty() || x.len() > 3 || !x.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        b[n] = x.parse().ok()?;
        n += 1;
    }
    Some((IpAddr::from(b), Some((n * 8) as u8)))
}

pub(super) fn mask(a: IpAddr, len: u8) -> IpAddr {
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

/// A user or group operand: a number or a name (this machine's, as pf's `user` matches local
/// sockets), with the port operators.
pub(super) fn id_op(p: &mut P, group: bool) -> R<PortOp> {
    let id = |s: &str| -> R<u16> {
        if let Ok(n) = s.parse::<u32>() {
            return u16::try_from(n).map_err(|_| format!("illegal {} value {n}", if group { "gid" } else { "uid" }));
        }
        let c = std::ffi::CString::new(s).map_err(|_| "syntax error".to_string())?;
        account_id(&c, group)
            .and_then(|x| u16::try_from(x).ok())
            .ok_or_else(|| format!("unknown {} {s}", if group { "group" } else { "user" }))
    };
    op_spec(p, &id, false)
}

/// The id of user (or group) `name` in this machine's databases. The reentrant lookups, each
/// into a buffer of its own: a file parsed in pieces looks names up from several threads, and
/// getpwnam's and getgrnam's one shared buffer gave one thread's answer to another.
fn account_id(name: &std::ffi::CStr, group: bool) -> Option<u32> {
    let mut buf = vec![0 as libc::c_char; 4096];
    loop {
        // SAFETY: name is a valid C string; the record and the buffer its strings point into
        // live through the call, and only its id is read, after it returned its record.
        let rc = unsafe {
            if group {
                let mut g: libc::group = std::mem::zeroed();
                let mut out = std::ptr::null_mut();
                let rc = libc::getgrnam_r(name.as_ptr(), &mut g, buf.as_mut_ptr(), buf.len(), &mut out);
                if rc == 0 {
                    return (!out.is_null()).then_some(g.gr_gid);
                }
                rc
            } else {
                let mut u: libc::passwd = std::mem::zeroed();
                let mut out = std::ptr::null_mut();
                let rc = libc::getpwnam_r(name.as_ptr(), &mut u, buf.as_mut_ptr(), buf.len(), &mut out);
                if rc == 0 {
                    return (!out.is_null()).then_some(u.pw_uid);
                }
                rc
            }
        };
        // A record larger than the buffer: again with twice the room, up to 1 MiB.
        if rc != libc::ERANGE || buf.len() >= 1 << 20 {
            return None;
        }
        buf.resize(buf.len() * 2, 0);
    }
}

pub(super) fn port_num(s: &str) -> R<u16> {
    if let Some(h) = s.strip_prefix("0x") {
        let n = u64::from_str_radix(h, 16).map_err(|_| format!("unknown port {s}"))?;
        return u16::try_from(n).map_err(|_| format!("illegal port value {n}"));
    }
    if let Ok(n) = s.parse::<u64>() {
        return u16::try_from(n).map_err(|_| format!("illegal port value {n}"));
    }
    names::port_number(s).ok_or_else(|| format!("unknown port {s}"))
}

pub(super) fn port(p: &mut P) -> R<PortOp> {
    op_spec(p, &port_num, true)
}

/// An operator and operand(s), for ports, users and groups: `= n`, `!= n`, `< n`, `<= n`,
/// `> n`, `>= n`, `a >< b`, `a <> b`, a bare `n`, and for ports `a:b`.
pub(super) fn op_spec(p: &mut P, val: &dyn Fn(&str) -> R<u16>, colon_range: bool) -> R<PortOp> {
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

pub(super) fn flag_bits(s: &str) -> R<u8> {
    let mut b = 0u8;
    for c in s.chars() {
        let i = FLAG_CHARS.find(c).ok_or_else(|| "syntax error".to_string())?;
        b |= 1 << i;
    }
    Ok(b)
}
