//! What build of xpf this is, for `--version`, the daemon's first log line and its metrics.

/// The workspace's package version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the binaries were built from (12 hex digits, "+dirty" with local changes to
/// tracked files; "unknown" when built outside a git checkout).
pub const COMMIT: &str = env!("XPF_COMMIT");

/// `PROGRAM VERSION (commit COMMIT)`, as `--version` prints it.
pub fn line(program: &str) -> String {
    format!("{program} {VERSION} (commit {COMMIT})")
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_a_commit() {
        let c = super::COMMIT;
        let hex = c.trim_end_matches("+dirty");
        assert!(c == "unknown" || hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()), "{c}");
        assert!(super::line("xpfd").starts_with("xpfd 0."));
    }
}
