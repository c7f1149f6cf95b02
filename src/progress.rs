//! A one-line progress bar on stderr for long work (loading, sampling steps, VAE tiles).
//! It redraws in place on a terminal and prints one line per 10% otherwise, so logs stay short.

use std::io::{IsTerminal, Write};
use std::time::Instant;

pub struct Progress {
    label: String,
    total: usize,
    done: usize,
    start: Instant,
    tty: bool,
    last_decile: usize,
}

impl Progress {
    pub fn new(label: &str, total: usize) -> Self {
        Self {
            label: label.to_string(),
            total: total.max(1),
            done: 0,
            start: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            last_decile: 0,
        }
    }

    /// Marks one more unit done and redraws.
    pub fn tick(&mut self) {
        self.set(self.done + 1);
    }

    pub fn set(&mut self, done: usize) {
        self.done = done.min(self.total);
        let elapsed = self.start.elapsed().as_secs_f64();
        let per = if self.done > 0 {
            elapsed / self.done as f64
        } else {
            0.0
        };
        let width = 30;
        let filled = self.done * width / self.total;
        let bar: String = "=".repeat(filled) + &" ".repeat(width - filled);
        let line = format!(
            "{} |{bar}| {}/{} - {:.2}s/it, {:.1}s",
            self.label, self.done, self.total, per, elapsed
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r{line}");
            if self.done == self.total {
                let _ = writeln!(err);
            }
        } else {
            let decile = self.done * 10 / self.total;
            if decile > self.last_decile || self.done == self.total {
                self.last_decile = decile;
                let _ = writeln!(err, "{line}");
            }
        }
        let _ = err.flush();
    }

    pub fn elapsed_secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}
