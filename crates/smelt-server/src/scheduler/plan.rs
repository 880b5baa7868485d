//! What a step feeds: the plan of one batched forward (a token for every decoding
//! sequence, then prefill chunks in admission order within the step's token budget), and
//! the rules that keep an answer's bits on an engine whose lone-token rows differ
//! ([`chunk_len`], and which cached prefix a newly admitted sequence attaches). Split from
//! the scheduler's loop, which runs the plan: a second `impl` block of [`Scheduler`].

use smelt_engine::generate::TokenText;
use smelt_engine::{Logits, SeqInput};

use super::{Active, Scheduler, StepEngine};

impl<E: StepEngine, T: TokenText> Scheduler<E, T> {
    /// This step's inputs: one token for every decoding sequence, then prefill chunks in
    /// admission order within the step's token budget. `owners[i]` is the running index of
    /// `inputs[i]`.
    pub(super) fn plan(&self) -> (Vec<SeqInput>, Vec<usize>) {
        let mut inputs = Vec::new();
        let mut owners = Vec::new();
        let mut decodes = 0;
        for (i, a) in self.running.iter().enumerate() {
            let Some(seq) = a.seq else { continue };
            if a.generated > 0 && a.remaining() == 1 {
                inputs.push(SeqInput {
                    seq,
                    tokens: vec![a.context[a.fed]],
                    logits: Logits::Last,
                });
                owners.push(i);
                decodes += 1;
            }
        }
        // At least a little prefill each step (up to 16 tokens past the budget when decodes
        // alone fill it), so new requests start even under a full decode load.
        let mut budget = match self.cfg.step_tokens.checked_sub(decodes) {
            Some(left) if left > 0 => left,
            _ => self.cfg.step_tokens.clamp(1, 16),
        };
        for (i, a) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let Some(seq) = a.seq else { continue };
            if a.generated > 0 && a.remaining() == 1 {
                continue;
            }
            let n = match self.lone_rows_differ {
                true => chunk_len(a.fed, a.job.prompt.len(), budget),
                false => a.remaining().min(budget),
            };
            let last = a.fed + n == a.context.len();
            let all = a.job.constraint.prompt_logprobs.is_some() && !a.sent_prompt;
            inputs.push(SeqInput {
                seq,
                tokens: a.context[a.fed..a.fed + n].to_vec(),
                logits: if all {
                    Logits::All
                } else if last {
                    Logits::Last
                } else {
                    Logits::None
                },
            });
            owners.push(i);
            budget = budget.saturating_sub(n);
        }
        (inputs, owners)
    }

    /// Attaches a newly admitted sequence to the cached blocks its context begins with; the
    /// tokens they hold. Where lone-token rows differ, what is left of a longer prompt is
    /// never a single token (it would be summed in the other order than when the prompt
    /// came whole): the lookup stops a token earlier, and a recomputed sequence whose cached
    /// blocks end one token short of its prompt's end starts again without them.
    pub(super) fn attach_prefix(&mut self, a: &mut Active) -> usize {
        let Some(seq) = a.seq else { return 0 };
        let prompt = a.job.prompt.len();
        if !self.lone_rows_differ || prompt < 2 {
            return self.engine.attach_prefix(seq, &a.context);
        }
        if a.context.len() == prompt {
            return self.engine.attach_prefix(seq, &a.context[..prompt - 1]);
        }
        let n = self.engine.attach_prefix(seq, &a.context);
        if n != prompt - 1 {
            return n;
        }
        self.engine.free_sequence(seq);
        let seq = self.engine.new_sequence();
        a.seq = Some(seq);
        self.engine.attach_prefix(seq, &a.context[..prompt - 1])
    }
}

/// The next chunk of a sequence reading its context, `fed` tokens of it in the cache, on an
/// engine whose lone-token rows differ: as [`Scheduler::plan`]'s budget allows, but never a
/// single token of a prompt longer than that, nor leaving one behind (up to two tokens past
/// the budget rather than that); and a preempted sequence's generated tokens one per step, as
/// they were fed when they were sampled. So every row is summed in the order it had the first
/// time, and the answer keeps its bits through preemption and any chunking.
pub(super) fn chunk_len(fed: usize, prompt: usize, budget: usize) -> usize {
    if fed >= prompt {
        return 1;
    }
    let left = prompt - fed;
    match left.min(budget) {
        n if n == left || (n >= 2 && left - n >= 2) => n,
        n if n >= 3 => n - 1,
        _ if left == 3 => 3,
        _ => 2,
    }
}
