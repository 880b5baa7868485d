//! Writes the demo kernels' PTX, one file per target, to read or to feed ptxas by hand:
//! `cargo run -p smelt-ptx --example emit_ptx -- target/ptx`.

use std::path::PathBuf;

use smelt_ptx::{demo, Target};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/ptx".into()),
    );
    std::fs::create_dir_all(&dir)?;
    for target in [Target::Sm80, Target::Sm90] {
        let path = dir.join(format!("demo_{target}.ptx"));
        std::fs::write(&path, demo::module(target)?.to_ptx())?;
        println!("{}", path.display());
    }
    Ok(())
}
