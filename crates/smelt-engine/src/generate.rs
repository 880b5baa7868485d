//! The generation loop: a prompt in, tokens and streamed text out, until a token budget, an
//! end-of-generation token, a stop string or the caller's [`Cancel`] ends it.
//!
//! Text is streamed in deltas that never take anything back: bytes that do not yet form
//! complete UTF-8 are held, and so is any tail of the text that could still grow into a stop
//! string. A stop string itself is never emitted, nor anything after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sampler::{Sampler, SamplingParams};
use crate::{Engine, EngineError, Logits, SeqId, SeqInput};

/// What generation needs from a tokenizer: the bytes of a token and whether it ends
/// generation. A trait so the loop's text handling is testable without a model.
pub trait TokenText {
    fn token_bytes(&self, id: u32) -> Vec<u8>;
    fn is_eog(&self, id: u32) -> bool;
}

impl TokenText for smelt_tokenizer::Tokenizer {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        smelt_tokenizer::Tokenizer::token_bytes(self, id)
    }

    fn is_eog(&self, id: u32) -> bool {
        smelt_tokenizer::Tokenizer::is_eog(self, id)
    }
}

/// Prompt tokens per forward while prefilling: long prompts go through in chunks so the
/// activations of one step stay small.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// A flag another thread (a Ctrl-C handler) raises to end a generation early; two are equal
/// when they are the same flag.
#[derive(Debug, Clone, Default)]
pub struct Cancel(pub Arc<AtomicBool>);

impl Cancel {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl PartialEq for Cancel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    /// Generation ends before the first of these appears in the text.
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    pub prefill_chunk: usize,
    /// Keep going past end-of-generation tokens (benchmarks that need exactly max_tokens).
    pub ignore_eog: bool,
    /// Raised, it ends generation after the token being produced, as
    /// [`FinishReason::Stop`] (the prompt is always fed whole).
    pub cancel: Option<Cancel>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 128,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            ignore_eog: false,
            cancel: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// A stop string appeared.
    Stop,
    /// The model produced an end-of-generation token.
    Eog,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Eog => "eog",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt: Duration,
    /// Forward passes after the prefill (the first generated token comes from the prefill).
    pub decode_tokens: usize,
    pub decode: Duration,
}

impl Timings {
    pub fn prompt_tokens_per_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt)
    }

    pub fn decode_tokens_per_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Every sampled token, the end-of-generation one included.
    pub tokens: Vec<u32>,
    /// The text shown (up to a stop string, without it).
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

/// Feeds `prompt` to `seq` (appended to whatever it already holds; `history` is what it
/// holds, for the penalties) and generates. `on_text` receives the text in deltas.
///
/// When this returns, the sequence's KV holds `prompt` and every generated token but the
/// last, which was sampled and never fed back.
pub fn generate(
    engine: &mut Engine,
    seq: SeqId,
    history: &[u32],
    prompt: &[u32],
    tok: &impl TokenText,
    params: &GenerateParams,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::BadOptions(
            "the prompt has no tokens: nothing to generate from".into(),
        ));
    }
    let mut sampler = Sampler::new(params.sampling.clone());
    let mut context: Vec<u32> = history.iter().chain(prompt).copied().collect();
    let mut timings = Timings {
        prompt_tokens: prompt.len(),
        ..Timings::default()
    };

    // Plain greedy decoding picks each token where the logits are (on the GPU: inside the
    // step); anything else samples the logits here.
    let on_engine = params.sampling.is_plain_greedy();
    let mut step = |tokens: Vec<u32>, logits: Logits| -> Result<Next, EngineError> {
        let input = [SeqInput {
            seq,
            tokens,
            logits,
        }];
        Ok(if on_engine {
            Next::Token(engine.forward_greedy(&input)?.pop().flatten().unwrap_or(0))
        } else {
            Next::Logits(
                engine
                    .forward(&input)?
                    .pop()
                    .and_then(|mut rows| rows.pop())
                    .unwrap_or_default(),
            )
        })
    };

    let t0 = Instant::now();
    let chunk = params.prefill_chunk.max(1);
    let mut next_of = Next::Logits(Vec::new());
    for (i, part) in prompt.chunks(chunk).enumerate() {
        let last = (i + 1) * chunk >= prompt.len();
        let out = step(
            part.to_vec(),
            if last { Logits::Last } else { Logits::None },
        )?;
        if last {
            next_of = out;
        }
    }
    timings.prompt = t0.elapsed();

    let mut text = TextStream::new(&params.stop);
    let mut tokens = Vec::new();
    let t1 = Instant::now();
    let finish_reason = loop {
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let next = match &next_of {
            Next::Token(t) => *t,
            Next::Logits(logits) => sampler.sample(logits, &context),
        };
        tokens.push(next);
        context.push(next);
        if !params.ignore_eog && tok.is_eog(next) {
            break FinishReason::Eog;
        }
        let (delta, stopped) = text.push(&tok.token_bytes(next));
        if !delta.is_empty() {
            on_text(&delta);
        }
        if stopped {
            break FinishReason::Stop;
        }
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        if params.cancel.as_ref().is_some_and(Cancel::is_set) {
            break FinishReason::Stop;
        }
        next_of = step(vec![next], Logits::Last)?;
        timings.decode_tokens += 1;
    };
    timings.decode = t1.elapsed();
    if finish_reason != FinishReason::Stop {
        let rest = text.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(Generation {
        tokens,
        text: text.emitted,
        finish_reason,
        timings,
    })
}

/// What a step gives [`generate`] to choose the next token from.
enum Next {
    /// The engine chose it (plain greedy).
    Token(u32),
    /// The last row's logits, for the sampler.
    Logits(Vec<f32>),
}

/// Turns token bytes into text deltas, holding back incomplete UTF-8 and any tail that may
/// be the start of a stop string.
#[derive(Debug, Clone)]
pub struct TextStream {
    stops: Vec<String>,
    /// Bytes not yet valid UTF-8 (a character split across tokens).
    pending: Vec<u8>,
    /// Decoded text not yet emitted.
    held: String,
    /// Everything emitted so far.
    pub emitted: String,
}

impl TextStream {
    pub fn new(stops: &[String]) -> TextStream {
        TextStream {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: Vec::new(),
            held: String::new(),
            emitted: String::new(),
        }
    }

    /// Adds a token's bytes; returns the text that can be shown now and whether a stop
    /// string appeared (then nothing from it on is ever shown).
    pub fn push(&mut self, bytes: &[u8]) -> (String, bool) {
        self.pending.extend_from_slice(bytes);
        self.decode_pending(false);
        // The earliest stop string wins; text before it is shown.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            let delta = self.held[..at].to_string();
            self.held.clear();
            self.pending.clear();
            self.emitted.push_str(&delta);
            return (delta, true);
        }
        let keep = self.partial_stop_len();
        let cut = self.held.len() - keep;
        let delta: String = self.held.drain(..cut).collect();
        self.emitted.push_str(&delta);
        (delta, false)
    }

    /// Generation ended without a stop string: everything held is shown, an incomplete
    /// character as U+FFFD.
    pub fn finish(&mut self) -> String {
        self.decode_pending(true);
        let delta = std::mem::take(&mut self.held);
        self.emitted.push_str(&delta);
        delta
    }

    /// Moves complete characters from `pending` to `held`. Invalid bytes become U+FFFD; a
    /// truncated character at the end waits for the next token unless `flush`.
    fn decode_pending(&mut self, flush: bool) {
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    self.held.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    self.held
                        .push_str(&String::from_utf8_lossy(&self.pending[..good]));
                    match e.error_len() {
                        Some(bad) => {
                            self.held.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                        None => {
                            self.pending.drain(..good);
                            if flush {
                                self.held.push('\u{FFFD}');
                                self.pending.clear();
                            }
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The longest tail of `held` that is a proper prefix of some stop string.
    fn partial_stop_len(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            for (i, _) in self.held.char_indices() {
                let tail = &self.held[i..];
                if tail.len() <= best {
                    break;
                }
                if s.starts_with(tail) {
                    best = tail.len();
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut t = TextStream::new(&stops);
        let mut deltas = Vec::new();
        for p in pieces {
            let (d, stop) = t.push(p);
            deltas.push(d);
            if stop {
                return (deltas, true, t.emitted.clone());
            }
        }
        deltas.push(t.finish());
        (deltas, false, t.emitted.clone())
    }

    #[test]
    fn text_streams_as_it_comes_without_stops() {
        let (d, stop, all) = run(&[], &[b"Hello", b",", b" world"]);
        assert_eq!(d, vec!["Hello", ",", " world", ""]);
        assert!(!stop);
        assert_eq!(all, "Hello, world");
    }

    #[test]
    fn a_character_split_across_tokens_waits_for_its_end() {
        let e = "é".as_bytes();
        let (d, _, all) = run(&[], &[b"caf", &e[..1], &e[1..], b"!"]);
        assert_eq!(d, vec!["caf", "", "é", "!", ""]);
        assert_eq!(all, "café!");
        // Truncated at the end: shown as a replacement character.
        let (_, _, all) = run(&[], &[b"x", &e[..1]]);
        assert_eq!(all, "x\u{FFFD}");
        // Invalid in the middle: replaced, and the rest still flows.
        let (_, _, all) = run(&[], &[b"a\xffb"]);
        assert_eq!(all, "a\u{FFFD}b");
    }

    #[test]
    fn a_stop_string_is_withheld_then_cut() {
        let (d, stop, all) = run(&["</s>"], &[b"Hi", b" <", b"/", b"s>", b"more"]);
        assert!(stop);
        assert_eq!(d, vec!["Hi", " ", "", ""]);
        assert_eq!(all, "Hi ");
    }

    #[test]
    fn a_false_start_is_released() {
        let (d, stop, all) = run(&["STOP"], &[b"ST", b"AR", b"T"]);
        assert!(!stop);
        assert_eq!(d, vec!["", "STAR", "T", ""]);
        assert_eq!(all, "START");
        // The held tail is released at the end too.
        let (_, stop, all) = run(&["STOP"], &[b"go ST"]);
        assert!(!stop);
        assert_eq!(all, "go ST");
    }

    #[test]
    fn the_earliest_of_several_stops_wins_within_one_token() {
        let (_, stop, all) = run(&["b", "a"], &[b"xxab"]);
        assert!(stop);
        assert_eq!(all, "xx");
        let (_, stop, all) = run(&["\n\n"], &[b"line\n", b"\nnext"]);
        assert!(stop);
        assert_eq!(all, "line");
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let (_, stop, all) = run(&[""], &[b"abc"]);
        assert!(!stop);
        assert_eq!(all, "abc");
    }
}
