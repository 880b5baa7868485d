//! The progress bar long-running commands draw on stderr: smelt-load's, so loads,
//! conversions and quantizations look alike.

use indicatif::ProgressBar;

/// A byte-counting bar, hidden when stderr is not a terminal (logs, CI, tests) so
/// redirected output stays clean ([`smelt_load::bytes_bar`]).
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    smelt_load::bytes_bar(total, what)
}
