//! How a decode step's cost grows with the batch: the number that decides what continuous
//! batching can gain. `cargo run --release -p smelt-server --example batch_speed -- MODEL.gguf`

use std::time::Instant;

use smelt_engine::{Engine, EngineOptions, Logits, SeqInput};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: batch_speed MODEL.gguf")?;
    let opts = EngineOptions {
        kv_tokens: 8192,
        ..EngineOptions::default()
    };
    let mut e = Engine::load(path.as_ref(), &opts)?;
    for batch in [1usize, 2, 4, 8, 16, 32] {
        let seqs: Vec<_> = (0..batch).map(|_| e.new_sequence()).collect();
        let prompt: Vec<SeqInput> = seqs
            .iter()
            .map(|&seq| SeqInput {
                seq,
                tokens: (1..=32).collect(),
                logits: Logits::None,
            })
            .collect();
        e.forward(&prompt)?;
        let steps = 16;
        let t0 = Instant::now();
        for i in 0..steps {
            let step: Vec<SeqInput> = seqs
                .iter()
                .map(|&seq| SeqInput {
                    seq,
                    tokens: vec![100 + i],
                    logits: Logits::Last,
                })
                .collect();
            e.forward(&step)?;
        }
        let dt = t0.elapsed().as_secs_f64() / steps as f64;
        println!(
            "batch {batch:>2}: {:.2} ms/step, {:.0} tokens/s",
            dt * 1e3,
            batch as f64 / dt
        );
        for s in seqs {
            e.free_sequence(s);
        }
    }
    Ok(())
}
