//! Turning logits into the next token, the way llama.cpp's default sampler chain does:
//! penalties -> top-k -> top-p -> min-p -> temperature -> a seeded draw. With a temperature
//! of zero or less the chain ends in argmax instead of a draw, so greedy decoding is still
//! shaped by the penalties, as in llama.cpp.
//!
//! Logits that are NaN or -inf are never chosen: a model that produces a few of them still
//! samples from the rest, and one that produces nothing but them gets token 0 rather than a
//! panic (the caller sees garbage text, not a crash in the middle of a batch).

use std::collections::HashMap;

/// How to pick the next token. `Default` is greedy decoding with no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// <= 0: greedy (argmax).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of recent tokens; 1 is off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every recent token.
    pub presence_penalty: f32,
    /// Subtracted from a recent token's logit once per occurrence.
    pub frequency_penalty: f32,
    /// How many of the last tokens the penalties look at (0: none).
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// NaN counts as greedy too: there is no distribution to draw from.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.temperature.is_nan()
    }

    /// Whether the choice is the plain argmax of the logits, with nothing that looks at
    /// the tokens so far: then the engine can pick it where the logits are
    /// ([`crate::Engine::forward_greedy`]).
    pub fn is_plain_greedy(&self) -> bool {
        self.is_greedy() && !self.has_penalties()
    }

    fn has_penalties(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// A sampler with its own random stream: two samplers built from the same parameters
/// draw the same tokens from the same logits.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    /// Reused between steps: a candidate list is as long as the vocabulary.
    cands: Vec<Candidate>,
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            rng: SplitMix64::new(params.seed),
            params,
            cands: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for `logits` (one per vocabulary entry), given the tokens so far
    /// (prompt and generated; only the last `penalty_last_n` matter).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.params.is_plain_greedy() {
            // The common case needs no candidate list (262k entries for Gemma, every token).
            return argmax(logits);
        }
        let p = self.params.clone();
        let mut cands = std::mem::take(&mut self.cands);
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
                .map(|(i, &logit)| Candidate {
                    id: i as u32,
                    logit,
                }),
        );
        if p.has_penalties() {
            apply_penalties(&mut cands, &p, history);
        }
        let token = if cands.is_empty() {
            0
        } else if p.is_greedy() {
            argmax_candidates(&cands)
        } else {
            self.draw(&mut cands, &p)
        };
        self.cands = cands;
        token
    }

    fn draw(&mut self, cands: &mut Vec<Candidate>, p: &SamplingParams) -> u32 {
        // Most likely first; ties by id so the order, and thus the draw, is reproducible.
        let by_logit =
            |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        if p.top_k > 0 && p.top_k < cands.len() {
            cands.select_nth_unstable_by(p.top_k - 1, by_logit);
            cands.truncate(p.top_k);
        }
        cands.sort_unstable_by(by_logit);
        if p.top_p < 1.0 {
            let probs = softmax(cands);
            let mut cum = 0.0f32;
            let mut keep = cands.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                // The token that crosses p stays; at least one always does.
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  logit_i >= logit_max + ln(min_p).
            let floor = cands[0].logit + p.min_p.ln();
            let keep = cands.iter().take_while(|c| c.logit >= floor).count();
            cands.truncate(keep.max(1));
        }
        for c in cands.iter_mut() {
            c.logit /= p.temperature;
        }
        let probs = softmax(cands);
        let u = self.rng.next_f64() as f32;
        let mut cum = 0.0f32;
        for (c, pr) in cands.iter().zip(&probs) {
            cum += pr;
            if u < cum {
                return c.id;
            }
        }
        // Rounding left the total a hair under u: the last candidate takes the remainder.
        cands[cands.len() - 1].id
    }
}

/// llama.cpp's penalties: repeat divides a positive logit and multiplies a negative one;
/// frequency and presence subtract per occurrence and once.
fn apply_penalties(cands: &mut [Candidate], p: &SamplingParams, history: &[u32]) {
    let recent = &history[history.len().saturating_sub(p.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::with_capacity(recent.len());
    for &t in recent {
        *counts.entry(t).or_insert(0) += 1;
    }
    for c in cands.iter_mut() {
        let Some(&n) = counts.get(&c.id) else {
            continue;
        };
        if c.logit <= 0.0 {
            c.logit *= p.repeat_penalty;
        } else {
            c.logit /= p.repeat_penalty;
        }
        c.logit -= n as f32 * p.frequency_penalty + p.presence_penalty;
    }
}

/// The highest logit; the lowest id among equals, like llama.cpp's greedy sampler.
fn argmax_candidates(cands: &[Candidate]) -> u32 {
    let mut best = cands[0];
    for &c in &cands[1..] {
        if c.logit > best.logit {
            best = c;
        }
    }
    best.id
}

/// The greedy token of a logits row: the first index of the largest value, skipping NaN and
/// -inf; token 0 when nothing is left (what [`argmax_candidates`] gives).
///
/// Two passes, because a decode step waits for it: the largest value over 16 lanes (the
/// compiler vectorizes it; one running index would make every element depend on the last),
/// then the first chunk that holds it. A 128k vocabulary takes ~30 us instead of ~90.
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    const CHUNK: usize = 256;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            // `f32::max` returns the other operand when one is NaN: NaN never wins.
            *m = m.max(v);
        }
    }
    let best = lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if best == f32::NEG_INFINITY || best.is_nan() {
        return 0;
    }
    for (k, c) in logits.chunks(CHUNK).enumerate() {
        if c.iter().fold(false, |hit, &v| hit | (v == best)) {
            let i = c.iter().position(|&v| v == best).unwrap_or(0);
            return (k * CHUNK + i) as u32;
        }
    }
    0
}

/// log softmax(row)\[tok\] as llama.cpp's perplexity computes it: f32 exponentials of
/// `l - max` summed in f64. Non-finite logits count as impossible; a token out of range or
/// with a non-finite logit gets -inf. `smelt perplexity` and the server's log-probabilities
/// both use it, so their per-token values are the same numbers.
pub fn log_prob(row: &[f32], tok: usize) -> f64 {
    LogNorm::of(row).log_prob(row, tok)
}

/// A row's softmax normalizer, computed once to score many of its tokens as [`log_prob`]
/// does.
#[derive(Debug, Clone, Copy)]
pub struct LogNorm {
    max: f32,
    ln_sum: f64,
}

impl LogNorm {
    pub fn of(row: &[f32]) -> LogNorm {
        let max = row
            .iter()
            .copied()
            .filter(|l| l.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum_exp: f64 = row
            .iter()
            .filter(|l| l.is_finite())
            .map(|&l| f64::from((l - max).exp()))
            .sum();
        LogNorm {
            max,
            ln_sum: sum_exp.ln(),
        }
    }

    /// log softmax(row)\[tok\]: `f64(l - max) - ln(sum)`, llama.cpp's rounding.
    pub fn log_prob(&self, row: &[f32], tok: usize) -> f64 {
        match row.get(tok) {
            Some(&l) if l.is_finite() => f64::from(l - self.max) - self.ln_sum,
            _ => f64::NEG_INFINITY,
        }
    }
}

/// Probabilities of the candidates (their logits are finite or +inf, never NaN).
fn softmax(cands: &[Candidate]) -> Vec<f32> {
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::INFINITY {
        // +inf dominates: share the mass among the infinite ones.
        let n = cands.iter().filter(|c| c.logit == f32::INFINITY).count() as f32;
        return cands
            .iter()
            .map(|c| {
                if c.logit == f32::INFINITY {
                    1.0 / n
                } else {
                    0.0
                }
            })
            .collect();
    }
    let mut e: Vec<f32> = cands.iter().map(|c| (c.logit - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    for x in &mut e {
        *x /= sum;
    }
    e
}

/// SplitMix64: tiny, fast, and good enough for drawing tokens; ours so a seed means the
/// same tokens whatever version of `rand` the workspace resolves.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..SamplingParams::default()
        }
    }

    fn counts(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(p);
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[s.sample(logits, &[]) as usize] += 1;
        }
        c
    }

    #[test]
    fn greedy_takes_argmax_and_lowest_id_on_ties() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[]), 1);
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 5.0], &[]), 1);
        let mut s = Sampler::new(params(-1.0));
        assert_eq!(s.sample(&[0.0, 0.0, 0.5], &[]), 2);
    }

    /// The two-pass [`argmax`] against the plain loop it replaces, on lengths around its
    /// lane and chunk sizes, with ties, NaN, infinities and the winner in the remainder.
    #[test]
    fn argmax_equals_the_plain_loop() {
        fn plain(x: &[f32]) -> u32 {
            let mut best: Option<(usize, f32)> = None;
            for (i, &l) in x.iter().enumerate() {
                if !l.is_nan() && l != f32::NEG_INFINITY && best.is_none_or(|(_, b)| l > b) {
                    best = Some((i, l));
                }
            }
            best.map_or(0, |(i, _)| i as u32)
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in [0, 1, 15, 16, 17, 255, 256, 257, 1000, 4113] {
            for case in 0..12 {
                let mut x: Vec<f32> = (0..n).map(|_| (next() % 64) as f32 * 0.25 - 8.0).collect();
                for v in x.iter_mut() {
                    match (case, next() % 8) {
                        (1, 0) => *v = f32::NAN,
                        (2, 0) => *v = f32::NEG_INFINITY,
                        (3, _) => *v = f32::NAN,
                        (4, _) => *v = f32::NEG_INFINITY,
                        (5, 0) => *v = f32::INFINITY,
                        (6, _) => *v = 1.0,
                        _ => {}
                    }
                }
                if case == 7 && n > 0 {
                    x[n - 1] = 100.0; // in the remainder of the 16 lanes
                }
                if case == 8 && n > 0 {
                    x[0] = f32::NAN;
                }
                assert_eq!(argmax(&x), plain(&x), "n {n} case {case}: {x:?}");
            }
        }
    }

    #[test]
    fn nan_and_neg_inf_are_never_chosen() {
        let logits = [f32::NAN, f32::NEG_INFINITY, -50.0, f32::NAN];
        let mut g = Sampler::new(params(0.0));
        assert_eq!(g.sample(&logits, &[]), 2);
        let c = counts(params(1.0), &logits, 200);
        assert_eq!(c, vec![0, 0, 200, 0]);
        // Nothing usable: no panic, token 0.
        let mut s = Sampler::new(params(0.7));
        assert_eq!(s.sample(&[f32::NAN, f32::NEG_INFINITY], &[]), 0);
        assert_eq!(s.sample(&[], &[]), 0);
    }

    #[test]
    fn positive_infinity_wins() {
        let c = counts(params(1.0), &[10.0, f32::INFINITY, 3.0], 50);
        assert_eq!(c, vec![0, 50, 0]);
    }

    #[test]
    fn draws_follow_the_softmax() {
        // Probabilities 0.1, 0.2, 0.3, 0.4 as logits.
        let logits: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
        let n = 40_000;
        let c = counts(params(1.0), &logits, n);
        for (i, want) in [0.1, 0.2, 0.3, 0.4].iter().enumerate() {
            let got = c[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [0.0f32, 1.0];
        let n = 20_000;
        let cold = counts(params(0.25), &logits, n)[1] as f64 / n as f64;
        let warm = counts(params(4.0), &logits, n)[1] as f64 / n as f64;
        // p(1) = 1 / (1 + e^(-1/T)).
        assert!(
            (cold - 1.0 / (1.0 + (-4.0f64).exp())).abs() < 0.01,
            "{cold}"
        );
        assert!(
            (warm - 1.0 / (1.0 + (-0.25f64).exp())).abs() < 0.015,
            "{warm}"
        );
    }

    #[test]
    fn top_k_keeps_only_the_k_best() {
        let logits = [1.0f32, 4.0, 3.0, 2.0, 0.0];
        let p = SamplingParams {
            top_k: 2,
            ..params(100.0)
        };
        let c = counts(p, &logits, 2000);
        assert_eq!((c[0], c[3], c[4]), (0, 0, 0));
        assert!(c[1] > 800 && c[2] > 800, "{c:?}");
    }

    #[test]
    fn top_p_keeps_the_token_that_crosses_p() {
        // 0.5, 0.3, 0.2: p = 0.6 keeps the first two (0.5 < 0.6 <= 0.8).
        let logits: Vec<f32> = [0.5f32, 0.3, 0.2].iter().map(|p| p.ln()).collect();
        let p = SamplingParams {
            top_p: 0.6,
            ..params(1.0)
        };
        let c = counts(p.clone(), &logits, 5000);
        assert_eq!(c[2], 0);
        assert!(c[1] > 1500, "{c:?}");
        // A tiny p still keeps the best token.
        let c = counts(SamplingParams { top_p: 0.0, ..p }, &logits, 100);
        assert_eq!(c, vec![100, 0, 0]);
    }

    #[test]
    fn min_p_drops_tokens_below_the_fraction_of_the_best() {
        // Relative to the best: 1, 0.5, 0.09.
        let logits: Vec<f32> = [0.6f32, 0.3, 0.054, 0.046].iter().map(|p| p.ln()).collect();
        let p = SamplingParams {
            min_p: 0.1,
            ..params(1.0)
        };
        let c = counts(p, &logits, 5000);
        assert_eq!((c[2], c[3]), (0, 0));
        assert!(c[1] > 1200, "{c:?}");
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            ..params(0.0)
        };
        let mut s = Sampler::new(p);
        // 3.0 / 2 = 1.5 < 2.0: token 1 wins once token 0 was seen.
        assert_eq!(s.sample(&[3.0, 2.0], &[0]), 1);
        // -1.0 * 2 = -2.0 < -1.5.
        assert_eq!(s.sample(&[-1.0, -1.5], &[0]), 1);
        // Outside the window: no penalty.
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            penalty_last_n: 1,
            ..params(0.0)
        });
        assert_eq!(s.sample(&[3.0, 2.0], &[0, 1]), 0);
    }

    #[test]
    fn frequency_and_presence_penalties_subtract() {
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.5,
            ..params(0.0)
        });
        // Token 0 seen three times: 3.0 - 1.5 = 1.5 < 2.0.
        assert_eq!(s.sample(&[3.0, 2.0], &[0, 0, 0]), 1);
        assert_eq!(s.sample(&[3.0, 2.0], &[0]), 0);
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 1.5,
            ..params(0.0)
        });
        assert_eq!(s.sample(&[3.0, 2.0], &[0]), 1);
        assert_eq!(s.sample(&[3.0, 1.0], &[0, 0, 0, 0]), 0);
    }

    #[test]
    fn log_prob_is_a_log_softmax() {
        let row = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        let z: f64 = row[..3].iter().map(|&x| f64::from(x).exp()).sum();
        for (i, &x) in row[..3].iter().enumerate() {
            assert!((log_prob(&row, i) - (f64::from(x) - z.ln())).abs() < 1e-6);
        }
        assert_eq!(log_prob(&row, 3), f64::NEG_INFINITY);
        assert_eq!(log_prob(&row, 9), f64::NEG_INFINITY);
        assert!((log_prob(&[7.0; 4], 2) - 0.25f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 113) as f32 / 20.0)
            .collect();
        let p = SamplingParams {
            top_k: 50,
            top_p: 0.95,
            min_p: 0.01,
            seed: 42,
            ..params(0.8)
        };
        let run = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            (0..100).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        let a = run(p.clone());
        assert_eq!(a, run(p.clone()));
        let b = run(SamplingParams { seed: 43, ..p });
        assert_ne!(a, b);
    }
}
