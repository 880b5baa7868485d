//! The work `smelt bench` times, for one sequence or many (`--batch N`): every sequence's
//! prompt is prefilled in steps of at most `--ubatch` tokens (several sequences' prompts
//! share a step, as a serving engine packs them, and a long prompt never needs activations
//! for all its tokens at once), then every decode step runs all N sequences together in ONE
//! engine forward of N rows, feeding back each sequence's greedy token.
//!
//! Kept apart from the command's flags and report so the step plan can be tested alone and
//! the timing loop reads as what it measures.

use std::ops::Range;
use std::time::Instant;

use anyhow::{bail, Result};
use smelt_engine::{argmax, Engine, Logits, SeqId, SeqInput};

/// The deterministic prompt of sequence `i`: ordinary tokens that differ from sequence to
/// sequence (speed does not depend on which). Sequence 0's prompt is the same whatever the
/// batch, so its tokens can be compared across batch sizes.
pub fn prompt(i: usize, len: usize, n_vocab: usize) -> Vec<u32> {
    let n = n_vocab.max(1);
    (0..len)
        .map(|j| ((j * 7919 + 1000 + i * 104_729) % n) as u32)
        .collect()
}

/// One prefill step: for each sequence in it (index into the batch), the range of its
/// prompt the step feeds.
pub type PrefillStep = Vec<(usize, Range<usize>)>;

/// Packs the prompts (`lens[i]` tokens for sequence `i`) into steps of at most `ubatch`
/// tokens, in order: a step is filled with the next prompt's tokens until the budget is
/// spent, so short prompts share steps and a long one is cut into chunks.
pub fn prefill_plan(lens: &[usize], ubatch: usize) -> Vec<PrefillStep> {
    let ubatch = ubatch.max(1);
    let mut steps = Vec::new();
    let mut step: PrefillStep = Vec::new();
    let mut room = ubatch;
    for (i, &len) in lens.iter().enumerate() {
        let mut at = 0;
        while at < len {
            let n = room.min(len - at);
            step.push((i, at..at + n));
            at += n;
            room -= n;
            if room == 0 {
                steps.push(std::mem::take(&mut step));
                room = ubatch;
            }
        }
    }
    if !step.is_empty() {
        steps.push(step);
    }
    steps
}

/// How long one run took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The prompt phase: every prompt fed and every sequence's first token chosen (with
    /// one sequence, its time to first token).
    pub prompt_s: f64,
    /// The `gen` decode steps.
    pub decode_s: f64,
}

/// What one run produced besides its timing.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub timing: Timing,
    /// Per sequence, its greedy tokens: the one after the prompt, then one per decode step.
    pub tokens: Vec<Vec<u32>>,
}

/// One step over `inputs`: per input, the greedy token of its last row (`None` for
/// `Logits::None`), from the engine's greedy path or, with `host`, from logits on the host.
fn greedy_step(e: &mut Engine, inputs: &[SeqInput], host: bool) -> Result<Vec<Option<u32>>> {
    if !host {
        return Ok(e.forward_greedy(inputs)?);
    }
    Ok(e.forward(inputs)?
        .iter()
        .map(|rows| rows.last().map(|r| argmax(r)))
        .collect())
}

/// Prefills `prompts` on fresh sequences in steps of at most `ubatch` tokens, then runs
/// `gen` decode steps of one token per sequence, all sequences in each step. The sequences
/// are freed whatever happens.
pub fn run_once(
    e: &mut Engine,
    prompts: &[Vec<u32>],
    gen: usize,
    ubatch: usize,
    host: bool,
) -> Result<Run> {
    let seqs: Vec<SeqId> = prompts.iter().map(|_| e.new_sequence()).collect();
    let r = measure(e, &seqs, prompts, gen, ubatch, host);
    for &s in &seqs {
        e.free_sequence(s);
    }
    r
}

fn measure(
    e: &mut Engine,
    seqs: &[SeqId],
    prompts: &[Vec<u32>],
    gen: usize,
    ubatch: usize,
    host: bool,
) -> Result<Run> {
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    if lens.contains(&0) {
        bail!("every prompt needs at least one token");
    }
    let mut tokens: Vec<Vec<u32>> = vec![Vec::with_capacity(gen + 1); prompts.len()];
    let t = Instant::now();
    for step in prefill_plan(&lens, ubatch) {
        let inputs: Vec<SeqInput> = step
            .iter()
            .map(|(i, r)| SeqInput {
                seq: seqs[*i],
                tokens: prompts[*i][r.clone()].to_vec(),
                // Only a prompt's last chunk gives a token.
                logits: if r.end == lens[*i] {
                    Logits::Last
                } else {
                    Logits::None
                },
            })
            .collect();
        for ((i, _), next) in step.iter().zip(greedy_step(e, &inputs, host)?) {
            if let Some(next) = next {
                tokens[*i].push(next);
            }
        }
    }
    let prompt_s = t.elapsed().as_secs_f64();
    if let Some(i) = tokens.iter().position(|t| t.len() != 1) {
        bail!("the prompt phase gave sequence {i} no first token");
    }

    let t = Instant::now();
    for _ in 0..gen {
        let inputs: Vec<SeqInput> = seqs
            .iter()
            .zip(&tokens)
            .map(|(&seq, t)| SeqInput {
                seq,
                tokens: vec![t[t.len() - 1]],
                logits: Logits::Last,
            })
            .collect();
        let next = greedy_step(e, &inputs, host)?;
        for (t, n) in tokens.iter_mut().zip(next) {
            match n {
                Some(n) => t.push(n),
                None => bail!("a decode step gave a sequence no token"),
            }
        }
    }
    Ok(Run {
        timing: Timing {
            prompt_s,
            decode_s: t.elapsed().as_secs_f64(),
        },
        tokens,
    })
}

/// FNV-1a of a token list: a short fingerprint to compare sequences across runs.
pub fn digest(tokens: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_prompts_share_steps_and_long_ones_are_cut() {
        assert_eq!(
            prefill_plan(&[3, 3, 3], 4),
            vec![
                vec![(0, 0..3), (1, 0..1)],
                vec![(1, 1..3), (2, 0..2)],
                vec![(2, 2..3)],
            ]
        );
        assert_eq!(
            prefill_plan(&[10], 4),
            vec![vec![(0, 0..4)], vec![(0, 4..8)], vec![(0, 8..10)]]
        );
        assert_eq!(
            prefill_plan(&[4, 4], 4),
            vec![vec![(0, 0..4)], vec![(1, 0..4)]]
        );
    }

    #[test]
    fn every_token_is_fed_once_within_the_budget() {
        for ubatch in [1, 5, 7, 512] {
            let lens = [13, 1, 600, 8, 9];
            let plan = prefill_plan(&lens, ubatch);
            for step in &plan {
                let n: usize = step.iter().map(|(_, r)| r.len()).sum();
                assert!(n >= 1 && n <= ubatch, "{n} tokens in a step of {ubatch}");
            }
            for (i, &len) in lens.iter().enumerate() {
                let mut at = 0;
                for (_, r) in plan.iter().flatten().filter(|(j, _)| *j == i) {
                    assert_eq!(r.start, at, "sequence {i} fed out of order");
                    at = r.end;
                }
                assert_eq!(at, len, "sequence {i} not fed whole");
            }
        }
    }

    #[test]
    fn prompts_differ_by_sequence_and_stay_in_the_vocabulary() {
        let (a, b) = (prompt(0, 64, 1000), prompt(1, 64, 1000));
        assert_ne!(a, b);
        assert_eq!(a, prompt(0, 64, 1000));
        assert!(a.iter().chain(&b).all(|&t| t < 1000));
        assert_ne!(digest(&a), digest(&b));
    }
}
