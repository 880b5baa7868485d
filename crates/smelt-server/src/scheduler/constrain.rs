//! What a job asks of sampling beyond its parameters, and the log-probabilities it reports:
//! logit biases and grammar masks applied to a step's logits, prompt and token
//! log-probabilities as `smelt perplexity` computes them. Split from the scheduler's loop.

use smelt_engine::generate::TokenText;
use smelt_engine::sampler::LogNorm;

use super::TokenLogprob;

/// What a request asks beyond sampling parameters: each needs the step's logits (never the
/// engine's greedy shortcut).
#[derive(Default)]
pub struct Constraint {
    /// Added to these tokens' logits before sampling; -100 bans a token outright.
    pub logit_bias: Vec<(u32, f32)>,
    /// Only tokens this grammar allows are sampled (structured output, forced tool calls).
    pub grammar: Option<Box<llguidance::Matcher>>,
    /// `Some(top)`: report every prompt token's log-probability (completions' `echo`) with
    /// `top` alternatives, as one [`Event::Prompt`](super::Event::Prompt) before the first token.
    pub prompt_logprobs: Option<usize>,
    /// The grammar's mask for the next token, computed while the step's forward ran, and
    /// the microseconds that took.
    pub(crate) mask: Option<Result<llguidance::toktrie::SimpleVob, String>>,
    pub(crate) mask_us: u64,
}

impl Constraint {
    pub(super) fn active(&self) -> bool {
        !self.logit_bias.is_empty() || self.grammar.is_some() || self.prompt_logprobs.is_some()
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("logit_bias", &self.logit_bias)
            .field("grammar", &self.grammar.is_some())
            .field("prompt_logprobs", &self.prompt_logprobs)
            .finish()
    }
}

/// Applies a job's logit biases and its grammar's mask of allowed tokens to `logits`.
pub(super) fn constrain(c: &mut Constraint, logits: &mut [f32]) -> Result<(), String> {
    for &(id, b) in &c.logit_bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = if b <= -100.0 {
                f32::NEG_INFINITY
            } else {
                *l + b
            };
        }
    }
    if let Some(g) = c.grammar.as_mut() {
        let mask = match c.mask.take() {
            Some(m) => m,
            None => g.compute_mask_or_eos().map_err(|e| e.to_string()),
        }
        .map_err(|e| format!("the grammar's token mask failed: {e}"))?;
        for (id, l) in logits.iter_mut().enumerate() {
            if id >= mask.len() || !mask.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    Ok(())
}

/// The chosen token's log-probability under softmax(logits) and the `top` most likely
/// tokens. Non-finite logits count as impossible.
pub(super) fn token_logprob(
    logits: &[f32],
    chosen: u32,
    top: usize,
    tok: &impl TokenText,
) -> TokenLogprob {
    let norm = LogNorm::of(logits);
    let lp = |id: u32| -> f32 { norm.log_prob(logits, id as usize) as f32 };
    let mut best: Vec<u32> = Vec::new();
    if top > 0 {
        let mut ids: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        let k = top.min(ids.len());
        if k > 0 && k < ids.len() {
            ids.select_nth_unstable_by(k - 1, |&a, &b| {
                logits[b as usize].total_cmp(&logits[a as usize])
            });
            ids.truncate(k);
        }
        ids.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        best = ids;
    }
    TokenLogprob {
        bytes: tok.token_bytes(chosen),
        logprob: lp(chosen),
        top: best
            .into_iter()
            .map(|id| (tok.token_bytes(id), lp(id)))
            .collect(),
    }
}
