//! Prompt and decode speed of the CPU engine: `engine_speed MODEL [THREADS] [PROMPT] [GEN]`.
//! Prints one line: `pp<PROMPT> <tok/s> tg<GEN> <tok/s>`. The prompt is fixed pseudo-random
//! token ids (speed does not depend on their values).

use std::time::Instant;

use smelt_engine::{argmax, Engine, EngineOptions, Logits, SeqInput};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args
        .get(1)
        .ok_or("usage: engine_speed MODEL [THREADS] [PROMPT] [GEN]")?;
    let threads: usize = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let n_prompt: usize = args.get(3).map_or(Ok(512), |s| s.parse())?;
    let n_gen: usize = args.get(4).map_or(Ok(128), |s| s.parse())?;
    let opts = EngineOptions {
        threads: Some(threads),
        kv_tokens: n_prompt + n_gen + 16,
        block_size: 16,
        ..EngineOptions::default()
    };
    let mut e = Engine::load(model.as_ref(), &opts)?;
    let n_vocab = e.info().n_vocab as u64;
    let prompt: Vec<u32> = (0..n_prompt as u64)
        .map(|i| ((i * 2654435761 + 17) % (n_vocab - 10)) as u32 + 5)
        .collect();

    // Warm up (page in the weights) on a throwaway sequence.
    let w = e.new_sequence();
    e.forward(&[SeqInput {
        seq: w,
        tokens: prompt[..n_prompt.min(32)].to_vec(),
        logits: Logits::Last,
    }])?;
    e.free_sequence(w);

    let s = e.new_sequence();
    let t = Instant::now();
    let out = e.forward(&[SeqInput {
        seq: s,
        tokens: prompt,
        logits: Logits::Last,
    }])?;
    let pp = t.elapsed().as_secs_f64();
    let mut next = argmax(&out[0][0]);
    let t = Instant::now();
    for _ in 0..n_gen {
        let out = e.forward(&[SeqInput {
            seq: s,
            tokens: vec![next],
            logits: Logits::Last,
        }])?;
        next = argmax(&out[0][0]);
    }
    let tg = t.elapsed().as_secs_f64();
    println!(
        "pp{n_prompt} {:.1} tg{n_gen} {:.1}",
        n_prompt as f64 / pp,
        n_gen as f64 / tg
    );
    Ok(())
}
