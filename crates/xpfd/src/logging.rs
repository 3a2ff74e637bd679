//! xpfd's own messages: levelled (the `log` facade), to stderr by default (a line each:
//! `xpfd: LEVEL: message`, or a JSON object with `--log-format json`), or to syslog with
//! `--syslog` (facility daemon, through the `syslog` crate; journald reads /dev/log too).
//!
//! The level is pf's debug level: `--log-level`, then pf.conf's `set debug` at each load, then
//! `xpfctl -x` at run time; pf's names (syslog's: emerg .. debug, and the older none, urgent,
//! misc, loud) map onto the facade's levels.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::io::Write;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

enum Sink {
    Stderr(Format),
    Syslog(Mutex<syslog::Logger<syslog::LoggerBackend, syslog::Formatter3164>>),
}

struct Logger {
    sink: Sink,
}

fn json_escape(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        match &self.sink {
            Sink::Stderr(Format::Text) => {
                // One write per message, so that threads' lines do not interleave.
                let line = format!("xpfd: {}: {msg}\n", name(r.level()));
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            Sink::Stderr(Format::Json) => {
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let line = format!(
                    "{{\"ts\":{}.{:03},\"level\":\"{}\",\"msg\":{}}}\n",
                    t.as_secs(),
                    t.subsec_millis(),
                    name(r.level()),
                    json_escape(&msg)
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            Sink::Syslog(l) => {
                let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
                let _ = match r.level() {
                    Level::Error => l.err(msg),
                    Level::Warn => l.warning(msg),
                    Level::Info => l.info(msg),
                    Level::Debug | Level::Trace => l.debug(msg),
                };
            }
        }
    }

    fn flush(&self) {}
}

/// The level's name as pf's `set debug` spells it.
fn name(l: Level) -> &'static str {
    match l {
        Level::Error => "err",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug | Level::Trace => "debug",
    }
}

/// pf's debug level names (`set debug`, `pfctl -x`) as the facade's filter.
pub fn level_of(s: &str) -> Option<LevelFilter> {
    Some(match s {
        "emerg" | "alert" | "crit" | "err" | "none" | "urgent" => LevelFilter::Error,
        "warning" | "misc" => LevelFilter::Warn,
        "notice" | "info" => LevelFilter::Info,
        "debug" | "loud" => LevelFilter::Debug,
        _ => return None,
    })
}

/// The level in force, by pf's name.
pub fn level_name() -> &'static str {
    match log::max_level() {
        LevelFilter::Off | LevelFilter::Error => "err",
        LevelFilter::Warn => "warning",
        LevelFilter::Info => "info",
        LevelFilter::Debug | LevelFilter::Trace => "debug",
    }
}

/// Installs the logger (once, at start).
pub fn init(syslog: bool, format: Format, level: LevelFilter) -> Result<(), String> {
    let sink = if syslog {
        let f = syslog::Formatter3164 {
            facility: syslog::Facility::LOG_DAEMON,
            hostname: None,
            process: "xpfd".into(),
            pid: std::process::id(),
        };
        Sink::Syslog(Mutex::new(syslog::unix(f).map_err(|e| format!("--syslog: {e}"))?))
    } else {
        Sink::Stderr(format)
    };
    log::set_boxed_logger(Box::new(Logger { sink })).map_err(|e| e.to_string())?;
    log::set_max_level(level);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pf_debug_names_map_to_levels() {
        assert_eq!(level_of("crit"), Some(LevelFilter::Error));
        assert_eq!(level_of("urgent"), Some(LevelFilter::Error));
        assert_eq!(level_of("misc"), Some(LevelFilter::Warn));
        assert_eq!(level_of("notice"), Some(LevelFilter::Info));
        assert_eq!(level_of("loud"), Some(LevelFilter::Debug));
        assert_eq!(level_of("verbose"), None);
        assert_eq!(json_escape("a \"b\"\n"), "\"a \\\"b\\\"\\n\"");
    }
}
