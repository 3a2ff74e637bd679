//! xpf-conf: pf.conf as OpenBSD's pfctl reads and prints it.
//!
//! [`lex`] splits a logical line into tokens, expanding macros; [`parse`] turns lines into
//! rules (expanding lists, inferring the address family, checking what pfctl checks, with
//! `FILE:LINE: message` errors in pfctl's words); [`print`] prints them in pfctl's canonical
//! form. The ruleset compiler and evaluation on the engine's descriptor come next
//! (docs/pfconf.md says what is covered).

pub mod ast;
pub mod compile;
pub mod ifaddr;
pub mod lex;
pub mod names;
pub mod parse;
pub mod print;
pub mod reload;

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

    #[test]
    fn errors_name_file_and_line() {
        let p = parse("pass\npass in from any to $nope\nblock in proto nonesuch\n", "pf.conf", &[]);
        let e: Vec<String> = p.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(e, vec!["pf.conf:2: macro 'nope' not defined", "pf.conf:3: unknown protocol nonesuch"]);
    }

    #[test]
    fn defines_override_the_file() {
        let p = parse("ext = \"em0\"\npass in on $ext\n", "t", &[("ext".into(), "lo0".into())]);
        assert_eq!(print::ruleset(&p.rules), "pass in on lo0 all flags S/SA\n");
    }
}
