//! Real pf.conf files written by others (../shared/peer/pf-conf-examples, openbsd/,
//! real-world/ and freebsd/): each must load, or fail only for reasons it names (a macro its
//! harness passes with -D, a user, interface or file this host lacks, a feature xpf does not
//! support yet, such as FreeBSD's ALTQ on every line of it), never with a bare "syntax error".

use std::path::PathBuf;

#[test]
fn examples_load_or_say_why_not() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer/pf-conf-examples");
    assert!(root.is_dir(), "{} is missing", root.display());
    let mut loaded = Vec::new();
    let mut seen = 0;
    for sub in ["openbsd", "real-world", "freebsd"] {
        for f in std::fs::read_dir(root.join(sub)).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            // Not pf.conf: prose, the OS fingerprint database, man-page extracts, table files.
            if name.ends_with(".md") || name == "pf.os" || name.contains("literal-blocks") || name.ends_with(".table") {
                continue;
            }
            seen += 1;
            let src = std::fs::read_to_string(&f).unwrap();
            let p = xpf_conf::parse::parse_in(&src, &name, &[], f.parent());
            if p.errors.is_empty() {
                loaded.push(name);
                continue;
            }
            for e in &p.errors {
                assert_ne!(e.msg, "syntax error", "{name}: {e} (an example must fail for a named reason)");
                // macOS Fortress writes a quoted port list over three lines, as pfctl allows.
                assert_ne!(e.msg, "unterminated quote", "{name}: {e}");
            }
        }
    }
    println!("examples loaded: {loaded:?} of {seen}");
    assert!(seen >= 12);
    assert!(loaded.iter().any(|n| n == "etc-examples-pf.conf"));
    // `port spamd` is OpenBSD's 8025, whatever the host's services file says.
    assert!(loaded.iter().any(|n| n == "share-examples-pf-spamd"));
}
