//! A bench step's progress on the terminal: a spinner with the step's name and the time it
//! has taken, ticking once a second (a thread that wakes once a second does not move the
//! figures); when stderr is not a terminal (CI logs, pipes), one line when the step starts and
//! its time when it ends.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A running step; finishes when dropped.
pub struct Step {
    bar: Option<ProgressBar>,
    msg: String,
    start: Instant,
}

/// Starts step `msg` (e.g. "9800 states: xpf").
pub fn step(msg: impl Into<String>) -> Step {
    let msg = msg.into();
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new_spinner();
        if let Ok(s) = ProgressStyle::with_template("  {spinner} {msg} {elapsed}") {
            b.set_style(s);
        }
        b.set_message(msg.clone());
        b.enable_steady_tick(Duration::from_secs(1));
        Some(b)
    } else {
        eprintln!("  {msg} ...");
        None
    };
    Step { bar, msg, start: Instant::now() }
}

impl Step {
    /// Prints `line` on stdout without tearing the spinner.
    pub fn println(&self, line: String) {
        match &self.bar {
            Some(b) => b.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        let took = self.start.elapsed().as_secs_f64();
        match self.bar.take() {
            Some(b) => b.finish_with_message(format!("{}: {took:.1} s", self.msg)),
            None if took >= 3.0 => eprintln!("  {}: {took:.1} s", self.msg),
            None => {}
        }
    }
}
