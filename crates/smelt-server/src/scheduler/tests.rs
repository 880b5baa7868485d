//! The scheduler driven by a scripted engine: exact token streams, chunking within the step
//! budget, batch limits, preemption when the KV cache is full, 503 for what can never fit,
//! panics and engine errors answered with 500 while the scheduler keeps serving, cancelled
//! requests freed, and the queue bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use smelt_engine::generate::{FinishReason, TokenText};
use smelt_engine::sampler::SamplingParams;
use smelt_engine::{EngineError, Logits, SeqId, SeqInput};
use tokio::sync::mpsc;

use super::{spawn, Event, Job, SchedulerConfig, SchedulerHandle, StepEngine, SubmitError};

const VOCAB: usize = 16;
/// The fake's end-of-generation token.
const EOG: u32 = 15;
/// Tokens the fake refuses (never generated: they are outside its counting): one panics,
/// the other is an engine error.
const PANIC_TOKEN: u32 = 200;
const ERROR_TOKEN: u32 = 201;

/// Every forward's (sequence, tokens) pairs, in order.
type StepLog = Arc<Mutex<Vec<Vec<(SeqId, usize)>>>>;

/// A model whose next token is always the last one plus one, with a real block-counting
/// KV cache, a log of every batch, and an optional gate each forward waits on.
struct Fake {
    block_size: usize,
    n_blocks: usize,
    seqs: HashMap<SeqId, usize>,
    next_id: u64,
    last_token: HashMap<SeqId, u32>,
    log: StepLog,
    gate: Option<(std_mpsc::Sender<()>, std_mpsc::Receiver<()>)>,
    /// Steps that asked for tokens instead of logits.
    greedy_steps: Arc<AtomicUsize>,
    /// What [`StepEngine::lone_token_rows_differ`] says (the CPU engine's answer).
    lone_rows_differ: bool,
}

impl Fake {
    fn used(&self) -> usize {
        self.seqs
            .values()
            .map(|&l| l.div_ceil(self.block_size))
            .sum()
    }
}

impl StepEngine for Fake {
    fn new_sequence(&mut self) -> SeqId {
        self.next_id += 1;
        let id = SeqId(self.next_id);
        self.seqs.insert(id, 0);
        id
    }

    fn free_sequence(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.last_token.remove(&seq);
    }

    fn forward(&mut self, batch: &[SeqInput]) -> Result<Vec<Vec<Vec<f32>>>, EngineError> {
        if let Some((entered, go)) = &self.gate {
            let _ = entered.send(());
            let _ = go.recv();
        }
        let mut need = 0;
        for inp in batch {
            if inp.tokens.contains(&PANIC_TOKEN) {
                panic!("scripted panic");
            }
            if inp.tokens.contains(&ERROR_TOKEN) {
                return Err(EngineError::BadOptions("scripted error".into()));
            }
            let len = *self.seqs.get(&inp.seq).expect("a live sequence");
            need +=
                (len + inp.tokens.len()).div_ceil(self.block_size) - len.div_ceil(self.block_size);
        }
        let free = self.n_blocks - self.used();
        if need > free {
            return Err(EngineError::OutOfKvBlocks { need, free });
        }
        self.log
            .lock()
            .unwrap()
            .push(batch.iter().map(|i| (i.seq, i.tokens.len())).collect());
        Ok(batch
            .iter()
            .map(|inp| {
                *self.seqs.get_mut(&inp.seq).unwrap() += inp.tokens.len();
                let last = *inp.tokens.last().unwrap();
                self.last_token.insert(inp.seq, last);
                match inp.logits {
                    Logits::None => Vec::new(),
                    Logits::All => inp
                        .tokens
                        .iter()
                        .map(|&t| {
                            let mut row = vec![0.0; VOCAB];
                            row[(t as usize + 1) % VOCAB] = 1.0;
                            row
                        })
                        .collect(),
                    Logits::Last => {
                        let mut row = vec![0.0; VOCAB];
                        row[(last as usize + 1) % VOCAB] = 1.0;
                        vec![row]
                    }
                }
            })
            .collect())
    }

    fn forward_greedy(&mut self, batch: &[SeqInput]) -> Result<Vec<Option<u32>>, EngineError> {
        self.greedy_steps.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .forward(batch)?
            .iter()
            .map(|rows| rows.last().map(|r| smelt_engine::argmax(r)))
            .collect())
    }

    fn free_blocks(&self) -> usize {
        self.n_blocks - self.used()
    }

    fn total_blocks(&self) -> usize {
        self.n_blocks
    }

    fn lone_token_rows_differ(&self) -> bool {
        self.lone_rows_differ
    }
}

struct FakeText;

impl TokenText for FakeText {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        format!("<{id}>").into_bytes()
    }

    fn is_eog(&self, id: u32) -> bool {
        id == EOG
    }
}

struct Harness {
    handle: SchedulerHandle,
    log: StepLog,
    greedy_steps: Arc<AtomicUsize>,
    /// With a gate: a message each time a forward starts; send on `go` to let it run.
    entered: Option<std_mpsc::Receiver<()>>,
    go: Option<std_mpsc::Sender<()>>,
}

fn start(cfg: SchedulerConfig, n_blocks: usize, gated: bool) -> Harness {
    start_with(cfg, n_blocks, gated, false)
}

fn start_with(cfg: SchedulerConfig, n_blocks: usize, gated: bool, lone: bool) -> Harness {
    let log = Arc::new(Mutex::new(Vec::new()));
    let greedy_steps = Arc::new(AtomicUsize::new(0));
    let (gate, entered, go) = if gated {
        let (etx, erx) = std_mpsc::channel();
        let (gtx, grx) = std_mpsc::channel();
        (Some((etx, grx)), Some(erx), Some(gtx))
    } else {
        (None, None, None)
    };
    let fake = Fake {
        block_size: 4,
        n_blocks,
        seqs: HashMap::new(),
        next_id: 0,
        last_token: HashMap::new(),
        log: Arc::clone(&log),
        gate,
        greedy_steps: Arc::clone(&greedy_steps),
        lone_rows_differ: lone,
    };
    let started = spawn(
        "fake".into(),
        move || Ok((fake, Arc::new(FakeText), ())),
        cfg,
    )
    .expect("the scheduler starts");
    Harness {
        handle: started.handle,
        log,
        greedy_steps,
        entered,
        go,
    }
}

fn job(prompt: &[u32], max_tokens: usize) -> (Job, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Job {
            prompt: prompt.to_vec(),
            max_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            logprobs: None,
            ignore_eog: false,
            events: tx,
            arrived: Instant::now(),
            constraint: Default::default(),
        },
        rx,
    )
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Done {
        ids: Vec<u32>,
        text: String,
        finish: FinishReason,
        completion_tokens: usize,
    },
    Error(u16, String),
}

/// Every event of a job until its end (blocking; the scheduler runs on its own thread).
fn outcome(mut rx: mpsc::UnboundedReceiver<Event>) -> Outcome {
    let (mut ids, mut text) = (Vec::new(), String::new());
    loop {
        match rx.blocking_recv().expect("the job ends with Done or Error") {
            Event::Token { id, text: t, .. } => {
                ids.push(id);
                text.push_str(&t);
            }
            Event::Done {
                finish_reason,
                completion_tokens,
                ..
            } => {
                return Outcome::Done {
                    ids,
                    text,
                    finish: finish_reason,
                    completion_tokens,
                }
            }
            Event::Error(e) => return Outcome::Error(e.status.as_u16(), e.message),
            Event::Prompt(_) => {}
        }
    }
}

/// Logit biases steer even greedy picks (the engine's argmax shortcut would ignore them), and
/// prompt log-probabilities come first, one per prompt token, the first without one, even
/// when the prompt is cut into chunks; max_tokens 0 then only scores.
#[test]
fn logit_bias_and_prompt_logprobs() {
    let cfg = SchedulerConfig {
        step_tokens: 2,
        ..SchedulerConfig::default()
    };
    let h = start(cfg, 64, false);
    let (mut j, rx) = job(&[1, 2, 3], 2);
    // The fake's pick after 3 is 4: banned, the lowest id among the equal rest wins (0).
    j.constraint.logit_bias = vec![(4, -100.0)];
    h.handle.submit(j).unwrap();
    match outcome(rx) {
        Outcome::Done { ids, .. } => assert_eq!(ids, vec![0, 1]),
        other => panic!("{other:?}"),
    }
    for max_tokens in [0, 1] {
        let (mut j, mut rx) = job(&[1, 2, 3, 7, 9], max_tokens);
        j.constraint.prompt_logprobs = Some(1);
        h.handle.submit(j).unwrap();
        let Some(Event::Prompt(p)) = rx.blocking_recv() else {
            panic!("the prompt's log-probabilities come first");
        };
        assert_eq!(p.len(), 5);
        assert_eq!(p[0], (b"<1>".to_vec(), None));
        // Row of 1 predicts 2 (its logit is the one at 1.0), of 3 predicts 4, not 7.
        let lp = |i: usize| p[i].1.as_ref().unwrap().logprob;
        let (hit, miss) = (lp(1), lp(3));
        let z = (15.0f64 + 1f64.exp()).ln();
        assert!((f64::from(hit) - (1.0 - z)).abs() < 1e-6, "{hit}");
        assert!((f64::from(miss) + z).abs() < 1e-6, "{miss}");
        assert_eq!(p[3].1.as_ref().unwrap().top[0].0, b"<4>".to_vec());
        match outcome(rx) {
            Outcome::Done {
                ids,
                completion_tokens,
                ..
            } => {
                assert_eq!(completion_tokens, max_tokens);
                assert_eq!(ids, if max_tokens == 0 { vec![] } else { vec![10] });
            }
            other => panic!("{other:?}"),
        }
    }
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn gauge(h: &SchedulerHandle, f: impl Fn(&crate::metrics::ModelStats) -> u64) -> u64 {
    f(&h.stats)
}

#[test]
fn tokens_text_and_finish_reasons() {
    let h = start(SchedulerConfig::default(), 64, false);
    let (j, rx) = job(&[1, 2], 3);
    h.handle.submit(j).unwrap();
    assert_eq!(
        outcome(rx),
        Outcome::Done {
            ids: vec![3, 4, 5],
            text: "<3><4><5>".into(),
            finish: FinishReason::Length,
            completion_tokens: 3,
        }
    );
    // Counting up from 9 reaches the end-of-generation token 15.
    let (j, rx) = job(&[9], 100);
    h.handle.submit(j).unwrap();
    let Outcome::Done {
        ids,
        finish,
        completion_tokens,
        ..
    } = outcome(rx)
    else {
        panic!("not done")
    };
    assert_eq!(ids, vec![10, 11, 12, 13, 14, 15]);
    assert_eq!(finish, FinishReason::Eog);
    assert_eq!(completion_tokens, 6, "the end-of-generation token counts");
    // Stop strings cut the text before them.
    let (mut j, rx) = job(&[1], 10);
    j.stop = vec!["<4>".into()];
    h.handle.submit(j).unwrap();
    let Outcome::Done { text, finish, .. } = outcome(rx) else {
        panic!("not done")
    };
    assert_eq!((text.as_str(), finish), ("<2><3>", FinishReason::Stop));
}

/// Greedy jobs without logprobs get their tokens from the engine's greedy step; a job that
/// samples, or wants logprobs, gets logits steps; the tokens are the same either way.
#[test]
fn greedy_jobs_take_tokens_from_the_engine_and_others_logits() {
    let h = start(SchedulerConfig::default(), 64, false);
    let greedy_steps = || h.greedy_steps.load(Ordering::Relaxed);
    let want = |ids: Vec<u32>| Outcome::Done {
        text: ids.iter().map(|i| format!("<{i}>")).collect(),
        ids,
        finish: FinishReason::Length,
        completion_tokens: 3,
    };
    let (j, rx) = job(&[1, 2], 3);
    h.handle.submit(j).unwrap();
    assert_eq!(outcome(rx), want(vec![3, 4, 5]));
    let after_greedy = greedy_steps();
    assert_eq!(after_greedy, 3, "one greedy step per token");
    // Logprobs need the logits: no greedy step.
    let (mut j, rx) = job(&[1, 2], 3);
    j.logprobs = Some(2);
    h.handle.submit(j).unwrap();
    let Outcome::Done { ids, .. } = outcome(rx) else {
        panic!("not done")
    };
    assert_eq!(ids, vec![3, 4, 5]);
    // A sampling job (top-k 1 leaves one candidate): no greedy step either.
    let (mut j, rx) = job(&[6], 3);
    j.sampling.temperature = 0.8;
    j.sampling.top_k = 1;
    h.handle.submit(j).unwrap();
    assert_eq!(outcome(rx), want(vec![7, 8, 9]));
    assert_eq!(greedy_steps(), after_greedy);
}

#[test]
fn prompts_are_chunked_within_the_step_budget_while_others_decode() {
    let cfg = SchedulerConfig {
        step_tokens: 5,
        ..SchedulerConfig::default()
    };
    let h = start(cfg, 64, false);
    let (a, rxa) = job(&[1], 8);
    h.handle.submit(a).unwrap();
    let (b, rxb) = job(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 2);
    h.handle.submit(b).unwrap();
    let (oa, ob) = (outcome(rxa), outcome(rxb));
    assert!(
        matches!(
            oa,
            Outcome::Done {
                completion_tokens: 8,
                ..
            }
        ),
        "{oa:?}"
    );
    assert!(
        matches!(&ob, Outcome::Done { ids, .. } if ids == &[12, 13]),
        "{ob:?}"
    );
    let log = h.log.lock().unwrap();
    for step in log.iter() {
        let tokens: usize = step.iter().map(|(_, n)| n).sum();
        assert!(tokens <= 5, "a step of {tokens} tokens: {step:?}");
    }
    // B's 11 prompt tokens went through in several chunks, then its one fed-back token.
    let b_seq = log.iter().flatten().map(|(s, _)| *s).max().unwrap();
    let b: Vec<usize> = log
        .iter()
        .flatten()
        .filter(|(s, _)| *s == b_seq)
        .map(|(_, n)| *n)
        .collect();
    assert!(b.len() >= 4, "{b:?}");
    assert_eq!(b.iter().sum::<usize>(), 12, "{b:?}");
}

/// Each sequence's chunk lengths, in the order they were fed.
fn chunks_by_seq(log: &StepLog) -> HashMap<SeqId, Vec<usize>> {
    let mut by_seq: HashMap<SeqId, Vec<usize>> = HashMap::new();
    for &(seq, n) in log.lock().unwrap().iter().flatten() {
        by_seq.entry(seq).or_default().push(n);
    }
    by_seq
}

#[test]
fn lone_token_chunks_only_where_they_were_fed_alone() {
    // Every prompt length from every start, under every budget: chunks of two tokens or
    // more (at most two past the budget) until the prompt is in, then one token at a time.
    for prompt in 2..40 {
        for budget in 1..9 {
            let mut fed = 0;
            while fed < prompt {
                let n = super::plan::chunk_len(fed, prompt, budget);
                assert!(n >= 2, "prompt {prompt}, budget {budget}, at {fed}: {n}");
                assert!(
                    n <= budget.max(1) + 2 && fed + n <= prompt,
                    "{prompt} {budget} {fed} {n}"
                );
                fed += n;
            }
            assert_eq!(super::plan::chunk_len(prompt, prompt, budget), 1);
            assert_eq!(super::plan::chunk_len(prompt + 5, prompt, budget), 1);
        }
    }
    assert_eq!(
        super::plan::chunk_len(0, 1, 4),
        1,
        "a one-token prompt is one token"
    );
}

#[test]
fn where_lone_token_rows_differ_a_preempted_sequence_replays_its_tokens_one_by_one() {
    // As `a_full_cache_preempts_the_newest_and_it_recomputes`, on an engine that sums a
    // lone-token chunk in another order (the CPU): the recomputed sequence takes its prompt
    // in one chunk and the tokens it had generated one per step, as it first fed them.
    let mut h = start_with(SchedulerConfig::default(), 4, true, true);
    let (rxa, rxb) = two_overlapping_jobs(&mut h);
    for (rx, s) in [(rxa, 1), (rxb, 2)] {
        match outcome(rx) {
            Outcome::Done { ids, .. } => {
                assert_eq!(ids, (1..=6).map(|k| s + k).collect::<Vec<_>>())
            }
            other => panic!("{other:?}"),
        }
    }
    let by_seq = chunks_by_seq(&h.log);
    assert!(by_seq.len() >= 3, "nothing was preempted: {by_seq:?}");
    // A finished job fed 4 + 5 tokens; one cut short after feeding generated tokens left
    // some to recompute.
    assert!(
        by_seq
            .values()
            .any(|c| c.len() > 1 && c.iter().sum::<usize>() < 9),
        "no sequence was preempted after it generated: {by_seq:?}"
    );
    for chunks in by_seq.values() {
        assert_eq!(chunks[0], 4, "{by_seq:?}");
        assert!(chunks[1..].iter().all(|&n| n == 1), "{by_seq:?}");
    }
    // A 9-token prompt while another sequence decodes under a 5-token budget: 4 + 3 + 2,
    // never a lone last token.
    drop(h);
    let cfg = SchedulerConfig {
        step_tokens: 5,
        ..SchedulerConfig::default()
    };
    let h = start_with(cfg, 64, false, true);
    let (a, rxa) = job(&[1], 8);
    h.handle.submit(a).unwrap();
    let (b, rxb) = job(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 2);
    h.handle.submit(b).unwrap();
    let (_, ob) = (outcome(rxa), outcome(rxb));
    assert!(
        matches!(&ob, Outcome::Done { ids, .. } if ids == &[10, 11]),
        "{ob:?}"
    );
    let b_seq = h
        .log
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .map(|(s, _)| *s)
        .max()
        .unwrap();
    let b = &chunks_by_seq(&h.log)[&b_seq];
    assert_eq!(b.iter().sum::<usize>(), 10, "{b:?}");
    assert!(b[..b.len() - 1].iter().all(|&n| n >= 2), "{b:?}");
}

#[test]
fn the_batch_never_exceeds_max_batch_and_everyone_finishes() {
    let cfg = SchedulerConfig {
        max_batch: 3,
        ..SchedulerConfig::default()
    };
    let mut h = start(cfg, 256, true);
    let entered = h.entered.take().unwrap();
    let go = h.go.take().unwrap();
    // The first job's first step waits at the gate until all eight are queued.
    let rxs: Vec<_> = (0..8)
        .map(|i| {
            let (j, rx) = job(&[i % 8], 4);
            h.handle.submit(j).unwrap();
            if i == 0 {
                entered.recv().unwrap();
            }
            rx
        })
        .collect();
    go.send(()).unwrap();
    std::thread::spawn(move || {
        while entered.recv().is_ok() {
            if go.send(()).is_err() {
                break;
            }
        }
    });
    for (i, rx) in rxs.into_iter().enumerate() {
        let want: Vec<u32> = (1..=4).map(|k| (i as u32 % 8 + k) % VOCAB as u32).collect();
        match outcome(rx) {
            Outcome::Done { ids, .. } => assert_eq!(ids, want, "job {i}"),
            other => panic!("job {i}: {other:?}"),
        }
    }
    let max = h.log.lock().unwrap().iter().map(Vec::len).max().unwrap();
    assert!(max <= 3, "a batch of {max}");
    assert!(max >= 2, "never batched");
}

/// Jobs A (prompt `[1; 4]`) and B (`[2; 4]`), six tokens each, on a gated harness: B
/// arrives while A's first step runs, so the two overlap; every later step is let through.
fn two_overlapping_jobs(
    h: &mut Harness,
) -> (
    mpsc::UnboundedReceiver<Event>,
    mpsc::UnboundedReceiver<Event>,
) {
    let (a, rxa) = job(&[1, 1, 1, 1], 6);
    let (b, rxb) = job(&[2, 2, 2, 2], 6);
    // B arrives while A's first step runs, so the two overlap.
    h.handle.submit(a).unwrap();
    let entered = h.entered.take().unwrap();
    let go = h.go.take().unwrap();
    entered.recv().unwrap();
    h.handle.submit(b).unwrap();
    go.send(()).unwrap();
    std::thread::spawn(move || {
        while entered.recv().is_ok() {
            if go.send(()).is_err() {
                break;
            }
        }
    });
    (rxa, rxb)
}

#[test]
fn a_full_cache_preempts_the_newest_and_it_recomputes() {
    // 4 blocks of 4 tokens; each job needs 4 + 6 - 1 = 9 tokens (3 blocks) at its end.
    let mut h = start(SchedulerConfig::default(), 4, true);
    let (rxa, rxb) = two_overlapping_jobs(&mut h);
    let want = |s: u32| Outcome::Done {
        ids: (1..=6).map(|k| s + k).collect(),
        text: (1..=6).map(|k| format!("<{}>", s + k)).collect(),
        finish: FinishReason::Length,
        completion_tokens: 6,
    };
    assert_eq!(outcome(rxa), want(1));
    assert_eq!(outcome(rxb), want(2));
    assert!(
        gauge(&h.handle, |s| s
            .preemptions
            .load(std::sync::atomic::Ordering::Relaxed))
            >= 1
    );
    // A prompt bigger than the whole cache can never run.
    let (c, rxc) = job(&[3; 17], 2);
    h.handle.submit(c).unwrap();
    match outcome(rxc) {
        Outcome::Error(503, m) => assert!(m.contains("KV cache"), "{m}"),
        other => panic!("{other:?}"),
    }
    // One that fits but outgrows the cache alone is cut by length.
    let (mut d, rxd) = job(&[0], 100);
    d.ignore_eog = true;
    h.handle.submit(d).unwrap();
    match outcome(rxd) {
        Outcome::Done {
            finish,
            completion_tokens,
            ..
        } => {
            assert_eq!(finish, FinishReason::Length);
            assert_eq!(
                completion_tokens, 16,
                "16 cached tokens: the prompt and 15 fed back"
            );
        }
        other => panic!("{other:?}"),
    }
    wait_for("blocks freed", || {
        gauge(&h.handle, |s| {
            s.kv_blocks_used.load(std::sync::atomic::Ordering::Relaxed)
        }) == 0
    });
}

#[test]
fn panics_and_engine_errors_become_500_and_the_scheduler_goes_on() {
    let h = start(SchedulerConfig::default(), 64, false);
    let (j, rx) = job(&[PANIC_TOKEN], 3);
    h.handle.submit(j).unwrap();
    match outcome(rx) {
        Outcome::Error(500, m) => assert!(m.contains("scripted panic"), "{m}"),
        other => panic!("{other:?}"),
    }
    let (j, rx) = job(&[ERROR_TOKEN], 3);
    h.handle.submit(j).unwrap();
    match outcome(rx) {
        Outcome::Error(500, m) => assert!(m.contains("scripted error"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A panic takes down only its batch: a job in the same step fails with it, and the
    // scheduler serves the next ones.
    let (j, rx) = job(&[1], 2);
    h.handle.submit(j).unwrap();
    assert!(matches!(outcome(rx), Outcome::Done { .. }));
    wait_for("blocks freed", || {
        gauge(&h.handle, |s| {
            s.kv_blocks_used.load(std::sync::atomic::Ordering::Relaxed)
        }) == 0
    });
}

#[test]
fn a_dropped_receiver_frees_the_sequence_and_a_full_queue_refuses() {
    let cfg = SchedulerConfig {
        max_batch: 1,
        max_queue: 1,
        ..SchedulerConfig::default()
    };
    let mut h = start(cfg, 64, true);
    let entered = h.entered.take().unwrap();
    let go = h.go.take().unwrap();
    // A runs (its forward waits at the gate); B waits in the queue; C is refused.
    let (a, rxa) = job(&[1], 1000);
    h.handle.submit(a).unwrap();
    entered.recv().unwrap();
    let (b, rxb) = job(&[2], 2);
    h.handle.submit(b).unwrap();
    let (c, _rxc) = job(&[3], 2);
    assert_eq!(h.handle.submit(c).unwrap_err(), SubmitError::QueueFull);
    // A's client goes away: at the next step its sequence is dropped and B runs.
    drop(rxa);
    go.send(()).unwrap();
    std::thread::spawn(move || {
        while entered.recv().is_ok() {
            if go.send(()).is_err() {
                break;
            }
        }
    });
    assert!(matches!(outcome(rxb), Outcome::Done { .. }));
    wait_for("all sequences gone", || {
        gauge(&h.handle, |s| {
            s.running.load(std::sync::atomic::Ordering::Relaxed)
        }) == 0
            && gauge(&h.handle, |s| {
                s.kv_blocks_used.load(std::sync::atomic::Ordering::Relaxed)
            }) == 0
    });
    let a_steps = h
        .log
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .filter(|(s, _)| *s == SeqId(1))
        .count();
    assert!(a_steps <= 2, "A ran {a_steps} steps after its client left");
    // With room again, a new job is taken.
    let (d, rxd) = job(&[4], 1);
    h.handle.submit(d).unwrap();
    assert!(matches!(outcome(rxd), Outcome::Done { .. }));
}

#[test]
fn cancel_all_ends_queued_and_running_jobs_with_503() {
    let cfg = SchedulerConfig {
        max_batch: 1,
        ..SchedulerConfig::default()
    };
    let mut h = start(cfg, 64, true);
    let entered = h.entered.take().unwrap();
    let go = h.go.take().unwrap();
    let (a, rxa) = job(&[1], 1000);
    h.handle.submit(a).unwrap();
    entered.recv().unwrap();
    let (b, rxb) = job(&[2], 1000);
    h.handle.submit(b).unwrap();
    h.handle.cancel_all();
    go.send(()).unwrap();
    std::thread::spawn(move || {
        while entered.recv().is_ok() {
            if go.send(()).is_err() {
                break;
            }
        }
    });
    for rx in [rxa, rxb] {
        match outcome(rx) {
            Outcome::Error(503, m) => assert!(m.contains("shutting down"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn free_places_in_the_batch_do_not_count_as_queue() {
    let cfg = SchedulerConfig {
        max_batch: 2,
        max_queue: 1,
        ..SchedulerConfig::default()
    };
    let mut h = start(cfg, 64, true);
    let entered = h.entered.take().unwrap();
    let go = h.go.take().unwrap();
    let (a, rxa) = job(&[1], 3);
    h.handle.submit(a).unwrap();
    entered.recv().unwrap();
    // A runs; B takes the free place at the next step; C waits; D finds the queue full.
    let (b, rxb) = job(&[2], 3);
    let (c, rxc) = job(&[3], 3);
    let (d, _rxd) = job(&[4], 3);
    h.handle.submit(b).unwrap();
    h.handle.submit(c).unwrap();
    assert_eq!(h.handle.submit(d).unwrap_err(), SubmitError::QueueFull);
    go.send(()).unwrap();
    std::thread::spawn(move || {
        while entered.recv().is_ok() {
            if go.send(()).is_err() {
                break;
            }
        }
    });
    for rx in [rxa, rxb, rxc] {
        assert!(matches!(outcome(rx), Outcome::Done { .. }));
    }
}
