//! Output files appear whole or not at all.
//!
//! Commands write `NAME.partial` beside the destination and rename it into place only
//! once every byte is written, so an interrupted or failed run never leaves a truncated
//! GGUF under the name a user (or llama.cpp) would load.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The temporary file of one output; removed on drop unless [`Partial::commit`] ran.
pub struct Partial {
    tmp: PathBuf,
    dest: PathBuf,
    done: bool,
}

impl Partial {
    pub fn new(dest: &Path) -> Partial {
        let mut name = dest
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(".partial");
        Partial {
            tmp: dest.with_file_name(name),
            dest: dest.to_path_buf(),
            done: false,
        }
    }

    /// Where to write.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished file to its destination.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.dest).with_context(|| {
            format!(
                "cannot move {} to {}",
                self.tmp.display(),
                self.dest.display()
            )
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            // Best effort: the file may never have been created.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_partials_vanish_and_committed_ones_move() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("model.gguf");
        let p = Partial::new(&dest);
        std::fs::write(p.path(), b"half").expect("write");
        drop(p);
        assert!(!dir.path().join("model.gguf.partial").exists());
        assert!(!dest.exists());

        let p = Partial::new(&dest);
        std::fs::write(p.path(), b"whole").expect("write");
        p.commit().expect("commit");
        assert_eq!(std::fs::read(&dest).expect("read"), b"whole");
    }
}
