//! Times tokenizer construction and encoding on a GGUF: `cargo run --release -p
//! smelt-tokenizer --example tokenize_speed -- MODEL.gguf [TEXT_FILE]`.

use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: tokenize_speed MODEL.gguf [TEXT_FILE]")?;
    let t0 = Instant::now();
    let gguf = smelt_gguf::Gguf::open(&path)?;
    let t1 = Instant::now();
    let tok = smelt_tokenizer::Tokenizer::from_gguf(gguf.metadata())?;
    let t2 = Instant::now();
    println!(
        "open {:?}, tokenizer {:?} ({} tokens)",
        t1 - t0,
        t2 - t1,
        tok.n_vocab()
    );
    let text = match args.next() {
        Some(f) => std::fs::read_to_string(f)?,
        None => {
            "The quick brown fox jumps over the lazy dog. It's 3:45pm; naïve café, 東京 42 °C!\n"
                .repeat(2000)
        }
    };
    for parse_special in [false, true] {
        let t = Instant::now();
        let ids = tok.encode(&text, true, parse_special);
        let dt = t.elapsed();
        println!(
            "encode {} bytes (parse_special={parse_special}): {} ids in {dt:?} ({:.1} MB/s)",
            text.len(),
            ids.len(),
            text.len() as f64 / dt.as_secs_f64() / 1e6
        );
    }
    let ids = tok.encode(&text, false, false);
    let t = Instant::now();
    let back = tok.decode(&ids);
    println!(
        "decode {} ids in {:?} (round trip {})",
        ids.len(),
        t.elapsed(),
        back == text
    );
    Ok(())
}
