//! The progress bar long-running commands draw on stderr.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A byte-counting bar, hidden when stderr is not a terminal (logs, CI, tests) so
/// redirected output stays clean.
pub fn bytes_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{prefix} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta}) {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(what.to_string());
    bar
}
