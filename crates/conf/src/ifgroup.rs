//! Interface groups: pf's names for sets of interfaces, wherever pf.conf takes an interface
//! (`on egress`, `received-on`, `set skip on`, `set loginterface`, `antispoof for`, `egress:network`,
//! `(egress)`, `nat-to (egress:0)`), as Linux has them:
//! - `egress`: the interfaces the default routes (IPv4 and IPv6, every next hop of a
//!   multipath one) of the main table lead out of, as OpenBSD's `egress` group holds the
//!   interfaces of its default routes. With no default route it has no member.
//! - a link group (`ip link set eth1 group lan`, Linux's counterpart of OpenBSD's `ifconfig
//!   em1 group lan`): its name from iproute2's group file (`/etc/iproute2/group`, else
//!   `/usr/share/iproute2/group`), its members the links of that number.
//!
//! An interface of the name comes before a group of the name (OpenBSD's group names cannot
//! end in a digit, so there they never meet). Read with one RTM_GETLINK and one RTM_GETROUTE
//! dump, in the namespace the caller runs in. A name that is neither an interface nor a group
//! (a tunnel not up yet) stands for no interface until one of that name appears, as pf keeps
//! rules on an absent interface. xpfd compiles the ruleset again when what a name it uses
//! stands for changes, as it does when addresses change.

use std::io;

/// The links and what groups them, at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Links {
    /// (index, name, link group number).
    pub links: Vec<(u32, String, u32)>,
    /// The interfaces (indexes) the default routes lead out of, sorted.
    pub egress: Vec<u32>,
    /// iproute2's group names: (number, name).
    pub names: Vec<(u32, String)>,
}

const IFLA_IFNAME: u16 = 3;
const IFLA_GROUP: u16 = 27;

/// One RTM_NEWLINK message (after its nlmsghdr): (index, name, group).
fn link_of(m: &[u8]) -> Option<(u32, String, u32)> {
    // struct ifinfomsg: family u8, pad u8, type u16, index i32, flags u32, change u32.
    if m.len() < 16 {
        return None;
    }
    let index = u32::from_ne_bytes(m[4..8].try_into().ok()?);
    let (mut name, mut group) = (None, 0);
    for (ty, v) in xpf_wire::nlattr::attrs(&m[16..]) {
        match ty {
            IFLA_IFNAME => name = Some(String::from_utf8_lossy(v.split(|&b| b == 0).next()?).into_owned()),
            IFLA_GROUP if v.len() == 4 => group = u32::from_ne_bytes(v.try_into().ok()?),
            _ => {}
        }
    }
    Some((index, name?, group))
}

/// iproute2's group file: `number name` lines, `#` comments.
fn group_names(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split('#').next()?.split_whitespace();
            let n = w.next()?;
            let n = match n.strip_prefix("0x") {
                Some(h) => u32::from_str_radix(h, 16).ok()?,
                None => n.parse().ok()?,
            };
            Some((n, w.next()?.to_string()))
        })
        .collect()
}

impl Links {
    /// The links, default routes and group names now.
    pub fn now() -> io::Result<Links> {
        let mut links: Vec<(u32, String, u32)> =
            crate::routes::dump(libc::RTM_GETLINK, 16)?.iter().filter_map(|m| link_of(m)).collect();
        links.sort();
        let fib = crate::routes::Fib::kernel()?;
        let mut egress: Vec<u32> =
            fib.routes.iter().filter(|r| r.len == 0 && !r.reject).flat_map(|r| r.oifs.iter().copied()).collect();
        egress.sort_unstable();
        egress.dedup();
        let text = ["/etc/iproute2/group", "/usr/share/iproute2/group"]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        Ok(Links { links, egress, names: group_names(&text) })
    }

    /// Whether `name` is a group here: `egress`, or a link group's name, and no interface.
    pub fn is_group(&self, name: &str) -> bool {
        !self.links.iter().any(|l| l.1 == name) && (name == "egress" || self.names.iter().any(|g| g.1 == name))
    }

    /// The interfaces `name` stands for: the interface of that name, else a group's members
    /// (perhaps none); None when it is neither.
    pub fn interfaces(&self, name: &str) -> Option<Vec<String>> {
        if self.links.iter().any(|l| l.1 == name) {
            return Some(vec![name.to_string()]);
        }
        if name == "egress" {
            return Some(
                self.links.iter().filter(|l| self.egress.binary_search(&l.0).is_ok()).map(|l| l.1.clone()).collect(),
            );
        }
        let g = self.names.iter().find(|g| g.1 == name)?.0;
        Some(self.links.iter().filter(|l| l.2 == g).map(|l| l.1.clone()).collect())
    }

    /// The members of group `name` here; None when `name` is an interface or no group.
    pub fn members(&self, name: &str) -> Option<Vec<String>> {
        self.is_group(name).then(|| self.interfaces(name)).flatten()
    }

    /// What `names` stand for here (the indexes of each one's interfaces), hashed: it changes
    /// when an interface a name stands for appears, goes or comes back with another index, or
    /// a group gains or loses a member, and not when other links come and go.
    pub fn resolution<'a>(&self, names: impl Iterator<Item = &'a str>) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut names: Vec<&str> = names.collect();
        names.sort_unstable();
        names.dedup();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for n in names {
            n.hash(&mut h);
            let members = self.interfaces(n).unwrap_or_default();
            for m in members {
                self.links.iter().find(|l| l.1 == m).map(|l| l.0).hash(&mut h);
            }
            0xffu8.hash(&mut h);
        }
        h.finish()
    }
}

/// Warnings for the rules of `p` on an interface or group that stands for no interface in
/// `links` now: an interface the machine lacks (a tunnel not up yet), or a group without
/// members (`egress` without a default route). Such a rule sees no packet on it until the
/// interface appears or joins (`! on` sees every packet); pfctl loads the first silently and
/// refuses the second. One line a name, at its first use: `FILE:LINE: warning: ...`.
pub fn interface_warnings(p: &crate::Parsed, links: &Links) -> Vec<String> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for r in p.rules.iter().chain(&p.xrules) {
        for i in r.on.iter().chain(r.received_on.as_deref()) {
            let n = i.name.as_str();
            if n == "any" || seen.contains(&n) || links.interfaces(n).is_some_and(|m| !m.is_empty()) {
                continue;
            }
            seen.push(n);
            let (f, l) = (&r.file, r.line);
            out.push(if !links.is_group(n) {
                format!("{f}:{l}: warning: no interface {n} here now: its rules wait for it (compiled again when it appears)")
            } else {
                let why = if n == "egress" { " (no default route)" } else { "" };
                format!("{f}:{l}: warning: interface group {n} has no member now{why}: its rules match no packet until an interface joins it")
            });
        }
    }
    out
}

/// The members of group `name` now; None when `name` is an interface or no group (or the links
/// cannot be read).
pub fn members(name: &str) -> Option<Vec<String>> {
    Links::now().ok()?.members(name)
}

/// The interfaces `name` stands for now (see [`Links::interfaces`]); None also when the links
/// cannot be read.
pub fn interfaces(name: &str) -> Option<Vec<String>> {
    Links::now().ok()?.interfaces(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab() -> Links {
        Links {
            links: vec![(1, "lo".into(), 0), (2, "wan0".into(), 0), (3, "lan0".into(), 10), (4, "lan1".into(), 10)],
            egress: vec![2],
            names: group_names("# comment\n0\tdefault\n10 lan # inside\n0x20 dmz\nbad line\n"),
        }
    }

    #[test]
    fn a_name_is_an_interface_before_a_group() {
        let l = lab();
        assert_eq!(l.interfaces("egress"), Some(vec!["wan0".to_string()]));
        assert_eq!(l.interfaces("lan"), Some(vec!["lan0".to_string(), "lan1".to_string()]));
        assert_eq!(l.interfaces("dmz"), Some(vec![]), "a named group without members exists, empty");
        assert_eq!(l.interfaces("lan0"), Some(vec!["lan0".to_string()]));
        assert_eq!(l.interfaces("nonesuch"), None);
        assert!(l.is_group("egress") && l.is_group("lan") && !l.is_group("lan0") && !l.is_group("nonesuch"));
        // An interface named like a group is the interface.
        let mut m = lab();
        m.links.push((5, "lan".into(), 0));
        assert_eq!(m.interfaces("lan"), Some(vec!["lan".to_string()]));
        assert!(!m.is_group("lan"));
        // Without a default route, egress has no member.
        m.egress.clear();
        assert_eq!(m.interfaces("egress"), Some(vec![]));
    }

    #[test]
    fn a_rule_on_nothing_present_is_said_once() {
        let p = crate::parse(
            "pass in on egress\nblock out on egress\npass on lan\npass on wan0\npass on tun0\npass on ! tun0\n",
            "f.conf",
            &[],
        );
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(
            interface_warnings(&p, &lab()),
            vec![
                "f.conf:5: warning: no interface tun0 here now: its rules wait for it (compiled again when it appears)"
            ]
        );
        let mut l = lab();
        l.egress.clear();
        l.links.push((9, "tun0".into(), 0));
        assert_eq!(
            interface_warnings(&p, &l),
            vec!["f.conf:1: warning: interface group egress has no member now (no default route): its rules match no packet until an interface joins it"]
        );
    }

    #[test]
    fn the_resolution_changes_with_what_the_names_stand_for() {
        let names = ["egress", "tun0", "lan0"];
        let base = lab().resolution(names.into_iter());
        let mut l = lab();
        l.links.push((12, "other0".into(), 0));
        assert_eq!(l.resolution(names.into_iter()), base, "another link came: nothing named changed");
        l.links.push((13, "tun0".into(), 0));
        let up = l.resolution(names.into_iter());
        assert_ne!(up, base, "tun0 appeared");
        l.links.retain(|x| x.1 != "tun0");
        l.links.push((14, "tun0".into(), 0));
        assert_ne!(l.resolution(names.into_iter()), up, "tun0 came back with another index");
        let mut m = lab();
        m.egress = vec![3];
        assert_ne!(m.resolution(names.into_iter()), base, "egress moved");
        m.links[2].2 = 0;
        assert_eq!(
            m.resolution(["lan0"].into_iter()),
            lab().resolution(["lan0"].into_iter()),
            "lan0's group is not named"
        );
    }

    #[test]
    fn the_kernels_links_are_read() {
        let l = Links::now().expect("link dump");
        assert!(l.links.iter().any(|x| x.1 == "lo"), "{l:?}");
        assert_eq!(l.interfaces("lo"), Some(vec!["lo".to_string()]));
        // egress is the interfaces of the default routes this namespace has.
        let fib = crate::routes::Fib::kernel().unwrap();
        let has_default = fib.routes.iter().any(|r| r.len == 0 && !r.reject && !r.oifs.is_empty());
        assert_eq!(l.interfaces("egress").is_some_and(|v| !v.is_empty()), has_default);
    }
}
