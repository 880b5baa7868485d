//! Bit-for-bit fingerprint of the CPU engine's logits: `logits_digest MODEL [THREADS]`.
//!
//! Runs fixed scenarios (a long prompt then greedy decode past 512 positions, so Gemma's
//! sliding window bites; a prompt fed in uneven chunks; two sequences of different lengths
//! in one batch, prefill and decode mixed) and prints one FNV-1a hash of every logit's bits
//! per scenario. Two builds whose lines are equal compute identical logits: a change to the
//! CPU kernels that must keep llama.cpp's bits is checked against the build before it
//! (where llama.cpp itself cannot run, e.g. a CPU without the AVX-512 its oracle build uses).

use smelt_engine::{argmax, Engine, EngineOptions, Logits, SeqInput};

/// FNV-1a over the bits of every value.
struct Digest(u64);

impl Digest {
    fn add(&mut self, rows: &[Vec<f32>]) {
        for row in rows {
            for v in row {
                for b in v.to_bits().to_le_bytes() {
                    self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
                }
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).ok_or("usage: logits_digest MODEL [THREADS]")?;
    let threads: usize = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let opts = EngineOptions {
        threads: Some(threads),
        kv_tokens: 2048,
        block_size: 16,
        ..EngineOptions::default()
    };
    let mut e = Engine::load(model.as_ref(), &opts)?;
    let n_vocab = e.info().n_vocab as u64;
    let ids = |n: usize, salt: u64| -> Vec<u32> {
        (0..n as u64)
            .map(|i| (((i + salt) * 2654435761 + 17) % (n_vocab - 10)) as u32 + 5)
            .collect()
    };
    let step = |e: &mut Engine,
                batch: &[SeqInput],
                d: &mut Digest|
     -> Result<Vec<u32>, Box<dyn std::error::Error>> {
        let out = e.forward(batch)?;
        let mut next = Vec::new();
        for rows in &out {
            d.add(rows);
            if let Some(last) = rows.last() {
                next.push(argmax(last));
            }
        }
        Ok(next)
    };

    // 1. A 530-token prompt, every row's logits, then 40 greedy steps (positions past 512).
    let mut d = Digest(0xcbf2_9ce4_8422_2325);
    let s = e.new_sequence();
    let mut next = step(
        &mut e,
        &[SeqInput {
            seq: s,
            tokens: ids(530, 1),
            logits: Logits::All,
        }],
        &mut d,
    )?;
    for _ in 0..40 {
        next = step(
            &mut e,
            &[SeqInput {
                seq: s,
                tokens: vec![next[0]],
                logits: Logits::Last,
            }],
            &mut d,
        )?;
    }
    e.free_sequence(s);
    println!("long prompt + decode: {:016x}", d.0);

    // 2. A prompt in uneven chunks (batched attention from a nonzero start).
    let mut d = Digest(0xcbf2_9ce4_8422_2325);
    let s = e.new_sequence();
    let p = ids(300, 7);
    for (a, b) in [(0, 37), (37, 38), (38, 138), (138, 140), (140, 300)] {
        step(
            &mut e,
            &[SeqInput {
                seq: s,
                tokens: p[a..b].to_vec(),
                logits: Logits::All,
            }],
            &mut d,
        )?;
    }
    e.free_sequence(s);
    println!("chunked prompt: {:016x}", d.0);

    // 3. Two sequences in one batch: one decoding while the other fills, then both decode.
    let mut d = Digest(0xcbf2_9ce4_8422_2325);
    let (a, b) = (e.new_sequence(), e.new_sequence());
    let na = step(
        &mut e,
        &[SeqInput {
            seq: a,
            tokens: ids(90, 3),
            logits: Logits::Last,
        }],
        &mut d,
    )?;
    let mut n = step(
        &mut e,
        &[
            SeqInput {
                seq: a,
                tokens: vec![na[0]],
                logits: Logits::Last,
            },
            SeqInput {
                seq: b,
                tokens: ids(45, 11),
                logits: Logits::All,
            },
        ],
        &mut d,
    )?;
    for _ in 0..12 {
        n = step(
            &mut e,
            &[
                SeqInput {
                    seq: a,
                    tokens: vec![n[0]],
                    logits: Logits::Last,
                },
                SeqInput {
                    seq: b,
                    tokens: vec![n[1]],
                    logits: Logits::Last,
                },
            ],
            &mut d,
        )?;
    }
    println!("two sequences: {:016x}", d.0);
    Ok(())
}
