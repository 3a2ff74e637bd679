//! The pf.conf lexer, with pfctl's rules: a word runs until white space or one of
//! `( ) { } < > ! = / # ,`; `#` starts a comment; a backslash before the end of a line joins the
//! next; `"..."` is one string; `$name` is replaced by the macro's value, which is lexed again
//! (so a macro may hold several tokens, a list for example). Every token knows its line.

use std::borrow::Cow;
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// A bare word (names, numbers, addresses, keywords).
    Word(String),
    /// A double-quoted string.
    Str(String),
    /// One of `( ) { } < > ! = / ,` or the two-character `!= <= >= <> ><`.
    Punct(&'static str),
    Newline,
    Eof,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub tok: Tok,
    pub line: u32,
}

/// A lexing error, with the line it was found on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexError {
    pub line: u32,
    pub msg: String,
}

const PUNCT2: [&str; 6] = ["!=", "<=", ">=", "<>", "><", "->"];
const PUNCT1: [&str; 10] = ["(", ")", "{", "}", "<", ">", "!", "=", "/", ","];

/// Whether `s` reads back as one word (an interface name printed bare must).
pub fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| is_word_char(c) && c != '$')
}

#[inline]
fn is_word_char(c: char) -> bool {
    // A match, not a search of the marks' string: the lexer asks this of every character.
    !(c.is_whitespace() || matches!(c, '(' | ')' | '{' | '}' | '<' | '>' | '!' | '=' | '/' | '#' | ',' | '"' | '\''))
}

/// pf.conf's quoting cannot hold a string that ends in a backslash (`"\\"` is an escaped
/// quote): such a word would load but never print back as a ruleset that loads, so it is
/// refused where it is read.
fn unquotable(w: &str, line: u32) -> LexError {
    LexError { line, msg: format!("{w:?} ends in a backslash, which pf.conf cannot quote") }
}

/// Empties `toks`, keeping its words' buffers in `spare` for the next line's words.
pub fn recycle(toks: &mut Vec<Token>, spare: &mut Vec<String>) {
    for t in toks.drain(..) {
        if let Tok::Word(s) | Tok::Str(s) = t.tok {
            spare.push(s);
        }
    }
}

/// Macro uses a line may expand (one macro naming another counts each time): a definition
/// that names itself would expand forever.
const MAX_EXPANSIONS: u32 = 4096;

/// Inside a string quoted with `q`, whether a backslash before `next` stands for `next`
/// (pfctl: the quote, a space or a tab); any other backslash is itself.
#[inline(always)]
fn escaped(q: u8, next: Option<u8>) -> bool {
    next.is_some_and(|n| n == q || n == b' ' || n == b'\t')
}

/// The character at byte `i` of `s` (ASCII, nearly every one, without decoding).
#[inline(always)]
fn char_at(s: &str, i: usize) -> char {
    let b = s.as_bytes()[i];
    if b < 0x80 {
        b as char
    } else {
        s[i..].chars().next().unwrap_or('\0')
    }
}

/// Splits `src` into tokens, expanding `$macros` from `macros` (definitions met on the way are
/// not seen here: the parser lexes line by line and defines macros between lines).
/// Returns true if a comment started: the rest of the logical line, continued lines too, is
/// comment. Words take their buffers from `spare` (see [`recycle`]): a parse of a million
/// lines allocates no string per word.
pub fn lex_line(
    src: &str,
    line: u32,
    macros: &HashMap<String, String>,
    out: &mut Vec<Token>,
    spare: &mut Vec<String>,
) -> Result<bool, LexError> {
    // The line as it is, until a macro's value is put in front of what is left of it.
    let mut cs: Cow<str> = Cow::Borrowed(src);
    let mut expansions = 0;
    let mut i = 0;
    while i < cs.len() {
        let c = char_at(&cs, i);
        if c == '#' {
            return Ok(true);
        }
        if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        }
        // pfctl's lexer quotes with either mark; a string ends at the mark it began with.
        if c == '"' || c == '\'' {
            let mut s = String::new();
            i += 1;
            loop {
                if i >= cs.len() {
                    return Err(LexError { line, msg: "unterminated quote".into() });
                }
                let ch = char_at(&cs, i);
                if ch == c {
                    i += 1;
                    break;
                }
                let next = cs.as_bytes().get(i + 1).copied();
                if ch == '\\' && escaped(c as u8, next) {
                    s.push(next.unwrap_or(b' ') as char);
                    i += 2;
                    continue;
                }
                s.push(ch);
                i += ch.len_utf8();
            }
            // pfctl's lexer holds a token in 8,096 bytes.
            if s.len() >= 8096 {
                return Err(LexError { line, msg: "string too long\nsyntax error".into() });
            }
            if s.ends_with('\\') {
                return Err(unquotable(&s, line));
            }
            out.push(Token { tok: Tok::Str(s), line });
            continue;
        }
        if c == '$' {
            let start = i + 1;
            let b = cs.as_bytes();
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            let name = &cs[start..j];
            // Textual, as pfctl's lexer pushes the value back onto its input: `($if:0)` is
            // one word after the value, not the value and `:0`.
            match macros.get(name) {
                Some(v) => {
                    expansions += 1;
                    if expansions > MAX_EXPANSIONS {
                        return Err(LexError { line, msg: "macro expansion too deep".into() });
                    }
                    let mut rest = String::with_capacity(v.len() + cs.len() - j);
                    rest.push_str(v);
                    rest.push_str(&cs[j..]);
                    cs = Cow::Owned(rest);
                    i = 0;
                }
                None => return Err(LexError { line, msg: format!("macro '{name}' not defined") }),
            }
            continue;
        }
        if let Some(two) = cs.as_bytes().get(i..i + 2) {
            if let Some(p) = PUNCT2.iter().find(|p| p.as_bytes() == two) {
                out.push(Token { tok: Tok::Punct(p), line });
                i += 2;
                continue;
            }
        }
        if let Some(p) = PUNCT1.iter().find(|p| p.starts_with(c)) {
            out.push(Token { tok: Tok::Punct(p), line });
            i += 1;
            continue;
        }
        let start = i;
        while i < cs.len() {
            let ch = char_at(&cs, i);
            if !is_word_char(ch) || ch == '$' {
                break;
            }
            i += ch.len_utf8();
        }
        let w = &cs[start..i];
        if w.is_empty() {
            return Err(LexError { line, msg: format!("unexpected character '{c}'") });
        }
        if w.ends_with('\\') {
            return Err(unquotable(w, line));
        }
        let mut s = spare.pop().unwrap_or_default();
        s.clear();
        s.push_str(w);
        out.push(Token { tok: Tok::Word(s), line });
    }
    Ok(false)
}

/// Groups physical lines into logical ones (a backslash before the newline continues): each
/// logical line is its physical pieces with their line numbers, so that tokens keep the line
/// they stand on, as pfctl reports them. Comments are left for the lexer.
/// A quoted string may run over several lines, as in pfctl's lexer (a macro's list written
/// over lines, each ending in a backslash): its newlines, and a backslash before one, are not
/// part of it. A piece that ends inside a string is joined with the next, the string's first
/// line standing for both.
/// Borrowed from `src`, one logical line at a time (a piece is owned only where it was joined).
pub fn logical_lines(src: &str) -> LogicalLines<'_> {
    LogicalLines { lines: src.lines().enumerate(), cut: false }
}

/// [`logical_lines`]' iterator.
pub struct LogicalLines<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    cut: bool,
}

impl LogicalLines<'_> {
    /// Whether the source ended inside a logical line (its last line continued, or inside a
    /// quoted string): a piece of a file cut there is not the file's own lines.
    pub fn cut(&self) -> bool {
        self.cut
    }
}

impl<'a> Iterator for LogicalLines<'a> {
    type Item = Vec<(u32, Cow<'a, str>)>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut cur: Vec<(u32, Cow<str>)> = Vec::new();
        // The quote a joined piece is still inside, and whether a comment has begun.
        let mut quote = None;
        let mut comment = false;
        for (n, l) in self.lines.by_ref() {
            let n = n as u32 + 1;
            let (text, continued) = match l.strip_suffix('\\') {
                Some(t) => (t, true),
                None => (l, false),
            };
            let inside = quote;
            if !comment {
                (quote, comment) = scan_quotes(text, quote);
            }
            match (inside, cur.last_mut()) {
                (Some(_), Some((_, prev))) => prev.to_mut().push_str(text),
                _ => cur.push((n, Cow::Borrowed(text))),
            }
            if !continued && quote.is_none() {
                return Some(cur);
            }
        }
        self.cut |= !cur.is_empty();
        (!cur.is_empty()).then_some(cur)
    }
}

/// The quote still open at the end of `text` (given the one open at its start), and whether a
/// comment began outside quotes; the lexer's own reading of strings, without building them.
fn scan_quotes(text: &str, open: Option<char>) -> (Option<char>, bool) {
    // Bytes: every mark read here is ASCII, which no byte of a longer UTF-8 character equals.
    // (memchr: a 1.6M-rule ruleset has a label string on most lines.)
    let b = text.as_bytes();
    let mut open = open.map(|q| q as u8);
    let mut i = 0;
    loop {
        match open {
            None => match memchr::memchr3(b'"', b'\'', b'#', &b[i..]) {
                None => return (None, false),
                Some(j) if b[i + j] == b'#' => return (None, true),
                Some(j) => {
                    open = Some(b[i + j]);
                    i += j + 1;
                }
            },
            Some(q) => match memchr::memchr2(q, b'\\', &b[i..]) {
                None => return (open.map(char::from), false),
                Some(j) if b[i + j] == q => {
                    open = None;
                    i += j + 1;
                }
                Some(j) => i += j + 1 + escaped(q, b.get(i + j + 1).copied()) as usize,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str, m: &[(&str, &str)]) -> Result<Vec<Tok>, LexError> {
        let macros = m.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        let mut v = Vec::new();
        lex_line(s, 1, &macros, &mut v, &mut Vec::new())?;
        Ok(v.into_iter().map(|t| t.tok).collect())
    }

    #[test]
    fn single_quotes_quote_as_pfctl_reads_them() {
        let st = |s: &str| Tok::Str(s.into());
        assert_eq!(
            toks("load anchor 'a b' from '/etc/x.conf' label \"it's\"", &[]).unwrap(),
            vec![
                Tok::Word("load".into()),
                Tok::Word("anchor".into()),
                st("a b"),
                Tok::Word("from".into()),
                st("/etc/x.conf"),
                Tok::Word("label".into()),
                st("it's")
            ]
        );
        assert!(toks("label 'open", &[]).is_err());
    }

    #[test]
    fn words_punctuation_strings() {
        let w = |s: &str| Tok::Word(s.into());
        assert_eq!(
            toks("pass in from 10.0.0.0/8 port != 22 label \"a b\" # c", &[]).unwrap(),
            vec![
                w("pass"),
                w("in"),
                w("from"),
                w("10.0.0.0"),
                Tok::Punct("/"),
                w("8"),
                w("port"),
                Tok::Punct("!="),
                w("22"),
                w("label"),
                Tok::Str("a b".into())
            ]
        );
        assert_eq!(
            toks("{a,b}<t>", &[]).unwrap(),
            vec![
                Tok::Punct("{"),
                w("a"),
                Tok::Punct(","),
                w("b"),
                Tok::Punct("}"),
                Tok::Punct("<"),
                w("t"),
                Tok::Punct(">")
            ]
        );
        assert_eq!(toks("1:2 1><2", &[]).unwrap(), vec![w("1:2"), w("1"), Tok::Punct("><"), w("2")]);
    }

    #[test]
    fn macros_expand_and_relex() {
        let w = |s: &str| Tok::Word(s.into());
        assert_eq!(toks("on $ext", &[("ext", "em0")]).unwrap(), vec![w("on"), w("em0")]);
        assert_eq!(
            toks("port $p", &[("p", "{ 22 80 }")]).unwrap(),
            vec![w("port"), Tok::Punct("{"), w("22"), w("80"), Tok::Punct("}")]
        );
        assert_eq!(toks("$a", &[("a", "$b"), ("b", "x")]).unwrap(), vec![w("x")]);
        assert_eq!(toks("pass $nope", &[]).unwrap_err().msg, "macro 'nope' not defined");
        assert!(toks("$a", &[("a", "$a")]).is_err());
        // Textual: what follows the name joins the value's last word, as in pfctl.
        assert_eq!(toks("($ext:0)", &[("ext", "em0")]).unwrap(), vec![Tok::Punct("("), w("em0:0"), Tok::Punct(")")]);
        // Many macros on one line are not "too deep".
        let line = vec!["$p"; 100].join(" ");
        assert_eq!(toks(&line, &[("p", "22")]).unwrap().len(), 100);
        // Not expanded inside quotes.
        assert_eq!(toks("\"$x\"", &[]).unwrap(), vec![Tok::Str("$x".into())]);
    }

    /// A quoted macro written over several lines (as real rulesets write long port lists):
    /// pfctl leaves the newlines and the backslashes before them out of the string, and reads
    /// a backslash before a space or a tab as that character.
    #[test]
    fn a_quoted_string_runs_over_lines() {
        let src =
            "ports = \"{ 22, \\\n\t80,\t\\\n 443 }\"\nlbl = 'two\nlines' # it's\npass label \"a\\ b\" # \"\nblock\n";
        let l: Vec<_> = logical_lines(src).collect();
        assert_eq!(
            l,
            vec![
                vec![(1, "ports = \"{ 22, \t80,\t 443 }\"".into())],
                vec![(4, "lbl = 'twolines' # it's".into())],
                vec![(6, "pass label \"a\\ b\" # \"".into())],
                vec![(7, "block".into())],
            ]
        );
        assert_eq!(toks(&l[0][0].1, &[]).unwrap()[2], Tok::Str("{ 22, \t80,\t 443 }".into()));
        assert_eq!(toks(&l[2][0].1, &[]).unwrap()[2], Tok::Str("a b".into()));
        // A quote never closed takes the rest of the file and is refused at its first line.
        let l: Vec<_> = logical_lines("pass label \"open\nblock\n").collect();
        assert_eq!(l.len(), 1);
        assert_eq!(toks(&l[0][0].1, &[]).unwrap_err().msg, "unterminated quote");
    }

    /// Characters past ASCII in words and strings stay whole (the lexer walks bytes, decoding
    /// only those).
    #[test]
    fn characters_past_ascii_stay_whole() {
        let w = |s: &str| Tok::Word(s.into());
        assert_eq!(
            toks("pass label \"café ünï\" tag größe\u{a0}x $m", &[("m", "é")]).unwrap(),
            vec![w("pass"), w("label"), Tok::Str("café ünï".into()), w("tag"), w("größe"), w("x"), w("é")]
        );
    }

    #[test]
    fn continuation_joins_lines() {
        let l: Vec<_> = logical_lines("pass in \\\n  all\nblock\n").collect();
        assert_eq!(l, vec![vec![(1, "pass in ".into()), (2, "  all".into())], vec![(3, "block".into())]]);
    }
}
