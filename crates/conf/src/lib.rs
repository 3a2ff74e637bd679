//! xpf-conf: pf.conf as OpenBSD's pfctl reads and prints it.
//!
//! [`lex`] splits a logical line into tokens, expanding macros; [`parse`] turns lines into
//! rules (expanding lists, inferring the address family, checking what pfctl checks, with
//! `FILE:LINE: message` errors in pfctl's words); [`print`] prints them in pfctl's canonical
//! form. The ruleset compiler and evaluation on the engine's descriptor come next
//! (docs/pfconf.md says what is covered).

pub mod ast;
pub mod lex;
pub mod names;
pub mod parse;
pub mod print;

pub use parse::{parse, ConfError, Parsed};
