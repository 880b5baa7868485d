//! What a step's output does: every sequence given a row picks its next token (from its
//! logits, through its constraint and sampler, or the engine's greedy choice), the token's
//! text and log-probability go to its handler, and the sequences that ended leave the
//! batch with their last event. Split from the scheduler's loop, which runs the step: a
//! second `impl` block of [`Scheduler`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use smelt_engine::generate::{FinishReason, TokenText};
use smelt_engine::{Logits, SeqInput};

use super::constrain::{constrain, token_logprob};
use super::{Event, Scheduler, StepEngine, StepOut};
use crate::error::ApiError;

/// What one sequence's next token comes from.
enum Pick {
    /// Its last row's logits, for its sampler.
    Logits(Vec<f32>),
    /// The engine's greedy choice.
    Token(u32),
}

impl<E: StepEngine, T: TokenText> Scheduler<E, T> {
    pub(super) fn consume(&mut self, inputs: &[SeqInput], owners: &[usize], out: StepOut) {
        let mut done = Vec::new();
        let picks: Vec<Option<Pick>> = match out {
            StepOut::Logits(rows) => rows
                .into_iter()
                .zip(inputs.iter().zip(owners))
                .map(|(mut r, (inp, &i))| {
                    if inp.logits == Logits::All {
                        self.prompt_logprobs(i, &r);
                        // Only the prompt's last row picks a token.
                        if self.running[i].fed + inp.tokens.len() < self.running[i].context.len() {
                            return None;
                        }
                    }
                    r.pop().map(Pick::Logits)
                })
                .collect(),
            StepOut::Tokens(t) => t.into_iter().map(|t| t.map(Pick::Token)).collect(),
        };
        for ((inp, &i), pick) in inputs.iter().zip(owners).zip(picks) {
            let a = &mut self.running[i];
            a.fed += inp.tokens.len();
            let Some(pick) = pick else {
                continue;
            };
            if !a.sent_prompt && a.job.constraint.prompt_logprobs.is_some() {
                a.sent_prompt = true;
                let lps = std::mem::take(&mut a.prompt_lps);
                if a.job.events.send(Event::Prompt(lps)).is_err() {
                    done.push((i, End::Gone));
                    continue;
                }
            }
            if a.job.max_tokens == 0 {
                // Scoring only (echo with max_tokens 0): the prompt was the answer.
                done.push((i, End::Finished(FinishReason::Length)));
                continue;
            }
            if let Some(end) = self.next_token(i, &pick) {
                done.push((i, end));
            }
        }
        // Highest index first so the earlier indices stay valid.
        done.sort_by_key(|d| std::cmp::Reverse(d.0));
        for (i, end) in done {
            let a = self.running.remove(i);
            match end {
                End::Finished(reason) => {
                    tracing::info!(
                        model = %self.name,
                        prompt_tokens = a.job.prompt.len(),
                        completion_tokens = a.generated,
                        finish = reason.as_str(),
                        seconds = a.job.arrived.elapsed().as_secs_f64(),
                        "request done"
                    );
                    let _ = a.job.events.send(Event::Done {
                        finish_reason: reason,
                        prompt_tokens: a.job.prompt.len(),
                        completion_tokens: a.generated,
                    });
                    self.release(a);
                }
                End::Gone => self.release_gone(a),
                End::Failed(why) => {
                    tracing::error!(model = %self.name, "constrained sampling failed: {why}");
                    self.finish_err(a, ApiError::internal(why));
                }
            }
        }
    }

    /// Scores the prompt tokens that `rows` (one per token just fed to running sequence `i`,
    /// from `fed` on) predict, as `smelt perplexity` does.
    fn prompt_logprobs(&mut self, i: usize, rows: &[Vec<f32>]) {
        let tok = Arc::clone(&self.tok);
        let a = &mut self.running[i];
        let top = a.job.constraint.prompt_logprobs.unwrap_or(0);
        if a.fed == 0 {
            a.prompt_lps.clear();
            if let Some(&first) = a.job.prompt.first() {
                a.prompt_lps.push((tok.token_bytes(first), None));
            }
        }
        for (j, row) in rows.iter().enumerate() {
            let next = a.fed + j + 1;
            if let Some(&t) = a.job.prompt.get(next) {
                let lp = token_logprob(row, t, top, &*tok);
                a.prompt_lps.push((lp.bytes.clone(), Some(lp)));
            }
        }
    }

    /// Samples the next token of running sequence `i` exactly as `generate` does (or takes
    /// the engine's greedy pick), sends it, and says whether the sequence ended.
    fn next_token(&mut self, i: usize, pick: &Pick) -> Option<End> {
        let tok = Arc::clone(&self.tok);
        let tok = &*tok;
        let stats = Arc::clone(&self.stats);
        let a = &mut self.running[i];
        let (next, logits) = match pick {
            Pick::Logits(l)
                if a.job.constraint.grammar.is_some()
                    || !a.job.constraint.logit_bias.is_empty() =>
            {
                let mut biased = l.clone();
                let t0 = Instant::now();
                if let Err(e) = constrain(&mut a.job.constraint, &mut biased) {
                    return Some(End::Failed(e));
                }
                if a.job.constraint.grammar.is_some() {
                    // The mask's own time (beside the forward) and applying it here.
                    let us = t0.elapsed().as_micros() as u64
                        + std::mem::take(&mut a.job.constraint.mask_us);
                    stats.grammar_masks.fetch_add(1, Ordering::Relaxed);
                    stats.grammar_mask_us.fetch_add(us, Ordering::Relaxed);
                }
                let next = a.sampler.sample(&biased, &a.context);
                // An end-of-generation token ends the answer: the grammar need not see it.
                if let Some(g) = a
                    .job
                    .constraint
                    .grammar
                    .as_mut()
                    .filter(|_| !tok.is_eog(next))
                {
                    if let Err(e) = g.consume_token(next) {
                        return Some(End::Failed(format!("the grammar rejected a token: {e}")));
                    }
                }
                (next, Some(l.as_slice()))
            }
            Pick::Logits(l) => (a.sampler.sample(l, &a.context), Some(l.as_slice())),
            Pick::Token(t) => (*t, None),
        };
        let now = Instant::now();
        match a.last_token_at {
            None => stats
                .ttft
                .observe(now.duration_since(a.job.arrived).as_secs_f64()),
            Some(t) => stats.itl.observe(now.duration_since(t).as_secs_f64()),
        }
        a.last_token_at = Some(now);
        a.generated += 1;
        a.context.push(next);
        stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let logprob = match (a.job.logprobs, logits) {
            (Some(top), Some(l)) => Some(token_logprob(l, next, top, tok)),
            _ => None,
        };
        let (text, end) = if !a.job.ignore_eog && tok.is_eog(next) {
            (a.text.finish(), Some(FinishReason::Eog))
        } else {
            let (mut delta, stopped) = a.text.push(&tok.token_bytes(next));
            if stopped {
                (delta, Some(FinishReason::Stop))
            } else if a.generated >= a.job.max_tokens {
                delta.push_str(&a.text.finish());
                (delta, Some(FinishReason::Length))
            } else {
                (delta, None)
            }
        };
        let sent = a.job.events.send(Event::Token {
            id: next,
            text,
            logprob,
        });
        match (sent, end) {
            (Err(_), _) => Some(End::Gone),
            (Ok(()), Some(r)) => Some(End::Finished(r)),
            (Ok(()), None) => None,
        }
    }
}

enum End {
    Finished(FinishReason),
    /// The client went away while we sent.
    Gone,
    /// Constrained sampling could not go on (a grammar error).
    Failed(String),
}
