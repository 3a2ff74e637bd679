//! xpf-conf: pf.conf as OpenBSD's pfctl reads and prints it.
//!
//! [`lex`] splits a logical line into tokens, expanding macros; [`parse`] turns lines into
//! rules (expanding lists, inferring the address family, checking what pfctl checks, with
//! `FILE:LINE: message` errors in pfctl's words); [`print`] prints them in pfctl's canonical
//! form. The ruleset compiler and evaluation on the engine's descriptor come next
//! (docs/pfconf.md says what is covered).

pub mod ast;
pub mod classify;
pub mod compile;
pub mod ifaddr;
pub mod ifgroup;
pub mod lex;
pub mod names;
pub mod parse;
pub mod print;
pub mod reload;
pub mod routes;
pub mod support;

pub use compile::Ruleset;
pub use parse::{parse, ConfError, Parsed};

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(src: &str) -> String {
        let p = parse(src, "t", &[]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        let once = print::ruleset(&p.rules);
        let q = parse(&once, "printed", &[]);
        assert!(q.errors.is_empty(), "printed form refused: {:?}\n{once}", q.errors);
        assert_eq!(print::ruleset(&q.rules), once);
        once
    }

    /// Found by the pfconf fuzz target: a tag holding `$` was printed bare and read back as a
    /// macro.
    #[test]
    fn quoted_tag_with_dollar_round_trips() {
        assert_eq!(roundtrip("pass tag \"a$b c\"\n"), "pass all flags S/SA tag \"a$b c\"\n");
        assert_eq!(roundtrip("pass tag plain\n"), "pass all flags S/SA tag plain\n");
        assert_eq!(roundtrip("pass label \"say \\\"hi\\\"\"\n"), "pass all flags S/SA label \"say \\\"hi\\\"\"\n");
    }

    /// Found by the pfconf fuzz target: `anchor \` loaded and printed as `anchor "\"`,
    /// which no pf.conf lexer reads back.
    #[test]
    fn a_name_ending_in_a_backslash_is_refused() {
        for src in ["anchor a\\ all\n", "pass tag t\\ all\n"] {
            let p = parse(src, "t", &[]);
            assert!(p.errors.iter().any(|e| e.msg.contains("ends in a backslash")), "{src}: {:?}", p.errors);
        }
    }

    /// Found by the pfconf fuzz target: `block on ""` printed as `block drop on  all`, which
    /// reads back as an interface named `all`.
    #[test]
    fn an_empty_interface_name_is_refused() {
        assert!(!parse("block on \"\"\n", "t", &[]).errors.is_empty());
        // And one that would not print back as itself: `( . )` printed as `(.)`.
        assert!(!parse("block to (\" . \")\n", "t", &[]).errors.is_empty());
        assert!(!parse("block on \"a b\"\n", "t", &[]).errors.is_empty());
    }

    /// Found by the pfconf fuzz target (2.3M executions): `block to <"">` printed as
    /// `block drop from any to <>`, which does not parse.
    #[test]
    fn a_table_name_that_would_not_print_back_is_refused() {
        for src in ["block to <\"\">\n", "block to <\"a b\">\n", "table <\"\"> persist\n"] {
            let p = parse(src, "t", &[]);
            assert!(p.errors.iter().any(|e| e.msg.contains("invalid table name")), "{src}: {:?}", p.errors);
        }
        assert!(parse("table <a> persist\nblock to <a>\n", "t", &[]).errors.is_empty());
    }

    #[test]
    fn errors_name_file_and_line() {
        let p = parse("pass\npass in from any to $nope\nblock in proto nonesuch\n", "pf.conf", &[]);
        let e: Vec<String> = p.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(e, vec!["pf.conf:2: macro 'nope' not defined", "pf.conf:3: unknown protocol nonesuch"]);
    }

    #[test]
    fn rule_numbers_count_per_ruleset() {
        let p = parse("pass\nanchor {\n pass\n block\n}\nblock\n", "t", &[]);
        assert_eq!(
            print::ruleset_numbered(&p.rules, true),
            "@0 pass all flags S/SA\n@1 anchor all {\n  @0 pass all flags S/SA\n  @1 block drop all\n}\n@2 block drop all\n"
        );
    }

    #[test]
    fn include_reads_in_place_and_names_the_file() {
        let d = std::env::temp_dir().join(format!("xpf-inc-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("inner.conf"), "block in proto udp\npass in on $nope\n").unwrap();
        let p = parse::parse_in("pass out\ninclude \"inner.conf\"\nblock out\n", "outer.conf", &[], Some(&d));
        let e: Vec<String> = p.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(e, vec!["inner.conf:2: macro 'nope' not defined"]);
        let p = parse::parse_in("include \"missing.conf\"\n", "outer.conf", &[], Some(&d));
        assert_eq!(p.errors[0].to_string(), "outer.conf:1: cannot open the include file missing.conf");
        std::fs::write(d.join("loop.conf"), "include \"loop.conf\"\n").unwrap();
        let p = parse::parse_in("include \"loop.conf\"\n", "outer.conf", &[], Some(&d));
        assert!(p.errors.iter().any(|e| e.msg.contains("include nesting too deep")));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A ruleset is compiled again when the interfaces' addresses change if any address it
    /// names follows them: in a rule's source or destination, and as much in a translation
    /// pool (`nat-to (em0)`) or a FreeBSD translation rule (`nat on em0 ... -> (em0)`).
    #[test]
    fn a_pool_on_an_interface_follows_its_addresses() {
        for (src, follows) in [
            ("pass in from (lo)\n", true),
            ("pass in to self\n", true),
            ("pass out on lo nat-to (lo)\n", true),
            ("pass in on lo rdr-to (lo:0) port 8080\n", true),
            ("nat on lo from 10.0.0.0/8 to any -> (lo)\n", true),
            ("binat on lo from 10.0.0.1 to any -> (lo:0)\n", true),
            ("pass out on lo nat-to 192.0.2.1\n", false),
            ("nat on lo from 10.0.0.0/8 to any -> 192.0.2.1\n", false),
        ] {
            let p = parse(src, "t", &[]);
            assert!(p.errors.is_empty(), "{src}: {:?}", p.errors);
            assert_eq!(p.follows_addresses(), follows, "{src}");
        }
        let p = parse("set skip on lo\nset loginterface lan\npass in on egress to (dmz) received-on wan\n", "t", &[]);
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.interface_names().collect::<Vec<_>>(), vec!["egress", "wan", "dmz", "lo", "lan"]);
    }

    #[test]
    fn defines_override_the_file() {
        let p = parse("ext = \"em0\"\npass in on $ext\n", "t", &[("ext".into(), "lo0".into())]);
        assert_eq!(print::ruleset(&p.rules), "pass in on lo0 all flags S/SA\n");
    }
}
