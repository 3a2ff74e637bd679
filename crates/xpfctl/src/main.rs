//! xpfctl, pfctl for xpf. It talks to xpfd's control socket, which comes with the daemon
//! issue; until then it says so and exits non-zero.

use std::process::ExitCode;

const USAGE: &str = "usage: xpfctl [-nv] [-f FILE] [-s info|states|memory|rules|timeouts|Tables|all] [-k host] [-F what] [-t table -T cmd]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "xpfctl: there is no xpfd to talk to yet (the daemon and its control socket come with the daemon issue)."
    );
    eprintln!("xpfctl: `xpf-bench replay --info FILE.pcap` shows the pfctl -si view of the engine's counters today.");
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
