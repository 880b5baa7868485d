//! The tensor-parallel runner: one thread per rank, each owning its device's context,
//! stream, CUDA graphs, weight slices and KV cache (or, on the CPU, its slices and cache
//! with the simulated all-reduce). The engine hands every step to all ranks at once; they
//! run it in lockstep (the all-reduces pair them up) and rank 0's result is the step's: each
//! rank computes the same logits from the same all-reduced activations, so rank 0 samples
//! and the engine feeds its token to every rank with the next step.
//!
//! A hybrid model's recurrent state (delta-net conv windows and delta matrices) is split
//! like its heads: each rank keeps, per sequence, the state of its own delta-net heads,
//! made at the sequence's first step and dropped when the engine frees the sequence.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smelt_gguf::Gguf;

use super::cpu::{SimComm, SimReduce};
use super::plan::{ShardPlan, TpOptions};
use super::shard::rank_gguf;
use crate::backend::cpu::{Cpu, CpuKv};
use crate::backend::cuda::comm::NcclReduce;
use crate::backend::cuda::options::CudaOptions;
use crate::backend::cuda::runner::{KvPlan, StepOut};
use crate::backend::cuda::CudaEngine;
use crate::backend::{AttnSeq, Backend, DeltaState};
use crate::device::Device;
use crate::kv_cache::SeqId;
use crate::model::{AllReduce, Model};
use crate::EngineError;

/// One sequence of a step, owned (it crosses to the rank threads).
#[derive(Clone, Debug)]
pub struct OwnedSeq {
    pub row: usize,
    pub n_tokens: usize,
    pub start_pos: usize,
    pub blocks: Vec<u32>,
}

/// A step as every rank receives it.
#[derive(Debug)]
pub struct StepMsg {
    /// The sequences' ids, in `seqs` order (each rank finds their recurrent states by them).
    pub ids: Vec<SeqId>,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub seqs: Vec<OwnedSeq>,
    pub out_rows: Vec<usize>,
    pub greedy: bool,
}

impl StepMsg {
    fn attn(&self) -> Vec<AttnSeq<'_>> {
        self.seqs
            .iter()
            .map(|s| AttnSeq {
                row: s.row,
                n_tokens: s.n_tokens,
                start_pos: s.start_pos,
                blocks: &s.blocks,
            })
            .collect()
    }
}

/// What a rank thread runs.
trait RankStep {
    fn step(&mut self, m: &StepMsg) -> Result<StepOut, EngineError>;
    /// Drops a sequence's recurrent state (nothing for a model without one).
    fn free(&mut self, id: SeqId);
    /// Time of one all-reduce of `count` floats, back to back (`iters` of them), on this
    /// rank's device and communicator.
    fn time_all_reduce(&mut self, count: usize, iters: usize) -> Result<Duration, EngineError>;
}

struct CudaRank(CudaEngine);

impl RankStep for CudaRank {
    fn step(&mut self, m: &StepMsg) -> Result<StepOut, EngineError> {
        let seqs = m.attn();
        self.0.forward_seqs(
            &m.ids,
            &m.tokens,
            &m.positions,
            &seqs,
            &m.out_rows,
            m.greedy,
        )
    }

    fn free(&mut self, id: SeqId) {
        self.0.free_state(id);
    }

    fn time_all_reduce(&mut self, count: usize, iters: usize) -> Result<Duration, EngineError> {
        let e = &self.0;
        let Some(r) = e.reduce() else {
            return Ok(Duration::ZERO);
        };
        let gpu = e.backend().gpu();
        let buf = gpu.zeros::<f32>(count.max(1))?;
        let mut t = crate::backend::cuda::CudaTensor {
            ptr: gpu.ptr(&buf),
            rows: 1,
            cols: count,
            cap: count,
        };
        for _ in 0..10 {
            r.all_reduce(e.backend(), &mut t)?;
        }
        gpu.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..iters {
            r.all_reduce(e.backend(), &mut t)?;
        }
        gpu.synchronize()?;
        Ok(t0.elapsed() / iters.max(1) as u32)
    }
}

struct CpuRank {
    model: Model<Cpu>,
    kv: CpuKv,
    reduce: SimReduce,
    /// Each sequence's recurrent state for this rank's delta-net heads.
    states: HashMap<SeqId, Vec<DeltaState<crate::backend::cpu::CpuTensor>>>,
}

impl RankStep for CpuRank {
    fn step(&mut self, m: &StepMsg) -> Result<StepOut, EngineError> {
        let seqs = m.attn();
        let red: &dyn AllReduce<Cpu> = &self.reduce;
        let hybrid = self.model.info.delta.is_some();
        if hybrid && m.ids.len() != seqs.len() {
            return Err(EngineError::BadOptions(format!(
                "{} sequence ids for {} sequences",
                m.ids.len(),
                seqs.len()
            )));
        }
        // The step's states out of the map (fresh for new sequences), back after it.
        let mut taken: Vec<_> = if hybrid {
            m.ids
                .iter()
                .map(|id| {
                    self.states
                        .remove(id)
                        .unwrap_or_else(|| self.model.new_state(&Cpu::GGML))
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut refs: Vec<&mut Vec<_>> = taken.iter_mut().collect();
        let ran = self.model.forward_tp(
            &Cpu::GGML,
            &mut self.kv,
            &mut refs,
            &m.tokens,
            &m.positions,
            &seqs,
            &m.out_rows,
            Some(red),
        );
        drop(refs);
        for (id, st) in m.ids.iter().zip(taken) {
            self.states.insert(*id, st);
        }
        let t = ran?;
        let mut data = t.data;
        data.truncate(t.rows * t.cols);
        Ok(StepOut::Logits(data))
    }

    fn free(&mut self, id: SeqId) {
        self.states.remove(&id);
    }

    fn time_all_reduce(&mut self, count: usize, iters: usize) -> Result<Duration, EngineError> {
        let mut v = vec![0f32; count];
        let t0 = Instant::now();
        for _ in 0..iters {
            self.reduce.comm.all_reduce(self.reduce.rank, &mut v);
        }
        Ok(t0.elapsed() / iters.max(1) as u32)
    }
}

enum Cmd {
    Step(Arc<StepMsg>),
    TimeAllReduce {
        count: usize,
        iters: usize,
    },
    /// Drop a sequence's state (no answer: the next command comes after it in the queue).
    Free(SeqId),
}

enum Reply {
    Step(StepOut),
    Time(Duration),
}

struct Worker {
    tx: Option<Sender<Cmd>>,
    rx: Receiver<Result<Reply, EngineError>>,
    handle: Option<JoinHandle<()>>,
}

/// What a rank reports once loaded: its KV blocks and its device's name.
type Loaded = Result<(usize, String), EngineError>;

/// A model split over several devices.
pub struct TpRunner {
    pub plan: ShardPlan,
    devices: Vec<Device>,
    workers: Vec<Worker>,
    kv_blocks: usize,
    names: Vec<String>,
    /// Which all-reduce the group runs, in words.
    all_reduce: String,
    /// Time the last step took from hand-out to rank 0's answer.
    pub last_step: Duration,
    /// How long waits for a step's answers poll before sleeping (see [`SPIN`]).
    spin: Duration,
}

impl TpRunner {
    /// Splits `gguf` over `devices` (all CUDA, or all CPU: simulated ranks) and loads each
    /// rank on its own thread. `kv` sizes each rank's cache; the runner's is the smallest.
    pub fn load(
        gguf: &Arc<Gguf>,
        devices: &[Device],
        kv: &KvPlan,
        batch_invariant: bool,
    ) -> Result<TpRunner, EngineError> {
        let n = devices.len();
        let cuda = devices.iter().all(|d| matches!(d, Device::Cuda(_)));
        if !cuda && devices.iter().any(|d| matches!(d, Device::Cuda(_))) {
            return Err(EngineError::BadOptions(
                "tensor parallelism runs on CUDA devices only or on the CPU only".into(),
            ));
        }
        let plan = ShardPlan::new(
            gguf,
            TpOptions {
                n_ranks: n,
                vocab_parallel: n > 1 && CudaOptions::from_env(batch_invariant).tp.vocab_parallel,
            },
        )?;
        let ordinals: Vec<usize> = devices
            .iter()
            .map(|d| match d {
                Device::Cuda(o) => *o,
                Device::Cpu => 0,
            })
            .collect();
        // The one-shot peer all-reduce for small messages (on by default, `SMELT_TP_PEER=0`
        // turns it off; every rank reads the same setting, so all decide alike).
        let cuda_opts = CudaOptions::from_env(batch_invariant);
        let peer_max = cuda_opts.peer_max_bytes(n);
        let skip_all_reduce = cuda_opts.tp.skip_all_reduce;
        let rendezvous =
            (cuda && n > 1 && peer_max > 0).then(|| smelt_cuda::peer::Rendezvous::new(n));
        let peer_cells: Vec<Arc<OnceLock<smelt_cuda::peer::PeerReduce>>> =
            (0..n).map(|_| Arc::new(OnceLock::new())).collect();
        let mut comms: Vec<Option<smelt_cuda::nccl::Comm>> = if cuda && n > 1 {
            smelt_cuda::nccl::Comm::init_all(&ordinals)?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            (0..n).map(|_| None).collect()
        };
        let sim = SimComm::new(n);
        let spin = if cuda { SPIN } else { Duration::ZERO };
        let plan_arc = Arc::new(plan.clone());
        let mut workers = Vec::with_capacity(n);
        let mut loaded_rx = Vec::with_capacity(n);
        for (rank, &device) in devices.iter().enumerate() {
            let (tx, rx_cmd) = channel::<Cmd>();
            let (tx_out, rx) = channel();
            let (tx_loaded, rx_loaded) = channel::<Loaded>();
            let gguf = gguf.clone();
            let plan = plan_arc.clone();
            let comm = comms[rank].take();
            let sim = sim.clone();
            let kv = *kv;
            let rendezvous = rendezvous.clone();
            let peer_cell = peer_cells[rank].clone();
            let ordinals = ordinals.clone();
            let handle = std::thread::Builder::new()
                .name(format!("smelt-tp{rank}"))
                .spawn(move || {
                    // Every rank meets the others once to start the peer all-reduce, loaded
                    // or not (a rank that stayed away would leave the others waiting).
                    let mut met = false;
                    let mut meet = |gpu: Option<&Arc<smelt_cuda::Gpu>>| {
                        if let (Some(rv), false) = (&rendezvous, met) {
                            met = true;
                            let cap = peer_max / 4;
                            match smelt_cuda::peer::PeerReduce::start(gpu, rank, &ordinals, cap, rv)
                            {
                                Ok(p) => {
                                    let _ = peer_cell.set(p);
                                }
                                Err(why) if rank == 0 => eprintln!(
                                    "smelt: tensor parallelism without the peer all-reduce \
                                     (NCCL for every size): {why}"
                                ),
                                Err(_) => {}
                            }
                        }
                    };
                    let made = (|| -> Result<(Box<dyn RankStep>, usize, String), EngineError> {
                        let g = Arc::new(rank_gguf(&gguf, &plan, rank)?);
                        drop(gguf);
                        match device {
                            Device::Cuda(ordinal) => {
                                let reduce: Option<Box<dyn AllReduce<crate::backend::cuda::Cuda>>> =
                                    comm.map(|c| {
                                        Box::new(NcclReduce::new(
                                            c,
                                            peer_cell.clone(),
                                            skip_all_reduce,
                                        )) as _
                                    });
                                let e = CudaEngine::load_rank(
                                    &g,
                                    ordinal,
                                    &kv,
                                    batch_invariant,
                                    reduce,
                                );
                                meet(e.as_ref().ok().map(|e| e.backend().gpu()));
                                let e = e?;
                                let name = format!("cuda:{ordinal} ({})", e.backend().gpu().name());
                                let blocks = e.kv_blocks();
                                Ok((Box::new(CudaRank(e)), blocks, name))
                            }
                            Device::Cpu => {
                                let model = Model::load(&Cpu::GGML, &g)?;
                                let i = &model.info;
                                let cache = Cpu::GGML.kv_alloc(
                                    i.n_layer,
                                    kv.min_blocks,
                                    kv.block_size,
                                    i.n_head_kv * i.head_dim,
                                );
                                let r = CpuRank {
                                    model,
                                    kv: cache,
                                    reduce: SimReduce { comm: sim, rank },
                                    states: HashMap::new(),
                                };
                                Ok((Box::new(r), kv.min_blocks, "cpu".into()))
                            }
                        }
                    })();
                    meet(None);
                    let mut rank_step = match made {
                        Ok((r, blocks, name)) => {
                            let _ = tx_loaded.send(Ok((blocks, name)));
                            r
                        }
                        Err(e) => {
                            let _ = tx_loaded.send(Err(e));
                            return;
                        }
                    };
                    while let Ok(cmd) = spin_recv(&rx_cmd, spin) {
                        let out = match cmd {
                            Cmd::Step(m) => rank_step.step(&m).map(Reply::Step),
                            Cmd::TimeAllReduce { count, iters } => {
                                rank_step.time_all_reduce(count, iters).map(Reply::Time)
                            }
                            Cmd::Free(id) => {
                                rank_step.free(id);
                                continue;
                            }
                        };
                        if tx_out.send(out).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| EngineError::BadOptions(format!("rank thread: {e}")))?;
            workers.push(Worker {
                tx: Some(tx),
                rx,
                handle: Some(handle),
            });
            loaded_rx.push(rx_loaded);
        }
        let mut kv_blocks = usize::MAX;
        let mut names = Vec::with_capacity(n);
        let mut first_err = None;
        for (rank, rx) in loaded_rx.into_iter().enumerate() {
            match rx.recv() {
                Ok(Ok((blocks, name))) => {
                    kv_blocks = kv_blocks.min(blocks);
                    names.push(name);
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(EngineError::BadOptions(format!("rank {rank}: {e}")));
                }
                Err(_) => {
                    first_err.get_or_insert(EngineError::BadOptions(format!(
                        "rank {rank}'s thread ended while loading"
                    )));
                }
            }
        }
        let all_reduce = if !cuda || n == 1 {
            "none".to_string()
        } else if peer_cells.iter().all(|c| c.get().is_some()) {
            format!("peer<={}KB+NCCL", peer_max / 1024)
        } else {
            "NCCL".to_string()
        };
        let runner = TpRunner {
            plan,
            devices: devices.to_vec(),
            workers,
            kv_blocks,
            names,
            all_reduce,
            last_step: Duration::ZERO,
            spin,
        };
        match first_err {
            Some(e) => Err(e),
            None => Ok(runner),
        }
    }

    pub fn n_ranks(&self) -> usize {
        self.devices.len()
    }

    /// The devices, rank order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// KV blocks every rank holds.
    pub fn kv_blocks(&self) -> usize {
        self.kv_blocks
    }

    /// The ranks' devices in words.
    pub fn device_names(&self) -> String {
        format!("tp={} [{}]", self.n_ranks(), self.names.join(", "))
    }

    /// Which all-reduce the group runs: `peer<=1024KB+NCCL` (the one-shot peer kernel up to
    /// that size, NCCL above), `NCCL`, or `none` (one rank, or the CPU's simulation).
    pub fn all_reduce_path(&self) -> &str {
        &self.all_reduce
    }

    /// Runs a step on every rank; returns rank 0's result. A rank's error fails the step
    /// (after every rank has answered, so none is left mid-step).
    pub fn step(&mut self, m: StepMsg) -> Result<StepOut, EngineError> {
        let t = Instant::now();
        let m = Arc::new(m);
        let replies = self.all(|| Cmd::Step(m.clone()));
        self.last_step = t.elapsed();
        match replies?.into_iter().next() {
            Some(Reply::Step(out)) => Ok(out),
            _ => Err(EngineError::BadOptions("rank 0 gave no step".into())),
        }
    }

    /// Drops sequence `id`'s recurrent state on every rank (hybrid models; nothing
    /// otherwise). Not waited for: each rank drops it before its next step.
    pub fn free_state(&mut self, id: SeqId) {
        for w in &self.workers {
            if let Some(tx) = &w.tx {
                let _ = tx.send(Cmd::Free(id));
            }
        }
    }

    /// The slowest rank's time of one all-reduce of `count` floats (the mean of `iters`
    /// back-to-back ones on every rank at once); zero with one rank (nothing to reduce).
    pub fn time_all_reduce(&mut self, count: usize, iters: usize) -> Result<Duration, EngineError> {
        let replies = self.all(|| Cmd::TimeAllReduce { count, iters })?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                Reply::Time(t) => Some(t),
                Reply::Step(_) => None,
            })
            .max()
            .unwrap_or(Duration::ZERO))
    }

    /// Sends a command to every rank and collects every answer (all of them, even after an
    /// error, so no rank is left mid-command).
    fn all(&mut self, cmd: impl Fn() -> Cmd) -> Result<Vec<Reply>, EngineError> {
        for (rank, w) in self.workers.iter().enumerate() {
            w.tx.as_ref()
                .and_then(|tx| tx.send(cmd()).ok())
                .ok_or_else(|| EngineError::BadOptions(format!("rank {rank} is gone")))?;
        }
        let mut out = Vec::with_capacity(self.workers.len());
        let mut err = None;
        for (rank, w) in self.workers.iter().enumerate() {
            match spin_recv(&w.rx, self.spin) {
                Ok(Ok(r)) => out.push(r),
                Ok(Err(e)) => {
                    err.get_or_insert(EngineError::BadOptions(format!("rank {rank}: {e}")));
                }
                Err(_) => {
                    err.get_or_insert(EngineError::BadOptions(format!(
                        "rank {rank}'s thread ended"
                    )));
                }
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

impl Drop for TpRunner {
    fn drop(&mut self) {
        for w in &mut self.workers {
            w.tx.take();
        }
        for w in &mut self.workers {
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}

/// How long a rank thread (or the engine waiting for the ranks) polls its channel before
/// it sleeps. A decode step is 1-3 ms and the engine's turn between steps (sampling,
/// scheduling) tens of microseconds: a thread that slept in between costs a futex wake-up
/// (5-50 us, more from a deep C-state) on each side of every step, and the ranks' graphs
/// start as far apart as their wake-ups (the first all-reduce waits for the last rank).
/// `--tp 1` measured 2.5% slower than one GPU with sleeping threads (2.16 against 2.11 ms
/// a step, bench/RESULTS.md). Idle servers sleep after this long.
const SPIN: Duration = Duration::from_millis(2);

/// `rx.recv()`, polling for `spin` first (GPU ranks: [`SPIN`]; CPU ranks compute on the
/// cores a poller would take, so they wait asleep).
fn spin_recv<T>(rx: &Receiver<T>, spin: Duration) -> Result<T, std::sync::mpsc::RecvError> {
    if spin.is_zero() {
        return rx.recv();
    }
    use std::sync::mpsc::TryRecvError;
    let t0 = Instant::now();
    let mut polls = 0u32;
    loop {
        match rx.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Disconnected) => return Err(std::sync::mpsc::RecvError),
            Err(TryRecvError::Empty) => {}
        }
        polls += 1;
        if polls.is_multiple_of(64) && t0.elapsed() > spin {
            return rx.recv();
        }
        std::hint::spin_loop();
    }
}

/// Parses `--device` lists for tensor parallelism: `cuda:0,1,3` (or `cuda:0,cuda:1`), `cpu`;
/// with `tp` ranks and a single device `cuda`/`cuda:N`, ranks take `N, N+1, ...`.
pub fn tp_devices(spec: &str, tp: usize) -> Result<Vec<Device>, EngineError> {
    let spec = spec.trim();
    let tp = tp.max(1);
    if spec.eq_ignore_ascii_case("cpu") {
        return Ok(vec![Device::Cpu; tp]);
    }
    let Some(rest) = spec.strip_prefix("cuda") else {
        return Err(EngineError::BadOptions(format!(
            "--device {spec}: tensor parallelism needs cuda:N[,M...] or cpu"
        )));
    };
    let list = rest.strip_prefix(':').unwrap_or(rest);
    let ords: Vec<usize> = if list.is_empty() {
        Vec::new()
    } else {
        list.split(',')
            .map(|p| {
                let p = p.trim();
                let p = p.strip_prefix("cuda:").unwrap_or(p);
                p.parse::<usize>().map_err(|_| {
                    EngineError::BadOptions(format!("--device {spec}: bad ordinal {p:?}"))
                })
            })
            .collect::<Result<_, _>>()?
    };
    let devices: Vec<usize> = match ords.len() {
        0 => (0..tp).collect(),
        1 => (ords[0]..ords[0] + tp).collect(),
        k if k == tp || tp == 1 => ords,
        k => {
            return Err(EngineError::BadOptions(format!(
                "--device lists {k} GPUs but --tp is {tp}"
            )))
        }
    };
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = devices.iter().find(|d| !seen.insert(**d)) {
        return Err(EngineError::BadOptions(format!(
            "--device lists cuda:{d} twice"
        )));
    }
    Ok(devices.into_iter().map(Device::Cuda).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists() {
        let c = |v: &[usize]| v.iter().map(|&o| Device::Cuda(o)).collect::<Vec<_>>();
        assert_eq!(tp_devices("cuda", 2).unwrap(), c(&[0, 1]));
        assert_eq!(tp_devices("cuda:2", 2).unwrap(), c(&[2, 3]));
        assert_eq!(tp_devices("cuda:0,1", 1).unwrap(), c(&[0, 1]));
        assert_eq!(tp_devices("cuda:3,1", 2).unwrap(), c(&[3, 1]));
        assert_eq!(tp_devices("cuda:0,cuda:1", 2).unwrap(), c(&[0, 1]));
        assert_eq!(tp_devices("cpu", 3).unwrap(), vec![Device::Cpu; 3]);
        assert!(tp_devices("cuda:0,1,2", 2).is_err());
        assert!(tp_devices("cuda:1,1", 2).is_err());
        assert!(tp_devices("metal", 2).is_err());
    }
}
