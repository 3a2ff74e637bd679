//! xpfctl, pfctl for xpf. `-n -f FILE` checks a pf.conf without a daemon and, with `-v`,
//! prints it in pfctl's canonical form (`-f -` reads stdin, `-D name=value` defines a macro,
//! `-o none` is accepted: xpf has no optimizer to turn off). `-f FILE` loads it into xpfd
//! (atomically: a bad file changes nothing); `-s`, `-k`, `-F`, `-t ... -T` talk to xpfd over its
//! control socket (/run/xpfd.sock, `--socket` or XPFD_SOCKET), `--json` prints the answer's data.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

/// Where xpfd listens unless told otherwise (xpfd --socket, XPFD_SOCKET or --socket here).
const SOCKET: &str = "/run/xpfd.sock";

const USAGE: &str = "usage: xpfctl [-nv] [-D macro=value] [-o level] -f FILE      check (-n) or load a pf.conf (-f - : stdin)\n       \
                     xpfctl [-v[v]] -s info|states|Sources|memory|rules|nat|labels|queue|timeouts|Tables|Interfaces|Anchors|all\n       \
                     xpfctl -a ANCHOR [-n] -f FILE | -F rules | [-v] -s rules   an anchor's rules: load, flush, show ('*': all)\n       \
                     xpfctl -e | -d                              enable (filter) or disable (pass everything unfiltered)\n       \
                     xpfctl -z                                   zero the rules' evaluations\n       \
                     xpfctl -x level                             xpfd's log level: emerg .. err, warning, notice, info, debug\n       \
                     xpfctl -k host [-k host] | -k label NAME    kill states\n       \
                     xpfctl -K host [-K host]                    kill the source nodes (-s Sources) of a host or network (a second: of sticky-address to it)\n       \
                     xpfctl -F states|Sources|rules|all\n       \
                     xpfctl -t table -T show|add|delete|replace|test|flush|zero|expire [address ...]\n       \
                     xpfctl --steer on|off|bare                  forwarding by xpfd, the kernel, or XDP unfiltered\n       \
                     xpfctl log [-i pflogN]                      pflog live, as pcap: | tcpdump -n -e -r -\n       \
                     xpfctl sync-decode FILE.pcap                pfsync frames of a capture, decoded\n       \
                     xpfctl --version                            this build's version and commit\n\
                     options: --json (the answer's data as JSON), --socket PATH (xpfd's control socket; XPFD_SOCKET, /run/xpfd.sock)";

#[derive(Debug, Default)]
struct Opts {
    file: Option<String>,
    noaction: bool,
    verbose: u8,
    defines: Vec<(String, String)>,
    show: Option<String>,
    kill: Vec<String>,
    /// `-K host [-K host]`: source nodes to kill (the second: a sticky source's address).
    kill_src: Vec<String>,
    label: Option<String>,
    flush: Option<String>,
    table: Option<String>,
    table_cmd: Option<String>,
    /// Addresses after `-T add|delete|replace|test`.
    rest: Vec<String>,
    json: bool,
    /// `-x level`.
    debug: Option<String>,
    socket: Option<String>,
    /// `--steer off|on|bare`: hand forwarding to the kernel (unfiltered) and back; `bare`
    /// forwards everything in XDP, unfiltered. The lab's switches.
    steer: Option<(bool, bool)>,
    /// `-z`: zero the rules' evaluations.
    zero: bool,
    /// `-a ANCHOR`: -f, -F rules and -s rules act on that anchor.
    anchor: Option<String>,
    /// `-e`, `-d`: pf enabled (filtering) or disabled (every packet passes unfiltered).
    enable: bool,
    disable: bool,
}

impl Opts {
    /// Whether it asks xpfd for something besides a load, -e and -d.
    fn acts(&self) -> bool {
        self.show.is_some()
            || !self.kill.is_empty()
            || !self.kill_src.is_empty()
            || self.label.is_some()
            || self.flush.is_some()
            || self.table.is_some()
            || self.zero
            || self.debug.is_some()
    }
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let val = |i: &mut usize| -> Result<String, String> {
            *i += 1;
            args.get(*i).cloned().ok_or_else(|| format!("option {a} needs a value"))
        };
        if a == "--json" {
            o.json = true;
            i += 1;
            continue;
        }
        if a == "--steer" {
            o.steer = Some(match val(&mut i)?.as_str() {
                "on" => (true, false),
                "off" => (false, false),
                "bare" => (true, true),
                v => return Err(format!("--steer {v}: on, off or bare")),
            });
            i += 1;
            continue;
        }
        if a == "--socket" {
            o.socket = Some(val(&mut i)?);
            i += 1;
            continue;
        }
        if !a.starts_with('-') || a == "-" {
            if o.table_cmd.is_some() {
                o.rest.push(a.clone());
                i += 1;
                continue;
            }
            return Err(format!("unexpected argument '{a}'"));
        }
        // Flags may be grouped as pfctl (getopt) allows: -nvf FILE, and an option's value may
        // follow it in the same word: -sr, -vsr, -Fa, -tbad -Tshow.
        let flags: Vec<char> = a[1..].chars().collect();
        for (k, c) in flags.iter().enumerate() {
            let takes = matches!(c, 'f' | 'D' | 'o' | 's' | 'k' | 'K' | 'F' | 't' | 'T' | 'a' | 'x');
            let mut attached = (takes && k + 1 < flags.len()).then(|| flags[k + 1..].iter().collect::<String>());
            let mut arg = |i: &mut usize| attached.take().map_or_else(|| val(i), Ok);
            match c {
                'n' => o.noaction = true,
                'z' => o.zero = true,
                'e' => o.enable = true,
                'd' => o.disable = true,
                'v' => o.verbose += 1,
                'f' => o.file = Some(arg(&mut i)?),
                'D' => {
                    let d = arg(&mut i)?;
                    let (k, v) = d.split_once('=').ok_or_else(|| format!("-D {d}: expected macro=value"))?;
                    o.defines.push((k.to_string(), v.to_string()));
                }
                'o' => {
                    let _ = arg(&mut i)?;
                }
                's' => o.show = Some(arg(&mut i)?),
                'k' => {
                    let v = arg(&mut i)?;
                    if v == "label" {
                        o.label = Some(arg(&mut i)?);
                    } else {
                        o.kill.push(v);
                    }
                }
                'K' => o.kill_src.push(arg(&mut i)?),
                'F' => o.flush = Some(arg(&mut i)?),
                'x' => o.debug = Some(arg(&mut i)?),
                't' => o.table = Some(arg(&mut i)?),
                'T' => o.table_cmd = Some(arg(&mut i)?),
                'a' => o.anchor = Some(arg(&mut i)?),
                'h' => return Err(USAGE.to_string()),
                other => return Err(format!("unknown option -{other}\n{USAGE}")),
            }
            if takes {
                break;
            }
        }
        i += 1;
    }
    Ok(o)
}

/// `xpfctl sync-decode FILE.pcap`: the pfsync frames of a capture (IP protocol 240), record by
/// record, since tcpdump and tshark on Linux do not decode them.
fn sync_decode(file: &str) -> ExitCode {
    let buf = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("xpfctl: {file}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let recs = match xpf_io::pcap::read(&buf) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("xpfctl: {file}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut frames, mut bad) = (0, 0);
    for (n, r) in recs.iter().enumerate() {
        let ip = match r.linktype {
            xpf_io::pcap::LINKTYPE_ETHERNET if r.data.len() >= 14 && r.data[12..14] == [8, 0] => &r.data[14..],
            xpf_io::pcap::LINKTYPE_LINUX_SLL if r.data.len() >= 16 && r.data[14..16] == [8, 0] => &r.data[16..],
            xpf_io::pcap::LINKTYPE_RAW | xpf_io::pcap::LINKTYPE_IPV4 => r.data,
            _ => continue,
        };
        if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != xpf_sync::wire::PROTO {
            continue;
        }
        let ihl = ((ip[0] & 15) as usize) * 4;
        let (src, dst) = (
            std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            std::net::Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        );
        frames += 1;
        let mut lines = Vec::new();
        match xpf_sync::frame::parse(ip.get(ihl..).unwrap_or(&[]), None, |m| lines.push(xpf_sync::wire::describe(&m))) {
            Ok(info) => {
                let h = info.header.unwrap();
                let authed = ip.len() - ihl > h.len as usize;
                println!(
                    "{} {src} > {dst}: pfsync version {} len {} ttl {}{}, {} record(s){}",
                    n + 1,
                    h.version,
                    h.len,
                    ip[8],
                    if ip[8] != xpf_sync::wire::TTL { " (not 255: a receiver drops it)" } else { "" },
                    info.records,
                    if authed { ", xpf authentication trailer" } else { "" }
                );
                for l in lines {
                    println!("    {l}");
                }
            }
            Err(e) => {
                bad += 1;
                println!("{} {src} > {dst}: pfsync, bad frame: {e}", n + 1);
            }
        }
    }
    println!("{frames} pfsync frame(s), {bad} bad");
    ExitCode::SUCCESS
}

/// `xpfctl log [-i pflogN] [--socket PATH]`: xpfd's live pflog stream (a pcap file of link
/// type pflog) to stdout, until xpfd stops or the reader goes (`| tcpdump -n -e -r -`).
fn follow_log(args: &[String]) -> ExitCode {
    let mut socket = std::env::var("XPFD_SOCKET").unwrap_or_else(|_| SOCKET.to_string());
    let mut unit = 0u8;
    let mut i = 0;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1)) {
            ("-i", Some(v)) => match v.strip_prefix("pflog").and_then(|n| n.parse().ok()) {
                Some(n) => unit = n,
                None => {
                    eprintln!("xpfctl log: -i {v}: pflog0, pflog1, ...");
                    return ExitCode::from(2);
                }
            },
            ("--socket", Some(v)) => socket = v.clone(),
            (a, _) => {
                eprintln!("xpfctl log: unexpected '{a}'\n{USAGE}");
                return ExitCode::from(2);
            }
        }
        i += 2;
    }
    let path = format!("{socket}.pflog");
    let mut s = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xpfctl log: cannot reach xpfd's pflog at {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = s.write_all(format!("pflog{unit}\n").as_bytes()) {
        eprintln!("xpfctl log: {e}");
        return ExitCode::FAILURE;
    }
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) => return ExitCode::SUCCESS,
            Ok(n) => {
                // The reader went (tcpdump -c N): done.
                if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                    return ExitCode::SUCCESS;
                }
            }
            Err(e) => {
                eprintln!("xpfctl log: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("--version") {
        println!("{}", xpf_version::line("xpfctl"));
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("log") {
        return follow_log(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("sync-decode") {
        return match args.get(1) {
            Some(f) => sync_decode(f),
            None => {
                eprintln!("usage: xpfctl sync-decode FILE.pcap");
                ExitCode::from(2)
            }
        };
    }
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xpfctl: {e}");
            return ExitCode::from(2);
        }
    };
    // pfctl's order: -d before anything else, -e after everything (`-ef pf.conf` loads, then
    // enables; a failed load leaves it as it was).
    if o.disable && status(&o, false) != ExitCode::SUCCESS {
        return ExitCode::FAILURE;
    }
    let alone = o.file.is_none() && o.steer.is_none() && !o.acts();
    let rc = if (o.enable || o.disable) && alone { ExitCode::SUCCESS } else { act(&o) };
    if o.enable && rc == ExitCode::SUCCESS {
        return status(&o, true);
    }
    rc
}

/// `-e` (true) or `-d`: pfctl's words on stderr, and its errors.
fn status(o: &Opts, on: bool) -> ExitCode {
    let quiet = Opts { json: false, socket: o.socket.clone(), ..Opts::default() };
    let rc = request(&quiet, json!({"op": "status", "enabled": on}));
    if rc == ExitCode::SUCCESS {
        eprintln!("pf {}", if on { "enabled" } else { "disabled" });
    }
    rc
}

/// Everything but -e and -d.
fn act(o: &Opts) -> ExitCode {
    if let Some((on, bare)) = o.steer {
        return request(o, json!({"op": "steer", "on": on, "bare": bare}));
    }
    if o.acts() {
        return daemon(o);
    }
    let Some(file) = o.file.clone() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // A plain load is parsed by xpfd alone (errors name the file and line the same way, its
    // warnings come back, -D goes with it): a 1.6M-rule file took seconds to parse here
    // first. -n and -v print what was parsed: those parse here.
    if !o.noaction && o.verbose == 0 && file != "-" {
        return load_request(o, &file);
    }
    let (name, src) = if file == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
            eprintln!("xpfctl: reading stdin: {e}");
            return ExitCode::FAILURE;
        }
        ("stdin".to_string(), s)
    } else {
        match std::fs::read_to_string(&file) {
            Ok(s) => (file.clone(), s),
            Err(e) => {
                eprintln!("xpfctl: {file}: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let base = std::path::Path::new(&file).parent().map(|d| d.to_path_buf());
    let p = xpf_conf::parse::parse_in(&src, &name, &o.defines, base.as_deref());
    if !p.errors.is_empty() {
        // As pfctl: what parsing printed (macros, options) still goes to stdout.
        if o.verbose > 0 {
            for h in &p.header {
                println!("{h}");
            }
        }
        for e in &p.errors {
            eprintln!("{e}");
        }
        return ExitCode::FAILURE;
    }
    if o.verbose > 1 {
        // -vv: rule numbers, as pfctl prints them.
        for h in &p.header {
            println!("{h}");
        }
        for q in &p.queues {
            println!("{}", xpf_conf::print::queue(q));
        }
        print!("{}", xpf_conf::print::ruleset_numbered(&p.rules, true));
    } else if o.verbose > 0 {
        print!("{}", xpf_conf::print::parsed(&p));
    }
    // What xpf does not enforce is refused, after -v printed what was parsed (pfctl's view).
    let (refused, warnings) = xpf_conf::support::refusals(&p);
    for w in &warnings {
        eprintln!("{w}");
    }
    if !refused.is_empty() {
        for e in &refused {
            eprintln!("{e}");
        }
        return ExitCode::FAILURE;
    }
    // An anchor's rules are checked against the ruleset in force, by xpfd (-n: compiled,
    // not loaded).
    if !o.noaction || o.anchor.is_some() {
        if file == "-" {
            eprintln!("xpfctl: loading from stdin into xpfd: write the ruleset to a file and give its path");
            return ExitCode::from(2);
        }
        return load_request(o, &file);
    }
    ExitCode::SUCCESS
}

/// Asks xpfd to load `file` (into the anchor of -a; -n: compiled, not installed).
fn load_request(o: &Opts, file: &str) -> ExitCode {
    let path = std::fs::canonicalize(file).unwrap_or_else(|_| file.into());
    let defines: Vec<[&str; 2]> = o.defines.iter().map(|(k, v)| [k.as_str(), v.as_str()]).collect();
    let mut req = json!({"op": "load", "file": path.to_string_lossy(), "noaction": o.noaction, "defines": defines});
    if let Some(a) = &o.anchor {
        req["anchor"] = json!(a);
    }
    request(o, req)
}

/// Sends one request to xpfd and prints its answer (the text, or the data with --json).
fn request(o: &Opts, mut req: Value) -> ExitCode {
    // Only what is printed: the JSON data with -j, else the text.
    req["want"] = json!(if o.json { "data" } else { "text" });
    let path = o.socket.clone().or_else(|| std::env::var("XPFD_SOCKET").ok()).unwrap_or_else(|| SOCKET.to_string());
    let mut s = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("xpfctl: cannot reach xpfd at {path}: {e}; is xpfd running (xpfd -f pf.conf -i IF ...), and are you root?");
            return ExitCode::FAILURE;
        }
    };
    // One write: Display would hand the socket the JSON in pieces, a syscall each (a 1M-entry
    // table took seconds that way).
    let mut out = req.to_string();
    out.push('\n');
    if let Err(e) = s.write_all(out.as_bytes()) {
        eprintln!("xpfctl: sending to xpfd: {e}");
        return ExitCode::FAILURE;
    }
    let mut line = String::new();
    if let Err(e) = BufReader::new(&s).read_line(&mut line) {
        eprintln!("xpfctl: reading xpfd's answer: {e}");
        return ExitCode::FAILURE;
    }
    let ans: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("xpfctl: xpfd's answer is not JSON ({e})");
            return ExitCode::FAILURE;
        }
    };
    if ans["ok"].as_bool() != Some(true) {
        eprintln!("{}", ans["error"].as_str().unwrap_or("xpfd refused the request"));
        return ExitCode::FAILURE;
    }
    // What loaded with a caveat (a load's warnings), on stderr as pfctl says them.
    for w in ans["data"]["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        eprintln!("{w}");
    }
    if o.json {
        println!("{}", serde_json::to_string_pretty(&ans["data"]).unwrap_or_default());
    } else if let Some(t) = ans["text"].as_str() {
        print!("{t}");
    }
    ExitCode::SUCCESS
}

fn daemon(o: &Opts) -> ExitCode {
    let mut rc = ExitCode::SUCCESS;
    if o.zero {
        rc = request(o, json!({"op": "zero"}));
    }
    if let Some(l) = &o.debug {
        rc = request(o, json!({"op": "debug", "level": l}));
    }
    if let Some(what) = &o.flush {
        // pfctl takes any unambiguous prefix: -F s, -Fa, -F rul ...
        let Some(what) = ["states", "Sources", "rules", "all"]
            .into_iter()
            .find(|n| !what.is_empty() && n.starts_with(what.as_str()))
        else {
            eprintln!("xpfctl: -F {what}: states, Sources, rules or all");
            return ExitCode::from(2);
        };
        let mut req = json!({"op": "flush", "what": what});
        if let Some(a) = &o.anchor {
            req["anchor"] = json!(a);
        }
        rc = request(o, req);
    }
    if let Some(l) = &o.label {
        rc = request(o, json!({"op": "kill", "label": l}));
    } else if !o.kill.is_empty() {
        rc = request(o, json!({"op": "kill", "hosts": o.kill}));
    }
    if !o.kill_src.is_empty() {
        // pfctl -K SRC [-K DST]: a second names the address a `sticky-address` source keeps.
        if o.kill_src.len() > 2 {
            eprintln!("xpfctl: -K: one or two hosts or networks (source, then translation address)");
            return ExitCode::from(2);
        }
        rc = request(o, json!({"op": "killsrc", "hosts": o.kill_src}));
    }
    if let Some(t) = &o.table {
        let cmd = o.table_cmd.clone().unwrap_or_else(|| "show".into());
        let full = ["add", "delete", "replace", "show", "test", "flush", "zero", "expire"]
            .iter()
            .find(|c| c.starts_with(cmd.as_str()) && !cmd.is_empty());
        let Some(cmd) = full else {
            eprintln!("xpfctl: -T {cmd}: add, delete, replace, show, test, flush, zero or expire");
            return ExitCode::from(2);
        };
        // -T expire N: the entries whose counters were cleared N seconds ago or more go.
        if *cmd == "expire" {
            let Some(secs) = o.rest.first().and_then(|n| n.parse::<u64>().ok()).filter(|_| o.rest.len() == 1) else {
                eprintln!("xpfctl: -T expire takes one number of seconds");
                return ExitCode::from(2);
            };
            return request(o, json!({"op": "table", "name": t, "cmd": "expire", "seconds": secs}));
        }
        // -T add|delete|replace|test -f FILE: the file's entries, as pfctl reads a table file.
        let mut addrs = o.rest.clone();
        if let Some(f) = &o.file {
            let text = match std::fs::read_to_string(f) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("xpfctl: {f}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            for e in xpf_conf::compile::table_file_entries(&text) {
                match e {
                    Ok((a, l, false)) => addrs.push(format!("{a}/{l}")),
                    Ok((a, l, true)) => {
                        eprintln!("xpfctl: {f}: !{a}/{l}: negated entries cannot be given with -T {cmd}");
                        return ExitCode::FAILURE;
                    }
                    Err((n, w)) => {
                        eprintln!("xpfctl: {f}:{n}: {w}");
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
        rc = request(o, json!({"op": "table", "name": t, "cmd": cmd, "addrs": addrs, "verbose": o.verbose}));
    }
    if let Some(what) = &o.show {
        // pfctl accepts any unambiguous prefix: -s i, -s st, -s r ...
        let names = [
            "info",
            "states",
            "Sources",
            "memory",
            "rules",
            "nat",
            "labels",
            "queue",
            "timeouts",
            "Tables",
            "Interfaces",
            "Anchors",
            "all",
        ];
        let full: Vec<&&str> = names.iter().filter(|n| n.starts_with(what.as_str())).collect();
        let full = if names.contains(&what.as_str()) {
            vec![names.iter().find(|n| **n == what.as_str()).unwrap()]
        } else {
            full
        };
        if full.len() != 1 {
            eprintln!(
                "xpfctl: -s {what}: one of info, states, Sources, memory, rules, nat, labels, queue, timeouts, Tables, Interfaces, Anchors, all"
            );
            return ExitCode::from(2);
        }
        let mut req = json!({"op": "show", "what": full[0], "verbose": o.verbose});
        if let Some(a) = &o.anchor {
            req["anchor"] = json!(a);
        }
        rc = request(o, req);
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn pfctl_style_flags() {
        let o = parse_args(&a("-nvf pf.conf -D ext=em0 -o none")).unwrap();
        assert!(o.noaction);
        assert_eq!(o.verbose, 1);
        assert_eq!(o.file.as_deref(), Some("pf.conf"));
        assert_eq!(o.defines, vec![("ext".to_string(), "em0".to_string())]);
        // As getopt reads them: a value may follow its option in the same word (-sr, -vsr,
        // -Fa), and takes the rest of the word (-fn is the file "n").
        for (args, show, verbose) in
            [("-sr", "r", 0), ("-vsr", "r", 1), ("-vvsinfo", "info", 2), ("-s states", "states", 0)]
        {
            let o = parse_args(&a(args)).unwrap();
            assert_eq!((o.show.as_deref(), o.verbose), (Some(show), verbose), "{args}");
        }
        assert_eq!(parse_args(&a("-Fa")).unwrap().flush.as_deref(), Some("a"));
        // -e and -d alone, or with a load (pfctl -ef pf.conf).
        let o = parse_args(&a("-ef pf.conf")).unwrap();
        assert!(o.enable && !o.disable && !o.acts());
        assert_eq!(o.file.as_deref(), Some("pf.conf"));
        let o = parse_args(&a("-d")).unwrap();
        assert!(o.disable && o.file.is_none() && !o.acts());
        assert!(parse_args(&a("-d -s info")).unwrap().acts());
        assert_eq!(parse_args(&a("-nvfpf.conf")).unwrap().file.as_deref(), Some("pf.conf"));
        let o = parse_args(&a("-tbad -Tadd 192.0.2.1")).unwrap();
        assert_eq!(
            (o.table.as_deref(), o.table_cmd.as_deref(), &o.rest[..]),
            (Some("bad"), Some("add"), &["192.0.2.1".to_string()][..])
        );
        assert_eq!(parse_args(&a("-klabel web")).unwrap().label.as_deref(), Some("web"));
        assert!(parse_args(&a("-fn x")).unwrap_err().contains("unexpected argument 'x'"));
        assert!(parse_args(&a("-q")).unwrap_err().contains("unknown option -q"));
        assert!(parse_args(&a("-D novalue")).unwrap_err().contains("macro=value"));
        assert_eq!(parse_args(&a("-s info")).unwrap().show.as_deref(), Some("info"));
        let o = parse_args(&a("-k 10.0.0.1 -k 10.0.1.0/24")).unwrap();
        assert_eq!(o.kill, vec!["10.0.0.1", "10.0.1.0/24"]);
        assert_eq!(parse_args(&a("-K 10.0.1.2")).unwrap().kill_src, vec!["10.0.1.2"]);
        assert_eq!(parse_args(&a("-k label web")).unwrap().label.as_deref(), Some("web"));
        let o = parse_args(&a("-t bad -T add 192.0.2.1 192.0.2.0/28")).unwrap();
        assert_eq!((o.table.as_deref(), o.table_cmd.as_deref()), (Some("bad"), Some("add")));
        assert_eq!(o.rest, vec!["192.0.2.1", "192.0.2.0/28"]);
        assert!(parse_args(&a("-s info --json")).unwrap().json);
        let o = parse_args(&a("-a members/44.0.1 -f m.conf")).unwrap();
        assert_eq!((o.anchor.as_deref(), o.file.as_deref()), (Some("members/44.0.1"), Some("m.conf")));
    }
}
