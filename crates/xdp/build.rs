//! Compiles the XDP programs in bpf/ with clang for the BPF target (Debian's clang; `make`
//! installs it through scripts/deps.sh). `CLANG` overrides the compiler.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let clang = std::env::var("CLANG").ok().or_else(|| {
        ["clang", "clang-14", "clang-15", "clang-16"]
            .iter()
            .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
            .map(|c| c.to_string())
    });
    let Some(clang) = clang else {
        panic!("xpf-xdp: no clang to build the XDP programs; run scripts/deps.sh (apt-get install clang)");
    };
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    let arch_inc = format!("/usr/include/{}-linux-gnu", std::env::var("CARGO_CFG_TARGET_ARCH").unwrap());
    for p in ["steer", "gen", "sink", "inject", "skb"] {
        let o = out.join(format!("{p}.o"));
        let st = Command::new(&clang)
            .args(["-O2", "-g0", "-Wall", "-Werror", "-target", "bpf", "-I", &arch_inc, "-c"])
            .arg(format!("bpf/{p}.c"))
            .arg("-o")
            .arg(&o)
            .status()
            .expect("run clang");
        assert!(st.success(), "clang failed on bpf/{p}.c");
    }
}
