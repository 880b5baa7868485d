//! Records the git commit the binary is built from, for `smelt --version`. A build outside a
//! git checkout (a source tarball, no git installed) records nothing and still succeeds.

use std::path::Path;
use std::process::Command;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()?;
        let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !s.is_empty()).then_some(s)
    };
    // Rebuild when HEAD moves (a commit or a checkout): git names the files, which also
    // finds them in a worktree (where .git is a file). Only paths that exist are named: a
    // missing one would rerun this script on every build.
    println!("cargo:rerun-if-changed=build.rs");
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    let mut watched = 0;
    for what in ["HEAD", "packed-refs"]
        .into_iter()
        .map(str::to_string)
        .chain(branch)
    {
        if let Some(p) = git(&["rev-parse", "--git-path", &what]) {
            let p = root.join(p);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
                watched += 1;
            }
        }
    }
    // git failed (not installed, or refused the checkout for a moment): still watch the
    // checkout's HEAD where there is one, or this script's "unknown" would stay in every
    // later build of this configuration (cargo reruns it only for what it was told).
    if watched == 0 {
        for p in [root.join(".git/HEAD"), root.join(".git")] {
            if p.is_file() {
                println!("cargo:rerun-if-changed={}", p.display());
                break;
            }
        }
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_default();
    let date = git(&["log", "-1", "--format=%cs"]).unwrap_or_default();
    println!("cargo:rustc-env=SMELT_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SMELT_GIT_DATE={date}");
}
