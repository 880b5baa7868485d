//! Continuous batching: one OS thread per model owns its [`smelt_engine::Engine`] and runs
//! steps.
//!
//! Every step gathers, into ONE `Engine::forward` call, the next token of every running
//! sequence plus prefill chunks of sequences still reading their prompt, within a token
//! budget per step so one long prompt cannot stall everyone else's decoding. Requests join
//! at every step, and leave the moment they finish or their client goes away (the response
//! channel is closed): their KV blocks are freed at once. When the KV cache is full, the
//! newest sequence is preempted back to the queue (its tokens are recomputed later); one
//! that cannot fit even alone gets a 503.
//!
//! Compute never runs on the async runtime: HTTP handlers talk to this thread over
//! channels. A sequence is processed exactly as [`smelt_engine::generate::generate`]
//! processes it (same sampler calls on the same logits, same text and stop handling), and the
//! engine computes each batch row independently of its neighbours, so greedy output equals
//! `smelt run`'s token for token whatever else is running. On the CPU a row also depends on
//! whether its chunk holds one token or more (llama.cpp's two summation orders), so prompts
//! are never cut into one-token pieces and a preempted sequence recomputes the tokens it
//! generated one per step (`plan::chunk_len`): preemption never changes an
//! answer. A step where every sequence picks by plain argmax (and wants no logprobs) asks
//! the engine for the tokens themselves ([`smelt_engine::Engine::forward_greedy`]: on the
//! GPU the logits never leave it); they are the argmax of the same logits.
//!
//! This file holds the handlers' side, the thread's loop and the batch's bookkeeping; what a
//! step feeds is planned in `plan`, and what its output does (tokens picked and sent,
//! sequences finished) is in `consume`.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::Instant;

use smelt_engine::generate::{FinishReason, TextStream, TokenText};
use smelt_engine::sampler::{Sampler, SamplingParams};
use smelt_engine::{EngineError, Logits, Pooling, SeqId};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::metrics::ModelStats;

mod constrain;
mod consume;
mod plan;
mod step_engine;

pub use constrain::Constraint;
pub use step_engine::StepEngine;

/// How a model's scheduler sizes its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences in the running batch.
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch; more get 429.
    pub max_queue: usize,
    /// Tokens per step (decode tokens first, the rest for prefill chunks).
    pub step_tokens: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch: 32,
            max_queue: 64,
            step_tokens: 256,
        }
    }
}

/// One request for the scheduler.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    /// Already limited to what fits in the context.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Keep going past end-of-generation tokens (benchmarks that need exactly max_tokens).
    pub ignore_eog: bool,
    pub events: mpsc::UnboundedSender<Event>,
    /// When the request arrived (time to first token counts from here).
    pub arrived: Instant,
    /// Logit biases, a grammar, prompt log-probabilities.
    pub constraint: Constraint,
}

/// A token's log-probability under the model (before penalties and temperature).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// The most likely tokens at this position, best first: (bytes, logprob).
    pub top: Vec<(Vec<u8>, f32)>,
}

/// What the scheduler tells a request's handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt's tokens with their log-probabilities given what precedes them (the first
    /// has none), when the job asked for them.
    Prompt(Vec<(Vec<u8>, Option<TokenLogprob>)>),
    /// One generated token and the text it lets through (may be empty: held back while it
    /// could be the start of a stop string or of a multi-byte character).
    Token {
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The last event of a request that ended normally.
    Done {
        finish_reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The last event of a request that failed.
    Error(ApiError),
}

/// Why a job was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full")]
    QueueFull,
    #[error("the model's scheduler has stopped")]
    Stopped,
}

enum Command {
    Submit(Box<Job>),
    /// Embed these inputs between two steps (see [`SchedulerHandle::embed`]).
    Embed {
        inputs: Vec<Vec<u32>>,
        pooling: Pooling,
        reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
    },
    /// End every request now with a 503 (the shutdown grace period ran out).
    CancelAll,
}

/// The handlers' side of a model's scheduler. Cloneable; the thread ends once every handle
/// is dropped and its last request has finished.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: std_mpsc::Sender<Command>,
    /// Requests submitted and not yet admitted into the batch.
    queued: Arc<AtomicUsize>,
    /// Sequences in the running batch, as the scheduler last saw them.
    running: Arc<AtomicUsize>,
    max_queue: usize,
    max_batch: usize,
    pub stats: Arc<ModelStats>,
}

impl SchedulerHandle {
    /// Queues a job, or refuses it at once when `max_queue` requests already wait for a
    /// place in the batch. A request that will find a free place in the batch at the next
    /// step does not count as waiting, even if the scheduler has not picked it up yet.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let free_places = self
            .max_batch
            .saturating_sub(self.running.load(Ordering::SeqCst));
        let before = self.queued.fetch_add(1, Ordering::SeqCst);
        if before >= self.max_queue + free_places {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull);
        }
        self.stats
            .queue_depth
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tx.send(Command::Submit(Box::new(job))).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }

    /// Embeds `inputs` (token ids, each within the context) pooled by `pooling`, not
    /// normalized. The scheduler runs them between two steps of its batch, each input a
    /// sequence of its own, fed in steps of `step_tokens`.
    pub async fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, ApiError> {
        let (reply, rx) = oneshot::channel();
        let stopped = || ApiError::unavailable("the model's scheduler has stopped");
        self.tx
            .send(Command::Embed {
                inputs,
                pooling,
                reply,
            })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Ends every queued and running request with a 503.
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Command::CancelAll);
    }
}

/// What the loading thread hands back about a model it loaded; `extra` is whatever else
/// the load function built next to the engine (a chat template, the file's path).
pub struct Started<T, X> {
    pub extra: X,
    pub handle: SchedulerHandle,
    pub total_blocks: usize,
    pub tokenizer: Arc<T>,
    pub join: std::thread::JoinHandle<()>,
}

/// Starts a model's scheduler thread. `load` runs on that thread (so the engine never has to
/// cross threads) and returns the engine and its tokenizer; its error is returned here.
pub fn spawn<E, T, F, X>(
    name: String,
    load: F,
    cfg: SchedulerConfig,
) -> Result<Started<T, X>, String>
where
    E: StepEngine + 'static,
    T: TokenText + Send + Sync + 'static,
    F: FnOnce() -> Result<(E, Arc<T>, X), String> + Send + 'static,
    X: Send + 'static,
{
    let (tx, rx) = std_mpsc::channel();
    let stats = Arc::new(ModelStats::default());
    let queued = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let thread_running = Arc::clone(&running);
    let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
    let thread_stats = Arc::clone(&stats);
    let thread_queued = Arc::clone(&queued);
    let thread_name = name.clone();
    let join = std::thread::Builder::new()
        .name(format!("sched-{name}"))
        .spawn(move || {
            let (engine, tok, extra) = match load() {
                Ok(x) => x,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok((engine.total_blocks(), Arc::clone(&tok), extra)));
            let lone_rows_differ = engine.lone_token_rows_differ();
            let mut s = Scheduler {
                name: thread_name,
                engine,
                tok,
                cfg,
                stats: thread_stats,
                queued: thread_queued,
                running_now: thread_running,
                waiting: VecDeque::new(),
                running: Vec::new(),
                next_order: 0,
                kv_full: false,
                embeds: VecDeque::new(),
                lone_rows_differ,
            };
            s.run(rx);
        })
        .map_err(|e| format!("cannot start the scheduler thread: {e}"))?;
    let (total_blocks, tokenizer, extra) = ready_rx
        .recv()
        .map_err(|_| "the model's loading thread died".to_string())??;
    stats
        .kv_blocks_free
        .store(total_blocks as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(Started {
        extra,
        handle: SchedulerHandle {
            tx,
            queued,
            running,
            max_queue: cfg.max_queue,
            max_batch: cfg.max_batch.max(1),
            stats,
        },
        total_blocks,
        tokenizer,
        join,
    })
}

/// An embedding step's failure as an answer: a full KV cache is the server's load (503),
/// a bad token the client's (400), anything else internal.
fn embed_error(e: EngineError) -> ApiError {
    match e {
        EngineError::OutOfKvBlocks { need, free } => ApiError::unavailable(format!(
            "an input needs {need} KV blocks and the cache has {free}: the KV cache is too \
             small for it (--kv-tokens)"
        )),
        EngineError::BadToken { .. } | EngineError::ContextOverflow { .. } => {
            ApiError::invalid_param("input", e.to_string())
        }
        e => ApiError::internal(format!("embedding failed: {e}")),
    }
}

/// A request inside the scheduler, queued or running.
struct Active {
    job: Job,
    seq: Option<SeqId>,
    /// Prompt then generated tokens; the last generated one is not in the KV cache yet.
    context: Vec<u32>,
    /// How many of `context` are in the KV cache.
    fed: usize,
    generated: usize,
    sampler: Sampler,
    text: TextStream,
    /// Still counted in the handle's `queued` (never admitted yet).
    counted_in_queue: bool,
    /// Prompt log-probabilities gathered so far (reset when the sequence is preempted
    /// before they were sent); `sent_prompt` once [`Event::Prompt`] went out.
    prompt_lps: Vec<(Vec<u8>, Option<TokenLogprob>)>,
    sent_prompt: bool,
    /// Admission order; the newest running sequence is the one preempted.
    order: u64,
    last_token_at: Option<Instant>,
}

impl Active {
    fn new(job: Job) -> Active {
        Active {
            context: job.prompt.clone(),
            fed: 0,
            generated: 0,
            sampler: Sampler::new(job.sampling.clone()),
            text: TextStream::new(&job.stop),
            seq: None,
            counted_in_queue: true,
            prompt_lps: Vec::new(),
            sent_prompt: false,
            order: 0,
            last_token_at: None,
            job,
        }
    }

    fn remaining(&self) -> usize {
        self.context.len() - self.fed
    }
}

/// What a step gave back: every row's logits, or (a greedy step) every row's token.
enum StepOut {
    Logits(Vec<Vec<Vec<f32>>>),
    Tokens(Vec<Option<u32>>),
}

struct Scheduler<E, T> {
    /// The model id, for logs.
    name: String,
    engine: E,
    tok: Arc<T>,
    cfg: SchedulerConfig,
    stats: Arc<ModelStats>,
    queued: Arc<AtomicUsize>,
    /// `running.len()` for the handles' admission check.
    running_now: Arc<AtomicUsize>,
    waiting: VecDeque<Active>,
    running: Vec<Active>,
    next_order: u64,
    /// The KV cache ran out since a sequence last freed blocks: admitting more now would
    /// only be preempted again, so the queue waits until something finishes.
    kv_full: bool,
    /// Embedding requests, run between steps (see [`Scheduler::run_embeds`]).
    embeds: VecDeque<EmbedJob>,
    /// The engine's [`StepEngine::lone_token_rows_differ`], read once.
    lone_rows_differ: bool,
}

/// A queued `/v1/embeddings` request.
struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

impl<E: StepEngine, T: TokenText> Scheduler<E, T> {
    fn run(&mut self, rx: std_mpsc::Receiver<Command>) {
        let mut open = true;
        loop {
            if self.running.is_empty() && self.waiting.is_empty() && self.embeds.is_empty() {
                if !open {
                    break;
                }
                match rx.recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(_) => break,
                }
            }
            let busy = Instant::now();
            loop {
                match rx.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(std_mpsc::TryRecvError::Empty) => break,
                    Err(std_mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.drop_cancelled();
            self.run_embeds();
            self.admit();
            self.step();
            // Before `publish`, so a reader that sees the batch empty sees its time too.
            let us = busy.elapsed().as_micros() as u64;
            self.stats.time.busy_us.fetch_add(us, Ordering::Relaxed);
            self.publish();
        }
        tracing::debug!("scheduler stops: no handle left and no work");
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(job) => {
                self.stats
                    .prompt_tokens
                    .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
                self.waiting.push_back(Active::new(*job));
            }
            Command::Embed {
                inputs,
                pooling,
                reply,
            } => self.embeds.push_back(EmbedJob {
                inputs,
                pooling,
                reply,
            }),
            Command::CancelAll => {
                let err = ApiError::unavailable("the server is shutting down");
                for a in std::mem::take(&mut self.running) {
                    self.finish_err(a, err.clone());
                }
                for a in std::mem::take(&mut self.waiting) {
                    self.finish_err(a, err.clone());
                }
            }
        }
    }

    /// Runs the queued embeddings, oldest first, between two steps. One that needs more KV
    /// blocks than are free waits for running sequences to finish (like a prompt does); with
    /// nothing running it can never fit and gets a 503.
    fn run_embeds(&mut self) {
        while let Some(e) = self.embeds.front() {
            if e.reply.is_closed() {
                self.embeds.pop_front(); // the client went away while it waited
                continue;
            }
            let step = self.cfg.step_tokens;
            let (inputs, pooling) = (&e.inputs, e.pooling);
            let ran = catch_unwind(AssertUnwindSafe(|| {
                self.engine.embed(inputs, pooling, step)
            }));
            let out = match ran {
                Ok(Err(EngineError::OutOfKvBlocks { .. })) if !self.running.is_empty() => return,
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(embed_error(e)),
                Err(_) => {
                    tracing::error!(model = %self.name, "the engine panicked while embedding");
                    Err(ApiError::internal("the engine failed while embedding"))
                }
            };
            if let Some(e) = self.embeds.pop_front() {
                let _ = e.reply.send(out);
            }
        }
    }

    /// Requests whose client went away leave now, queued or running.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.events.is_closed() {
                let a = self.running.swap_remove(i);
                self.release_gone(a);
            } else {
                i += 1;
            }
        }
        // swap_remove shuffles; the order field keeps admission order where it matters.
        self.running.sort_by_key(|a| a.order);
        let waiting = std::mem::take(&mut self.waiting);
        for a in waiting {
            if a.job.events.is_closed() {
                self.release(a);
            } else {
                self.waiting.push_back(a);
            }
        }
    }

    /// Moves queued requests into the batch while there is room.
    fn admit(&mut self) {
        if self.kv_full && !self.running.is_empty() {
            return;
        }
        while self.running.len() < self.cfg.max_batch.max(1) {
            let Some(mut a) = self.waiting.pop_front() else {
                break;
            };
            if a.counted_in_queue {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                a.counted_in_queue = false;
            }
            let seq = self.engine.new_sequence();
            a.seq = Some(seq);
            // Prefix caching: what is cached of its tokens is not fed again (all of the
            // prompt is, when its log-probabilities are asked for).
            if a.job.constraint.prompt_logprobs.is_none() || a.sent_prompt {
                a.fed = self.attach_prefix(&mut a);
            }
            a.order = self.next_order;
            self.next_order += 1;
            self.running.push(a);
        }
        self.running_now.store(self.running.len(), Ordering::SeqCst);
    }

    /// One batched forward over the running sequences, and what follows from its logits.
    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        loop {
            let (inputs, owners) = self.plan();
            if inputs.is_empty() {
                return;
            }
            // When every sequence that gets a token this step picks it by plain argmax and
            // wants no logprobs, the engine picks them where the logits are (on the GPU:
            // a few bytes back instead of a vocabulary of floats per sequence).
            let greedy = inputs.iter().zip(&owners).all(|(inp, &i)| {
                let a = &self.running[i];
                inp.logits == Logits::None
                    || (a.sampler.params().is_plain_greedy()
                        && a.job.logprobs.is_none()
                        && !a.job.constraint.active())
            });
            // The grammar masks of the sequences that pick a token this step depend only on
            // the tokens they have: they are computed on another thread while the forward
            // runs (on a GPU, the CPU is otherwise idle then).
            let mut picks = vec![false; self.running.len()];
            for (inp, &i) in inputs.iter().zip(&owners) {
                picks[i] =
                    inp.logits != Logits::None && self.running[i].job.constraint.grammar.is_some();
            }
            let (engine, running) = (&mut self.engine, &mut self.running);
            let mut forward = || {
                catch_unwind(AssertUnwindSafe(|| {
                    if greedy {
                        StepEngine::forward_greedy(engine, &inputs).map(StepOut::Tokens)
                    } else {
                        StepEngine::forward(engine, &inputs).map(StepOut::Logits)
                    }
                }))
            };
            let t0 = Instant::now();
            let result = if picks.iter().any(|&p| p) {
                std::thread::scope(|sc| {
                    let masks = sc.spawn(|| {
                        for (a, _) in running.iter_mut().zip(&picks).filter(|(_, &p)| p) {
                            let t0 = Instant::now();
                            let c = &mut a.job.constraint;
                            if let Some(g) = c.grammar.as_mut() {
                                c.mask = Some(g.compute_mask_or_eos().map_err(|e| e.to_string()));
                                c.mask_us = t0.elapsed().as_micros() as u64;
                            }
                        }
                    });
                    let result = forward();
                    let _ = masks.join();
                    result
                })
            } else {
                forward()
            };
            let us = t0.elapsed().as_micros() as u64;
            self.stats.time.forward_us.fetch_add(us, Ordering::Relaxed);
            match result {
                Ok(Ok(out)) => {
                    self.stats.steps.fetch_add(1, Ordering::Relaxed);
                    self.consume(&inputs, &owners, out);
                    return;
                }
                Ok(Err(EngineError::OutOfKvBlocks { need, free })) => {
                    if self.running.len() > 1 {
                        self.preempt_newest();
                        continue;
                    }
                    let mut a = self.running.remove(0);
                    if a.generated > 0 {
                        // It grew past the whole cache while generating alone: what it has
                        // is a complete answer cut by length, as a full context would cut it.
                        let rest = a.text.finish();
                        if !rest.is_empty() {
                            let _ = a.job.events.send(Event::Token {
                                id: a.context.last().copied().unwrap_or(0),
                                text: rest,
                                logprob: None,
                            });
                        }
                        let _ = a.job.events.send(Event::Done {
                            finish_reason: FinishReason::Length,
                            prompt_tokens: a.job.prompt.len(),
                            completion_tokens: a.generated,
                        });
                        self.release(a);
                        return;
                    }
                    self.finish_err(
                        a,
                        ApiError::unavailable(format!(
                            "the request needs more KV cache than the server has \
                             ({need} blocks needed, {free} free): shorten it or raise --kv-tokens"
                        )),
                    );
                    return;
                }
                Ok(Err(e)) => {
                    tracing::error!("forward step failed: {e}");
                    self.fail_batch(&owners, &format!("the engine failed: {e}"));
                    return;
                }
                Err(panic) => {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    tracing::error!("forward step panicked: {why}");
                    self.fail_batch(&owners, &format!("the engine panicked: {why}"));
                    return;
                }
            }
        }
    }

    /// Sends the newest running sequence back to the front of the queue; its KV blocks are
    /// freed and its tokens will be recomputed when it is admitted again.
    fn preempt_newest(&mut self) {
        let Some(idx) = self
            .running
            .iter()
            .enumerate()
            .max_by_key(|(_, a)| a.order)
            .map(|(i, _)| i)
        else {
            return;
        };
        let mut a = self.running.remove(idx);
        if let Some(seq) = a.seq.take() {
            self.engine.free_sequence(seq);
        }
        a.fed = 0;
        if !a.sent_prompt {
            a.prompt_lps.clear();
        }
        self.kv_full = true;
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            tokens = a.context.len(),
            "KV cache full: a sequence goes back to the queue"
        );
        self.waiting.push_front(a);
    }

    fn fail_batch(&mut self, owners: &[usize], message: &str) {
        let mut idx: Vec<usize> = owners.to_vec();
        idx.sort_unstable_by(|a, b| b.cmp(a));
        idx.dedup();
        for i in idx {
            let a = self.running.remove(i);
            self.finish_err(a, ApiError::internal(message));
        }
    }

    fn finish_err(&mut self, a: Active, err: ApiError) {
        let _ = a.job.events.send(Event::Error(err));
        self.release(a);
    }

    /// Releases a request whose client disconnected, saying so in the log.
    fn release_gone(&mut self, a: Active) {
        tracing::info!(
            model = %self.name,
            completion_tokens = a.generated,
            "client went away: sequence dropped"
        );
        self.release(a);
    }

    /// Frees what a request holds: its KV blocks, its place in the queue count.
    fn release(&mut self, mut a: Active) {
        if let Some(seq) = a.seq.take() {
            self.engine.free_sequence(seq);
            self.kv_full = false;
        }
        if a.counted_in_queue {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Gauges for `/metrics`.
    fn publish(&self) {
        self.running_now.store(self.running.len(), Ordering::SeqCst);
        let s = &self.stats;
        s.running
            .store(self.running.len() as u64, Ordering::Relaxed);
        let preempted = self.waiting.iter().filter(|a| !a.counted_in_queue).count();
        s.queue_depth.store(
            (self.queued.load(Ordering::SeqCst) + preempted) as u64,
            Ordering::Relaxed,
        );
        let (queried, hits) = self.engine.prefix_cache_stats();
        s.prefix_query_tokens.store(queried, Ordering::Relaxed);
        s.prefix_hit_tokens.store(hits, Ordering::Relaxed);
        let free = self.engine.free_blocks();
        s.kv_blocks_free.store(free as u64, Ordering::Relaxed);
        s.kv_blocks_used.store(
            self.engine.total_blocks().saturating_sub(free) as u64,
            Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests;
