//! xpfd, the xpf daemon. The dataplane (AF_XDP/AF_PACKET I/O, FIB, the control socket) is
//! issue 4's work; until then this binary says so and exits non-zero, so that no script takes
//! it for a running firewall.

use std::process::ExitCode;

const USAGE: &str = "usage: xpfd -f FILE -i IF [-i IF ...] [--io xdp|packet|auto] [--workers N] [--socket PATH]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    eprintln!("xpfd: the dataplane is not built yet (it comes with the daemon issue); nothing is filtered.");
    eprintln!("xpfd: to exercise the engine today, run `xpf-bench states --quick` or `xpf-bench replay FILE.pcap`.");
    eprintln!("{USAGE}");
    ExitCode::from(2)
}
