//! A large pf.conf is parsed in pieces on several cores (parse/mod.rs, `parse_pieces`): pieces
//! are parsed ahead by helpers as if the lines before each were filter rules only, then taken
//! as they are or parsed again in order. Whatever the cut, the result must be the parse
//! in one go: the rules (their anchor depths, labels, return policies), the errors and their
//! lines, the tables, the header.

use xpf_conf::parse::{parse_in, parse_in_pieces, Parsed};

/// `source-hash` with no key draws a random one each parse, as pfctl does: such keys read
/// alike here.
fn unkeyed(dump: String) -> String {
    let mut out = String::with_capacity(dump.len());
    let mut rest = dump.as_str();
    while let Some(i) = rest.find("\"0x") {
        let key = rest.as_bytes().get(i + 3..i + 35);
        out += &rest[..i];
        if key.is_some_and(|k| k.iter().all(u8::is_ascii_hexdigit)) && rest.as_bytes().get(i + 35) == Some(&b'"') {
            out += "\"KEY\"";
            rest = &rest[i + 36..];
        } else {
            out += "\"0x";
            rest = &rest[i + 3..];
        }
    }
    out + rest
}

/// Everything parsed, the macros apart (a map, printed in no fixed order).
fn same(one: &Parsed, pieced: &Parsed, what: &str) {
    let show = |p: &Parsed| {
        let mut p = p.clone();
        p.macros.clear();
        unkeyed(format!("{p:#?}"))
    };
    assert_eq!(one.macros, pieced.macros, "{what}: macros");
    if one.rules.len() != pieced.rules.len() {
        panic!("{what}: {} rules in one go, {} in pieces", one.rules.len(), pieced.rules.len());
    }
    let rule = |p: &Parsed, i: usize| unkeyed(format!("{:#?}", p.rules[i]));
    if let Some(i) = (0..one.rules.len()).find(|&i| one.rules[i] != pieced.rules[i] && rule(one, i) != rule(pieced, i))
    {
        panic!("{what}: rule {i} differs:\n{}\n{}", rule(one, i), rule(pieced, i));
    }
    assert_eq!(one.errors, pieced.errors, "{what}: errors");
    let rest = |p: &Parsed| {
        let mut p = p.clone();
        p.rules.clear();
        p
    };
    let (a, b) = (show(&rest(one)), show(&rest(pieced)));
    if a != b {
        let line = a.lines().zip(b.lines()).position(|(x, y)| x != y).unwrap_or(0);
        panic!("{what}: differs from line {line} of its dump: {:?} / {:?}", a.lines().nth(line), b.lines().nth(line));
    }
}

/// A deterministic ruleset of `n` statements: rule lines, inline anchors and what a piece may
/// hold (lists and strings over several lines, continued lines, errors, comments and, for a
/// fifth of the seeds, labels that name a block policy, and for a third of
/// the seeds a stray `}`), and, as
/// often as `foreign` in 1,000 statements each, what it may not (macros used and defined,
/// options, tables, translation pools that make tables).
fn mixed(seed: u64, n: usize, foreign: u64) -> String {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move |m: u64| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let mut s = String::from("ext = \"em0\"\ntable <t> { 10.9.0.0/16 }\nset block-policy return\n");
    let mut depth = 0;
    for i in 0..n {
        let net = format!("10.{}.{}.0/24", i / 256 % 256, i % 256);
        let f = next(1000);
        if f < 6 * foreign {
            match f % 6 {
                0 => s += &format!("pass in on $ext proto udp to {net} label \"$nr\"\n"),
                1 => s += &format!("m{i} = \"{net}\"\n"),
                2 => s += &format!("set block-policy {}\n", if next(2) == 0 { "drop" } else { "return" }),
                3 => s += &format!("pass out on em0 to {net} nat-to {{ 192.0.2.1 192.0.2.2 }}\n"),
                4 => s += &format!("table <t{i}> {{ {net} }}\n"),
                _ => s += &format!("pass out on em0 to {net} nat-to 192.0.2.9\n"),
            }
            continue;
        }
        match next(100) {
            0..=39 => s += &format!("pass in quick on em0 proto tcp from any to {net} port {}\n", 1 + next(1000)),
            40..=54 => s += &format!("block in on em1 from {net} label \"b{i}\"\n"),
            55..=59 => s += &format!("match out on em0 to {net} tag T{}\n", next(5)),
            60..=64 if depth < 3 => {
                s += &format!("anchor \"a{i}\" in on em0 to {net} {{\n");
                depth += 1;
            }
            65..=71 if depth > 0 => {
                s += "}\n";
                depth -= 1;
            }
            75 => s += &format!("pass out proto tcp to {{\n  {net},\n  10.200.0.1 }} port 443\n"),
            76 => s += &format!("pass in proto udp \\\n  to {net} \\\n  port 53\n"),
            78 => s += &format!("pass in to {net} port frobnicate\n"),
            79 => s += "# a comment\n\n",
            80 => s += &format!("block return in proto tcp from {net} to <t>\n"),
            81 => s += &format!("pass in proto {{ tcp udp }} to {net} port {{ 22 80 }}\n"),
            82 if seed.is_multiple_of(3) => s += "}\n",
            84 => s += &format!("pass in label \"ab\ncd\" to {net}\n"),
            85 => s += &format!("block in from {net} label 'x\\\ny'\n"),
            86 => s += "# set block-policy drop, a comment says\n",
            87 if seed % 5 == 1 => s += &format!("pass in to {net} label \"set block-policy drop\"\n"),
            _ => s += &format!("pass out on em0 proto udp from {net} to any port {}\n", 1 + next(60000)),
        }
    }
    if next(4) > 0 {
        s += &"}\n".repeat(depth);
    }
    s
}

#[test]
fn pieces_parse_as_the_file_in_one_go() {
    let (mut stood, mut again) = (0, 0);
    for seed in 0..24 {
        let src = mixed(seed, 600 + 97 * seed as usize, seed % 4);
        let one = parse_in(&src, "mixed.conf", &[], None);
        for n in 2..=8 {
            let (p, k) = parse_in_pieces(&src, "mixed.conf", &[], None, n, 1 + n % 3, true);
            same(&one, &p, &format!("seed {seed}, {n} pieces parsed ahead first"));
            stood += k;
            again += n - 1 - k;
            // As a load runs them: whoever comes first.
            let (p, _) = parse_in_pieces(&src, "mixed.conf", &[], None, 4 * n, 1 + n % 3, false);
            same(&one, &p, &format!("seed {seed}, {} pieces", 4 * n));
        }
    }
    // Both ways were taken: pieces kept as parsed ahead, and pieces parsed again in order.
    println!("pieces kept {stood}, parsed again {again}");
    assert!(stood > 100 && again > 100, "kept {stood}, again {again}");
}

/// Rule lines only, with inline anchors: every piece stands, whatever the cut.
#[test]
fn pieces_of_rules_and_anchors_are_kept() {
    let mut src = String::from("set limit states 100000\n");
    for a in 0..200 {
        src += &format!("anchor \"net/{a}\" in on em0 to 10.{a}.0.0/16 {{\n");
        for r in 0..20 {
            src += &format!("pass in quick proto tcp to 10.{a}.{r}.1 port 22 label \"m{a}-{r}\"\n");
        }
        src += "block in\n}\n";
    }
    let one = parse_in(&src, "campus.conf", &[], None);
    assert!(one.errors.is_empty(), "{:?}", one.errors.first());
    for n in 2..=8 {
        let (p, k) = parse_in_pieces(&src, "campus.conf", &[], None, n, 2, true);
        same(&one, &p, &format!("{n} pieces"));
        assert_eq!(k, n - 1, "{n} pieces: each after the first kept");
    }
}

/// The real files and pfctl's regress inputs, cut at every count of pieces.
#[test]
fn pieces_of_real_files_parse_as_one() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer");
    assert!(root.is_dir(), "{} is missing", root.display());
    let mut seen = 0;
    for sub in
        ["pf-conf-examples/openbsd", "pf-conf-examples/real-world", "pf-conf-examples/freebsd", "openbsd-pfctl-regress"]
    {
        for f in std::fs::read_dir(root.join(sub)).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            if name.ends_with(".md") || name.ends_with(".ok") || name == "pf.os" {
                continue;
            }
            let Ok(src) = std::fs::read_to_string(&f) else { continue };
            let one = parse_in(&src, &name, &[], f.parent());
            for (n, ahead_first) in [(2, true), (3, false), (5, true), (9, false)] {
                let (p, _) = parse_in_pieces(&src, &name, &[], f.parent(), n, 2, ahead_first);
                same(&one, &p, &format!("{sub}/{name}, {n} pieces"));
            }
            seen += 1;
        }
    }
    assert!(seen > 100, "{seen} files");
}

/// Inline anchors nest 64 deep, pf's anchor stack; one more is refused at its line, in one go
/// and in pieces alike.
#[test]
fn anchors_nest_as_deep_as_pfs_stack() {
    let nest = |n: usize| {
        let mut s = String::new();
        for k in 0..n {
            s += &format!("anchor \"a{k}\" in on em0 to 10.{k}.0.0/16 {{\n");
            for r in 0..40 {
                s += &format!("pass in quick proto tcp to 10.{k}.{r}.1 port 22\n");
            }
        }
        s + &"}\n".repeat(n)
    };
    let ok = nest(64);
    assert!(parse_in(&ok, "deep.conf", &[], None).errors.is_empty());
    let deep = nest(70);
    let one = parse_in(&deep, "deep.conf", &[], None);
    let first = one.errors.first().expect("refused");
    assert_eq!(first.line, 64 * 41 + 1, "{first}");
    assert!(first.msg.contains("anchor nesting deeper than 64"), "{first}");
    for n in 2..=8 {
        let (p, _) = parse_in_pieces(&deep, "deep.conf", &[], None, n, 2, true);
        same(&one, &p, &format!("70 deep, {n} pieces"));
        let (p, k) = parse_in_pieces(&ok, "deep.conf", &[], None, n, 2, true);
        same(&parse_in(&ok, "deep.conf", &[], None), &p, &format!("64 deep, {n} pieces"));
        assert_eq!(k, n - 1, "64 deep, {n} pieces: each kept");
    }
}

/// Users and groups are named by this machine's databases, read from several threads at once
/// when a file is parsed in pieces (and when tests run together): each name must give its own
/// id whatever the other threads look up meanwhile (getpwnam and getgrnam share one buffer
/// across threads; the lookups take their own).
#[test]
fn user_and_group_names_resolve_alike_from_several_threads() {
    let names = [("root", 0u32), ("daemon", 1), ("bin", 2)];
    let threads: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let (name, id) = names[t % 3];
                let kind = if t < 3 { "user" } else { "group" };
                for _ in 0..3_000 {
                    let p = parse_in(&format!("pass in proto tcp {kind} {name}\n"), "t.conf", &[], None);
                    let r = &p.rules[0];
                    let got = if t < 3 { &r.user } else { &r.group };
                    assert_eq!(format!("{got:?}"), format!("Some(Eq({id}))"), "{kind} {name}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
