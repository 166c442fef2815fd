//! Results of the kit's checks.

use std::fmt;

/// How one check ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The backend behaved as the contract says.
    Passed,
    /// It did not; the text says how.
    Failed(String),
    /// The check does not apply to this backend (e.g. no events); the text says why.
    Skipped(String),
}

/// One named check and its outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// What was checked, e.g. `"buffer/size-0"`.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// The outcome of a group of checks.
///
/// ```
/// use conformance::{Outcome, Report};
/// let mut r = Report::default();
/// r.push("a", Ok(()));
/// r.push("b", Err("wrong bytes".to_owned()));
/// assert_eq!(r.failed().count(), 1);
/// assert!(r.to_string().contains("FAIL b: wrong bytes"));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Every check, in the order run.
    pub checks: Vec<Check>,
}

impl Report {
    /// Record a check from a result (`Err` = failed with that message).
    pub fn push(&mut self, name: &str, r: Result<(), String>) {
        self.checks.push(Check {
            name: name.to_owned(),
            outcome: match r {
                Ok(()) => Outcome::Passed,
                Err(e) => Outcome::Failed(e),
            },
        });
    }
    /// Record a skipped check.
    pub fn skip(&mut self, name: &str, why: &str) {
        self.checks.push(Check {
            name: name.to_owned(),
            outcome: Outcome::Skipped(why.to_owned()),
        });
    }
    /// The failed checks.
    pub fn failed(&self) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }
    /// Whether nothing failed.
    pub fn passed(&self) -> bool {
        self.failed().next().is_none()
    }
    /// For tests: panic with the full report if any check failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(self.passed(), "conformance checks failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            match &c.outcome {
                Outcome::Passed => writeln!(f, "ok   {}", c.name)?,
                Outcome::Failed(m) => writeln!(f, "FAIL {}: {m}", c.name)?,
                Outcome::Skipped(m) => writeln!(f, "skip {}: {m}", c.name)?,
            }
        }
        Ok(())
    }
}
