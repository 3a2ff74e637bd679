//! Names pf.conf accepts for numbers, as OpenBSD's /etc/protocols, /etc/services and pfctl's
//! ICMP tables give them. Built in, so that the printed form does not depend on the host (a
//! service name the built-in list lacks is looked up in the host's /etc/services).

/// (name, number), the first name of each number being the one pfctl prints.
pub const PROTOCOLS: &[(&str, u8)] = &[
    ("ip", 0),
    ("icmp", 1),
    ("igmp", 2),
    ("ggp", 3),
    ("ipencap", 4),
    ("st", 5),
    ("tcp", 6),
    ("egp", 8),
    ("igp", 9),
    ("pup", 12),
    ("udp", 17),
    ("hmp", 20),
    ("xns-idp", 22),
    ("rdp", 27),
    ("iso-tp4", 29),
    ("xtp", 36),
    ("ddp", 37),
    ("idpr-cmtp", 38),
    ("ipv6", 41),
    ("ipv6-route", 43),
    ("ipv6-frag", 44),
    ("idrp", 45),
    ("rsvp", 46),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("skip", 57),
    ("ipv6-icmp", 58),
    ("ipv6-nonxt", 59),
    ("ipv6-opts", 60),
    ("rspf", 73),
    ("vmtp", 81),
    ("eigrp", 88),
    ("ospf", 89),
    ("ax.25", 93),
    ("ipip", 94),
    ("etherip", 97),
    ("encap", 98),
    ("pim", 103),
    ("ipcomp", 108),
    ("vrrp", 112),
    ("carp", 112),
    ("l2tp", 115),
    ("isis", 124),
    ("sctp", 132),
    ("fc", 133),
    ("mpls-in-ip", 137),
    ("wesp", 141),
    ("pfsync", 240),
    ("icmp6", 58),
];

pub fn proto_number(name: &str) -> Option<u8> {
    if let Ok(n) = name.parse::<u16>() {
        return u8::try_from(n).ok();
    }
    PROTOCOLS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|p| p.1)
}

pub fn proto_name(n: u8) -> Option<&'static str> {
    PROTOCOLS.iter().find(|p| p.1 == n).map(|p| p.0)
}

/// The usual service names (OpenBSD /etc/services); numbers are printed.
pub const SERVICES: &[(&str, u16)] = &[
    ("tcpmux", 1),
    ("echo", 7),
    ("discard", 9),
    ("daytime", 13),
    ("ftp-data", 20),
    ("ftp", 21),
    ("ssh", 22),
    ("telnet", 23),
    ("smtp", 25),
    ("time", 37),
    ("domain", 53),
    ("bootps", 67),
    ("bootpc", 68),
    ("tftp", 69),
    ("gopher", 70),
    ("finger", 79),
    ("www", 80),
    ("http", 80),
    ("kerberos", 88),
    ("pop3", 110),
    ("sunrpc", 111),
    ("auth", 113),
    ("ident", 113),
    ("nntp", 119),
    ("ntp", 123),
    ("netbios-ns", 137),
    ("netbios-dgm", 138),
    ("netbios-ssn", 139),
    ("imap", 143),
    ("snmp", 161),
    ("snmptrap", 162),
    ("bgp", 179),
    ("ldap", 389),
    ("https", 443),
    ("microsoft-ds", 445),
    ("isakmp", 500),
    ("syslog", 514),
    ("submission", 587),
    ("ldaps", 636),
    ("imaps", 993),
    ("pop3s", 995),
    ("openvpn", 1194),
    ("ms-sql-s", 1433),
    ("radius", 1812),
    ("nfsd", 2049),
    ("mysql", 3306),
    ("rdp", 3389),
    ("sip", 5060),
    ("postgresql", 5432),
    ("x11", 6000),
    // OpenBSD's spamd(8) and its configuration port (Debian's services file names
    // SpamAssassin's 783 `spamd`; a pf ruleset means OpenBSD's).
    ("spamd", 8025),
    ("spamd-cfg", 8026),
];

/// A port by number or name: the built-in names first (so that a ruleset reads the same on any
/// host, as the regress suite expects), then the host's /etc/services as pfctl reads it
/// (`getservbyname` for tcp, then for udp): `mdns` or `privoxy` load where the host names them.
pub fn port_number(name: &str) -> Option<u16> {
    if let Ok(n) = name.parse::<u32>() {
        return u16::try_from(n).ok();
    }
    if let Some(p) = SERVICES.iter().find(|(n, _)| *n == name) {
        return Some(p.1);
    }
    host_service(name)
}

/// `name` in the host's /etc/services, read again when the file changes (a reload after an
/// edit sees the edit, as a new pfctl would).
fn host_service(name: &str) -> Option<u16> {
    type Cache = Option<(Option<std::time::SystemTime>, std::collections::HashMap<String, u16>)>;
    static HOST: std::sync::Mutex<Cache> = std::sync::Mutex::new(None);
    const PATH: &str = "/etc/services";
    let mtime = std::fs::metadata(PATH).and_then(|m| m.modified()).ok();
    let mut c = HOST.lock().unwrap_or_else(|e| e.into_inner());
    if c.as_ref().is_none_or(|(t, _)| *t != mtime) {
        *c = Some((mtime, std::fs::read_to_string(PATH).map(|t| services(&t)).unwrap_or_default()));
    }
    c.as_ref().and_then(|(_, m)| m.get(name).copied())
}

/// Names and aliases of a services(5) file to their ports: a name's first tcp entry, else its
/// first udp one (the order of pfctl's lookups).
fn services(text: &str) -> std::collections::HashMap<String, u16> {
    let mut m: std::collections::HashMap<String, (u16, bool)> = std::collections::HashMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut f = line.split_whitespace();
        let (Some(name), Some(pp)) = (f.next(), f.next()) else { continue };
        let Some((port, proto)) = pp.split_once('/') else { continue };
        let (Ok(port), tcp) = (port.parse::<u16>(), proto == "tcp") else { continue };
        if !tcp && proto != "udp" {
            continue;
        }
        for n in std::iter::once(name).chain(f) {
            match m.get(n) {
                Some(&(_, true)) => {}
                Some(&(_, false)) if !tcp => {}
                _ => {
                    m.insert(n.to_string(), (port, tcp));
                }
            }
        }
    }
    m.into_iter().map(|(n, (p, _))| (n, p)).collect()
}

/// ICMP types (pfctl's icmp_type table).
pub const ICMP_TYPES: &[(&str, u8)] = &[
    ("echorep", 0),
    ("unreach", 3),
    ("squench", 4),
    ("redir", 5),
    ("althost", 6),
    ("echoreq", 8),
    ("routeradv", 9),
    ("routersol", 10),
    ("timex", 11),
    ("paramprob", 12),
    ("timereq", 13),
    ("timerep", 14),
    ("inforeq", 15),
    ("inforep", 16),
    ("maskreq", 17),
    ("maskrep", 18),
    ("trace", 30),
    ("dataconv", 31),
    ("mobredir", 32),
    ("ipv6-where", 33),
    ("ipv6-here", 34),
    ("mobregreq", 35),
    ("mobregrep", 36),
    ("skip", 39),
    ("photuris", 40),
];

pub const ICMP6_TYPES: &[(&str, u8)] = &[
    ("unreach", 1),
    ("toobig", 2),
    ("timex", 3),
    ("paramprob", 4),
    ("echoreq", 128),
    ("echorep", 129),
    ("groupqry", 130),
    ("listqry", 130),
    ("grouprep", 131),
    ("listenrep", 131),
    ("groupterm", 132),
    ("listendone", 132),
    ("routersol", 133),
    ("routeradv", 134),
    ("neighbrsol", 135),
    ("neighbradv", 136),
    ("redir", 137),
    ("routrrenum", 138),
    ("wrureq", 139),
    ("wrurep", 140),
    ("fqdnreq", 139),
    ("niqry", 139),
    ("fqdnrep", 140),
    ("nirep", 140),
    ("mtraceresp", 200),
    ("mtrace", 201),
];

/// ICMP codes: (name, type, code).
pub const ICMP_CODES: &[(&str, u8, u8)] = &[
    ("net-unr", 3, 0),
    ("host-unr", 3, 1),
    ("proto-unr", 3, 2),
    ("port-unr", 3, 3),
    ("needfrag", 3, 4),
    ("srcfail", 3, 5),
    ("net-unk", 3, 6),
    ("host-unk", 3, 7),
    ("isolate", 3, 8),
    ("net-prohib", 3, 9),
    ("host-prohib", 3, 10),
    ("net-tos", 3, 11),
    ("host-tos", 3, 12),
    ("filter-prohib", 3, 13),
    ("host-preced", 3, 14),
    ("cutoff-preced", 3, 15),
    ("redir-net", 5, 0),
    ("redir-host", 5, 1),
    ("redir-tos-net", 5, 2),
    ("redir-tos-host", 5, 3),
    ("normal-adv", 9, 0),
    ("common-adv", 9, 16),
    ("transit", 11, 0),
    ("reassemb", 11, 1),
    ("badhead", 12, 0),
    ("optmiss", 12, 1),
    ("badlen", 12, 2),
    ("unknown-ind", 40, 1),
    ("auth-fail", 40, 2),
    ("decrypt-fail", 40, 3),
];

pub const ICMP6_CODES: &[(&str, u8, u8)] = &[
    ("admin-unr", 1, 1),
    ("noroute-unr", 1, 0),
    ("beyond-unr", 1, 2),
    ("addr-unr", 1, 3),
    ("port-unr", 1, 4),
    ("transit", 3, 0),
    ("reassemb", 3, 1),
    ("badhead", 4, 0),
    ("nxthdr", 4, 1),
    ("redironlink", 137, 0),
    ("redirrouter", 137, 1),
];

pub fn icmp_type(name: &str, v6: bool) -> Option<u8> {
    if let Ok(n) = name.parse::<u8>() {
        return Some(n);
    }
    let t = if v6 { ICMP6_TYPES } else { ICMP_TYPES };
    t.iter().find(|(n, _)| *n == name).map(|p| p.1)
}

pub fn icmp_type_name(t: u8, v6: bool) -> Option<&'static str> {
    let tbl = if v6 { ICMP6_TYPES } else { ICMP_TYPES };
    tbl.iter().find(|p| p.1 == t).map(|p| p.0)
}

/// A code by name for type `t` (any type when None), or a number.
pub fn icmp_code(name: &str, v6: bool) -> Option<(Option<u8>, u8)> {
    if let Ok(n) = name.parse::<u8>() {
        return Some((None, n));
    }
    let c = if v6 { ICMP6_CODES } else { ICMP_CODES };
    c.iter().find(|(n, _, _)| *n == name).map(|p| (Some(p.1), p.2))
}

pub fn icmp_code_name(t: u8, code: u8, v6: bool) -> Option<&'static str> {
    let c = if v6 { ICMP6_CODES } else { ICMP_CODES };
    c.iter().find(|p| p.1 == t && p.2 == code).map(|p| p.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_services_file_reads_as_getservbyname_answers() {
        let m = services(
            "# comment\nmdns\t\t5353/udp\t\t\t# Multicast DNS\nfoo 7000/udp bar\nfoo 7001/tcp\nfoo 7002/tcp\n\
             sctp-only 9/sctp\nbad x/tcp\nprivoxy 8118/tcp\n",
        );
        assert_eq!(m.get("mdns"), Some(&5353));
        // tcp before udp, whatever the order of the lines; the first tcp line wins.
        assert_eq!(m.get("foo"), Some(&7001));
        assert_eq!(m.get("bar"), Some(&7000));
        assert_eq!(m.get("privoxy"), Some(&8118));
        assert_eq!(m.get("sctp-only"), None);
        assert_eq!(m.get("bad"), None);
        // The built-in names come first.
        assert_eq!(port_number("www"), Some(80));
        assert_eq!(port_number("spamd"), Some(8025));
        assert_eq!(port_number("70000"), None);
    }
}
