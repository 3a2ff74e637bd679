//! Names the commit the workspace is built from (XPF_COMMIT): `git rev-parse`'s short hash,
//! with "+dirty" when tracked files differ from it, or "unknown" outside a git checkout.

use std::path::Path;
use std::process::Command;

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(root).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let root = Path::new(&manifest).join("../..");
    let commit = match git(&root, &["rev-parse", "--short=12", "HEAD"]) {
        Some(c) if !c.is_empty() => {
            let dirty = git(&root, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}+dirty")
            } else {
                c
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=XPF_COMMIT={commit}");
    // Again when a commit is made or checked out, or a source changes (its "+dirty").
    if let Some(dir) = git(&root, &["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "packed-refs", "refs"] {
            watch(&Path::new(&dir).join(f));
        }
    }
    for f in ["crates", "Cargo.toml", "Cargo.lock", "scripts", "Makefile"] {
        watch(&root.join(f));
    }
}

/// A path watched only if it exists (cargo reruns the script every build for one missing).
fn watch(p: &Path) {
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
