//! Arbitrary `config.json`, `tokenizer.json` and `model.safetensors` bytes through the
//! Hugging Face folder loader, as `smelt serve --model DIR` would read them. A folder may be
//! refused, but never with a panic, a hang or an allocation beyond the input's size; one that
//! converts must give a GGUF the reader accepts.
//!
//! Input: `[flags][u16 LE n][n bytes config.json][u16 LE m][m bytes tokenizer.json]
//! [safetensors]`. Without bit 0 of `flags` the folder has no tokenizer.json: the loader
//! then stops after config.json and the safetensors header, which keeps most runs fast (a
//! full conversion builds a tokenizer to name its pre-tokenizer, near a second under ASan).

#![no_main]

#[path = "common/alloc_limit.rs"]
mod alloc_limit;

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use smelt_gguf::Gguf;
use smelt_load::CpuQuantizer;

/// One folder per fuzzing process, rewritten for every input.
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("smelt-fuzz-hf-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a temporary folder");
        d
    })
}

fn take<'a>(data: &mut &'a [u8]) -> &'a [u8] {
    if data.len() < 2 {
        return std::mem::take(data);
    }
    let n = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
    let part = &data[2..2 + n];
    *data = &data[2 + n..];
    part
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, mut data)) = input.split_first() else {
        return;
    };
    let config = take(&mut data);
    let tokenizer = take(&mut data);
    let d = dir();
    std::fs::write(d.join("config.json"), config).unwrap();
    if flags & 1 == 1 {
        std::fs::write(d.join("tokenizer.json"), tokenizer).unwrap();
    } else {
        let _ = std::fs::remove_file(d.join("tokenizer.json"));
    }
    std::fs::write(d.join("model.safetensors"), data).unwrap();
    if let Ok(bytes) = smelt_load::to_bytes(d, None, &CpuQuantizer) {
        Gguf::from_bytes(bytes).expect("the converted GGUF reads back");
    }
});
