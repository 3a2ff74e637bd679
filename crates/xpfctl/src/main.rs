//! xpfctl, pfctl for xpf. Today it does what needs no daemon: `-n -f FILE` checks a pf.conf
//! and, with `-v`, prints it in pfctl's canonical form (`-f -` reads stdin, `-D name=value`
//! defines a macro, `-o none` is accepted: xpf has no optimizer to turn off). Everything that
//! talks to xpfd (`-s`, `-k`, `-F`, `-t`, loading) comes with the daemon, and says so.

use std::process::ExitCode;

const USAGE: &str = "usage: xpfctl [-nv] [-D macro=value] [-o level] -f FILE\n       \
                     xpfctl [-s info|states|memory|rules|timeouts|Tables|all] [-k host] [-F what] [-t table -T cmd]";

#[derive(Debug, Default)]
struct Opts {
    file: Option<String>,
    noaction: bool,
    verbose: u8,
    defines: Vec<(String, String)>,
    daemon_cmd: Option<String>,
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
        if !a.starts_with('-') || a == "-" {
            return Err(format!("unexpected argument '{a}'"));
        }
        // Flags may be grouped as pfctl allows: -nvf FILE.
        let flags: Vec<char> = a[1..].chars().collect();
        for (k, c) in flags.iter().enumerate() {
            let last = k + 1 == flags.len();
            match c {
                'n' => o.noaction = true,
                'v' => o.verbose += 1,
                'f' | 'D' | 'o' | 's' | 'k' | 'F' | 't' | 'T' | 'a' if !last => {
                    return Err(format!("option -{c} must come last in '{a}', followed by its value"))
                }
                'f' => o.file = Some(val(&mut i)?),
                'D' => {
                    let d = val(&mut i)?;
                    let (k, v) = d.split_once('=').ok_or_else(|| format!("-D {d}: expected macro=value"))?;
                    o.defines.push((k.to_string(), v.to_string()));
                }
                'o' => {
                    let _ = val(&mut i)?;
                }
                's' | 'k' | 'F' | 't' | 'T' | 'a' => o.daemon_cmd = Some(format!("-{c} {}", val(&mut i)?)),
                'h' => return Err(USAGE.to_string()),
                other => return Err(format!("unknown option -{other}\n{USAGE}")),
            }
        }
        i += 1;
    }
    Ok(o)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xpfctl: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(cmd) = &o.daemon_cmd {
        eprintln!("xpfctl: {cmd} needs xpfd, which is not built yet (it comes with the daemon issue).");
        return ExitCode::from(2);
    }
    let Some(file) = o.file else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
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
    if !o.noaction {
        eprintln!(
            "xpfctl: {name}: ruleset is valid; loading it needs xpfd, which is not built yet (use -n to check only)."
        );
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
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
        assert!(parse_args(&a("-fn x")).unwrap_err().contains("must come last"));
        assert!(parse_args(&a("-q")).unwrap_err().contains("unknown option -q"));
        assert!(parse_args(&a("-D novalue")).unwrap_err().contains("macro=value"));
        assert_eq!(parse_args(&a("-s info")).unwrap().daemon_cmd.as_deref(), Some("-s info"));
    }
}
