//! Replay's progress on a terminal: requests read so far, files done and
//! requests per second, on one line of stderr redrawn in place (`\r`) at
//! most four times a second and cleared at the end. When stderr is not a
//! terminal nothing is written (pipes, logs and tests see the report
//! alone).

use std::io::Write;
use std::time::{Duration, Instant};

/// Time between two redraws.
const EVERY: Duration = Duration::from_millis(250);

pub struct Progress {
    enabled: bool,
    started: Instant,
    /// When the line was last drawn.
    drawn_at: Option<Instant>,
    /// The width of the line on screen (spaces clear it).
    width: usize,
}

impl Progress {
    /// Progress shown on a terminal when `enabled`, else nothing.
    pub fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            started: Instant::now(),
            drawn_at: None,
            width: 0,
        }
    }

    /// While the inputs are opened (HAR files and tap traces are read
    /// then): `done` of `total` files.
    pub fn opening(&mut self, err: &mut dyn Write, done: usize, total: usize) {
        if self.due(Instant::now()) {
            self.draw(err, &format!("replay: opening files: {done}/{total}"));
        }
    }

    /// While requests are replayed: `read` requests (and `skipped`
    /// entries) so far, `done` of `total` files read to their end.
    pub fn reading(
        &mut self,
        err: &mut dyn Write,
        read: u64,
        skipped: u64,
        done: usize,
        total: usize,
    ) {
        let now = Instant::now();
        if self.due(now) {
            let line = reading_line(read, skipped, done, total, now - self.started);
            self.draw(err, &line);
        }
    }

    /// Clear the line (the report follows on a clean terminal).
    pub fn clear(&mut self, err: &mut dyn Write) {
        if self.enabled && self.width > 0 {
            let _ = write!(err, "\r{}\r", " ".repeat(self.width));
            let _ = err.flush();
            self.width = 0;
        }
    }

    /// Whether to draw at `now`: enabled, and the last drawing is old
    /// enough.
    fn due(&self, now: Instant) -> bool {
        self.enabled
            && self
                .drawn_at
                .is_none_or(|at| now.saturating_duration_since(at) >= EVERY)
    }

    fn draw(&mut self, err: &mut dyn Write, line: &str) {
        let width = line.chars().count();
        // Pad over what a longer line before it left.
        let pad = self.width.saturating_sub(width);
        let _ = write!(err, "\r{line}{}", " ".repeat(pad));
        let _ = err.flush();
        self.width = width.max(self.width);
        self.drawn_at = Some(Instant::now());
    }
}

/// The line while reading, `elapsed` after the start.
fn reading_line(read: u64, skipped: u64, done: usize, total: usize, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        (read as f64 / secs).round()
    } else {
        0.0
    };
    let skipped = if skipped > 0 {
        format!(" ({} skipped)", thousands(skipped))
    } else {
        String::new()
    };
    format!(
        "replay: {} requests read{skipped}, files {done}/{total}, {} requests/s",
        thousands(read),
        thousands(rate as u64)
    )
}

/// 1234567 -> "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_written_when_not_on_a_terminal() {
        let mut p = Progress::new(false);
        let mut err = Vec::new();
        p.opening(&mut err, 1, 2);
        p.reading(&mut err, 10, 1, 1, 2);
        p.clear(&mut err);
        assert!(err.is_empty());
    }

    #[test]
    fn the_line_is_redrawn_in_place_at_most_four_times_a_second_and_cleared() {
        let mut p = Progress::new(true);
        let mut err = Vec::new();
        p.opening(&mut err, 1, 3);
        // Drawn just now: the next calls wait their turn.
        for n in 0..1000 {
            p.reading(&mut err, n, 0, 0, 3);
        }
        let text = String::from_utf8(err.clone()).unwrap();
        assert_eq!(text, "\rreplay: opening files: 1/3");
        p.drawn_at = Some(Instant::now() - EVERY);
        p.reading(&mut err, 1000, 2, 1, 3);
        let text = String::from_utf8(err.clone()).unwrap();
        let last = text.rsplit('\r').next().unwrap();
        assert!(
            last.starts_with("replay: 1,000 requests read (2 skipped), files 1/3, "),
            "{text:?}"
        );
        assert!(last.ends_with(" requests/s"), "{text:?}");
        p.clear(&mut err);
        let text = String::from_utf8(err).unwrap();
        let width = last.chars().count();
        assert!(
            text.ends_with(&format!("\r{}\r", " ".repeat(width))),
            "{text:?}"
        );
    }

    #[test]
    fn a_shorter_line_covers_the_longer_one_before_it() {
        let mut p = Progress::new(true);
        let mut err = Vec::new();
        p.draw(&mut err, "0123456789");
        p.draw(&mut err, "abc");
        assert_eq!(String::from_utf8(err).unwrap(), "\r0123456789\rabc       ");
    }

    #[test]
    fn figures_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(12_345_678), "12,345,678");
        assert_eq!(
            reading_line(5000, 0, 2, 4, Duration::from_secs(2)),
            "replay: 5,000 requests read, files 2/4, 2,500 requests/s"
        );
        assert_eq!(
            reading_line(0, 0, 0, 1, Duration::ZERO),
            "replay: 0 requests read, files 0/1, 0 requests/s"
        );
    }
}
