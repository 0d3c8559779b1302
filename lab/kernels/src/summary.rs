//! Adds up libtest's `test result:` lines into one `N passed, M failed` line.

use std::fmt;

/// Test counts, summed over test binaries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl Counts {
    /// One failure: a run that could not start or finish counts so.
    pub fn failed_run() -> Self {
        Self {
            failed: 1,
            ..Self::default()
        }
    }

    /// Adds the counts of one `test result:` line; other lines are ignored.
    pub fn add_line(&mut self, line: &str) {
        if let Some(counts) = parse_result_line(line) {
            *self += counts;
        }
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.ignored > 0 {
            write!(f, " ({} ignored)", self.ignored)?;
        }
        Ok(())
    }
}

/// `test result: ok. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; ...`.
fn parse_result_line(line: &str) -> Option<Counts> {
    let rest = line.trim().strip_prefix("test result: ")?;
    let (_verdict, fields) = rest.split_once(". ")?;
    let mut counts = Counts::default();
    for field in fields.split(';') {
        let mut words = field.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "passed" => counts.passed = n,
            "failed" => counts.failed = n,
            "ignored" => counts.ignored = n,
            _ => {}
        }
    }
    Some(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_result_lines_and_skips_the_rest() {
        let mut counts = Counts::default();
        for line in [
            "running 3 tests",
            "test a ... ok",
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            "test result: FAILED. 1 passed; 2 failed; 1 ignored; 0 measured; 4 filtered out; finished in 1.20s",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
        ] {
            counts.add_line(line);
        }
        assert_eq!(
            counts,
            Counts {
                passed: 4,
                failed: 2,
                ignored: 1
            }
        );
        assert_eq!(counts.to_string(), "4 passed, 2 failed (1 ignored)");
    }

    #[test]
    fn prints_the_plain_form_without_ignored() {
        let counts = Counts {
            passed: 7,
            failed: 0,
            ignored: 0,
        };
        assert_eq!(counts.to_string(), "7 passed, 0 failed");
    }
}
