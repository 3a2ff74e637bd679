//! The generated campus policy means one thing in every form: xpf's compiled pf.conf (walked
//! with skip steps and through the classifier) gives each new connection the verdict the
//! nftables forms' first-match order gives it.

use xpf_bench::rulegen::{campus, random};
use xpf_conf::compile::Lookup;
use xpf_conf::{parse, Ruleset};
use xpf_engine::{Action, Policy};
use xpf_state::Dir;

fn ifindex(n: &str) -> Option<u16> {
    match n {
        "em0" => Some(1),
        "em1" => Some(2),
        _ => None,
    }
}

#[test]
fn campus_pf_and_nftables_forms_agree() {
    let pol = campus(20_000, 7);
    let p = parse(&pol.pf, "campus", &[]);
    assert!(p.errors.is_empty(), "{:?}", &p.errors[..p.errors.len().min(3)]);
    let walk = Ruleset::compile(&p, &ifindex).unwrap();
    assert_eq!(walk.len(), pol.compiled, "the generator counts what pf compiles");
    assert!((19_000..=21_000).contains(&walk.len()), "{} rules", walk.len());
    let mut class = walk.clone();
    class.set_lookup(Lookup::Classify);
    let mut walk = walk;
    walk.set_lookup(Lookup::Walk);
    let (mut passed, mut blocked) = (0, 0);
    for pr in pol.probes(20_000, 3) {
        let pd = pr.pdesc();
        let dir = if pr.inbound { Dir::In } else { Dir::Out };
        let want = pol.first_match(&pr);
        let d = class.evaluate(&pd, 1, dir);
        assert_eq!(d, walk.evaluate(&pd, 1, dir), "{pr:?}");
        assert_eq!(d.action == Action::Pass, want, "{pr:?}: pf {:?}, nftables order {}", d.action, want);
        if want {
            passed += 1
        } else {
            blocked += 1
        }
    }
    // Both verdicts are common: the probes test the policy, not one default.
    assert!(passed > 5_000 && blocked > 5_000, "passed {passed} blocked {blocked}");
    // The forms name every member's rules: the naive one a line each, the expert one in sets.
    assert!(pol.nft_naive.lines().count() > pol.rules.len());
    assert!(pol.nft_expert.contains("@member_svc") && pol.nft_expert.lines().count() < 200);
}

#[test]
fn random_set_parses_to_its_size() {
    let text = random(5_000, 9);
    let p = parse(&text, "random", &[]);
    assert!(p.errors.is_empty(), "{:?}", &p.errors[..p.errors.len().min(3)]);
    let r = Ruleset::compile(&p, &ifindex).unwrap();
    assert_eq!(r.len(), 5_000);
}

/// nft accepts both forms (checked, not loaded: `nft -c`; scripts/deps.sh installs nft).
#[test]
fn nftables_forms_are_accepted_by_nft() {
    assert!(std::process::Command::new("nft").arg("--version").output().is_ok(), "nft is missing: run scripts/deps.sh");
    let pol = campus(3_000, 5);
    for (name, text) in [("expert", &pol.nft_expert), ("naive", &pol.nft_naive)] {
        let f = std::env::temp_dir().join(format!("xpf-campus-{name}-{}.nft", std::process::id()));
        std::fs::write(&f, text).unwrap();
        let out = std::process::Command::new("nft").arg("-c").arg("-f").arg(&f).output().unwrap();
        let _ = std::fs::remove_file(&f);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
