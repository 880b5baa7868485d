//! Tensor-parallel correctness on the GPU machine (bench/gpu/tp.sh): the same prompt's
//! greedy generation on one GPU (the reference), through the sharded path on one GPU
//! (`--tp 1`), on N GPUs (`--tp N`), and optionally on the CPU (whole model) and CPU
//! simulated ranks; for each: whether the tokens equal the reference's, the first
//! divergence and the reference's logit gap there, and the largest logit difference at the
//! prompt's end against the CPU's (relative to the logits' scale).
//!
//! Usage: tp_check MODEL [--gpus 0,1] [--ranks 2,4] [--steps 32] [--prompt 40] [--cpu]
//! (`--ranks`: the group sizes run, each on the first GPUs of `--gpus`; default every size
//! from 2 to the number of GPUs). Any model smelt runs, the hybrids included (their
//! delta-net heads and recurrent state split over the ranks; a prompt of 256 tokens or more
//! takes the chunked delta-net kernels).
//! Prints one `TPCHECK` line per configuration (machine-readable) and a table last; exits 1
//! when a run diverges where the reference's lead was clear, or a configuration asked for
//! fails to load.
//!
//! `tp_check --nccl-probe [--gpus 0,1]`: where NCCL was loaded from and its version, then
//! an all-reduce over the GPUs (one thread each) of 8 KB, 64 KB and 1 MB of f32 checked
//! against the exact sum, and each size's latency (back to back, the slowest rank); then
//! the one-shot peer all-reduce (`smelt_cuda::peer`) against its CPU twin and NCCL at
//! 8 KB .. 4 MB and a ragged size (bit-exact sums, 40 in-place calls back to back, sizes
//! alternating between calls), and its latency beside NCCL's, launched one by one and
//! replayed from a CUDA graph (`ARPROBE` lines); then the kernel that fuses the all-reduce
//! with the residual add, RMS norm and q8_1 quantize (`smelt_kernels::allreduce_norm`)
//! against its CPU twin (every output bit-exact, 1 to 32 rows, 40 calls alternating with
//! the plain kernel) and its time beside the unfused pair it replaces (plain peer
//! all-reduce, then `add_rms_norm_q8_1`), in a graph (`ARNORM` lines).

use std::sync::Arc;

use smelt_engine::{Device, Engine, EngineOptions, Logits, SeqInput};
use smelt_gguf::Gguf;

struct Run {
    name: String,
    tokens: Vec<u32>,
    /// Logits at the prompt's end, then after each generated token.
    logits: Vec<Vec<f32>>,
    ms_per_token: f64,
}

fn generate(e: &mut Engine, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>, f64) {
    let s = e.new_sequence();
    let mut out = e
        .forward(&[SeqInput {
            seq: s,
            tokens: prompt.to_vec(),
            logits: Logits::Last,
        }])
        .expect("prompt");
    let mut logits = vec![out[0][0].clone()];
    let mut tokens = Vec::new();
    let t = std::time::Instant::now();
    for _ in 0..steps {
        let tok = smelt_engine::argmax(&out[0][0]);
        tokens.push(tok);
        out = e
            .forward(&[SeqInput {
                seq: s,
                tokens: vec![tok],
                logits: Logits::Last,
            }])
            .expect("decode");
        logits.push(out[0][0].clone());
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64;
    e.free_sequence(s);
    (tokens, logits, ms)
}

/// NCCL loads, its communicators initialise, and all-reduces give the right sums.
fn nccl_probe(gpus: &[usize]) {
    let n = smelt_cuda::nccl::nccl().unwrap_or_else(|e| {
        println!("NCCLPROBE FAIL load: {e}");
        std::process::exit(1)
    });
    println!(
        "NCCLPROBE loaded {} (NCCL {}), NCCL_NVLS_ENABLE={}",
        n.path.display(),
        n.version_string(),
        std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default()
    );
    let comms = smelt_cuda::nccl::Comm::init_all(gpus).unwrap_or_else(|e| {
        println!("NCCLPROBE FAIL init: {e}");
        std::process::exit(1)
    });
    let nr = gpus.len();
    let results: Vec<Vec<(usize, bool, f64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(gpus)
            .map(|(c, &o)| {
                s.spawn(move || {
                    let gpu = smelt_cuda::Gpu::open(o).expect("open gpu");
                    let stream = gpu.stream().cu_stream();
                    let mut out = Vec::new();
                    for floats in [2048usize, 16384, 262144] {
                        let host = vec![(c.rank + 1) as f32; floats];
                        let buf = gpu.upload(&host).expect("upload");
                        let ptr = gpu.ptr(&buf);
                        // SAFETY: buf holds `floats` f32 on this device.
                        unsafe { c.all_reduce_f32(ptr, floats, stream) }.expect("all-reduce");
                        let got = gpu.download(&buf).expect("download");
                        let want = (nr * (nr + 1) / 2) as f32;
                        let ok = got.iter().all(|&v| v == want);
                        let iters = 200;
                        gpu.synchronize().expect("sync");
                        let t = std::time::Instant::now();
                        for _ in 0..iters {
                            // SAFETY: as above.
                            unsafe { c.all_reduce_f32(ptr, floats, stream) }.expect("all-reduce");
                        }
                        gpu.synchronize().expect("sync");
                        let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
                        out.push((floats * 4, ok, us));
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let mut all_ok = true;
    for i in 0..results[0].len() {
        let bytes = results[0][i].0;
        let ok = results.iter().all(|r| r[i].1);
        all_ok &= ok;
        let us = results.iter().map(|r| r[i].2).fold(0f64, f64::max);
        println!(
            "NCCLPROBE all-reduce {} KB over {nr} GPUs: sum {} , {us:.1} us each (back to back)",
            bytes / 1024,
            if ok { "exact" } else { "WRONG" }
        );
    }
    if !all_ok {
        std::process::exit(1);
    }
    if !peer_probe(gpus, &comms) {
        std::process::exit(1);
    }
    if !norm_probe(gpus, &comms) {
        std::process::exit(1);
    }
}

/// Launches kernel `name` of `gpu`'s module with typed arguments `a`.
fn launch_named(
    gpu: &smelt_cuda::Gpu,
    name: &str,
    l: smelt_kernels::ops::Launch,
    a: Vec<smelt_kernels::ops::ArgValue>,
) {
    let f = gpu.function(name).expect("kernel");
    let mut params: Vec<smelt_cuda::KernelParam> =
        a.into_iter().map(smelt_cuda::KernelParam::from).collect();
    if gpu.timeline() {
        params.push(smelt_cuda::KernelParam::P(0));
    }
    let cfg = smelt_cuda::cudarc::driver::LaunchConfig {
        grid_dim: l.grid,
        block_dim: l.block,
        shared_mem_bytes: l.shared_bytes,
    };
    // SAFETY: the arguments are the kernel's typed ones; the callers' buffers hold them.
    unsafe { gpu.launch(&f, cfg, &params) }.expect("launch");
}

/// One shape's fused-kernel results on one rank.
struct NormResult {
    rows: usize,
    n: usize,
    exact: bool,
    repeated: bool,
    fused_us: f64,
    unfused_us: f64,
}

/// The fused all-reduce + add + norm + q8_1 kernel on every GPU of `gpus` against its CPU
/// twin (y, x, out and q all bit-exact), then 40 calls alternating with the plain kernel,
/// and its time in a graph beside the plain peer all-reduce followed by
/// `add_rms_norm_q8_1`; false when anything differs.
fn norm_probe(gpus: &[usize], comms: &[smelt_cuda::nccl::Comm]) -> bool {
    use smelt_kernels::allreduce_norm as arn;
    let nr = gpus.len();
    let shapes = [
        (1usize, 4096usize),
        (1, 5120),
        (4, 4096),
        (32, 4096),
        (1, 2048),
    ];
    let cap = 32 * 4096;
    let eps = 1e-5f32;
    let rv = smelt_cuda::peer::Rendezvous::new(nr);
    let results: Vec<Result<Vec<NormResult>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(gpus)
            .map(|(c, &o)| {
                let rv = rv.clone();
                s.spawn(move || -> Result<Vec<NormResult>, String> {
                    let gpu = smelt_cuda::Gpu::open(o).map_err(|e| e.to_string())?;
                    let p =
                        smelt_cuda::peer::PeerReduce::start(Some(&gpu), c.rank, gpus, cap, &rv)?;
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let mut out = Vec::new();
                    for (si, &(rows, n)) in shapes.iter().enumerate() {
                        let len = rows * n;
                        let partials: Vec<Vec<f32>> =
                            (0..nr).map(|r| probe_input(r, len, si)).collect();
                        let refs: Vec<&[f32]> = partials.iter().map(Vec::as_slice).collect();
                        let x0: Vec<f32> = probe_input(nr + 7, len, si)
                            .iter()
                            .map(|v| v * 3.0)
                            .collect();
                        let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 13) as f32 / 8.0).collect();
                        let mut xw = x0.clone();
                        let arn::TwinOut {
                            y: ys,
                            out: outs,
                            q: qs,
                        } = arn::twin(&refs, &mut xw, &w, eps).map_err(|e| e.to_string())?;
                        let qbytes = smelt_kernels::act::row_bytes(n).expect("tiles") * rows;
                        let yb = gpu.upload(&partials[c.rank]).expect("upload");
                        let xb = gpu.upload(&x0).expect("upload");
                        let wb = gpu.upload(&w).expect("upload");
                        // Poisoned outputs: a value never written shows.
                        let ob = gpu.upload(&vec![f32::NAN; len]).expect("upload");
                        let qb = gpu.upload(&vec![0xA5u8; qbytes]).expect("upload");
                        let (py, px, pw, po, pq) = (
                            gpu.ptr(&yb),
                            gpu.ptr(&xb),
                            gpu.ptr(&wb),
                            gpu.ptr(&ob),
                            gpu.ptr(&qb),
                        );
                        // SAFETY: every buffer holds what `norm_args` says; every rank makes
                        // the same calls.
                        unsafe { p.all_reduce_add_norm(py, px, pw, po, pq, rows, n, eps) }
                            .map_err(|e| e.to_string())?;
                        let exact = bits(&gpu.download(&yb).expect("download")) == bits(&ys)
                            && bits(&gpu.download(&xb).expect("download")) == bits(&xw)
                            && bits(&gpu.download(&ob).expect("download")) == bits(&outs)
                            && gpu.download(&qb).expect("download") == qs;
                        // 40 more calls, each followed by a plain all-reduce of another
                        // buffer: the two kernels share the staging and the counters.
                        let zb = gpu.upload(&probe_input(c.rank, 4096, 77)).expect("upload");
                        let mut zs: Vec<Vec<f32>> =
                            (0..nr).map(|r| probe_input(r, 4096, 77)).collect();
                        let mut ycur = ys.clone();
                        let mut xcur = xw.clone();
                        let (mut ocur, mut qcur) = (outs.clone(), qs.clone());
                        for _ in 0..40 {
                            // SAFETY: as above.
                            unsafe { p.all_reduce_add_norm(py, px, pw, po, pq, rows, n, eps) }
                                .map_err(|e| e.to_string())?;
                            unsafe { p.all_reduce(gpu.ptr(&zb), 4096) }
                                .map_err(|e| e.to_string())?;
                            // Every rank's y now holds the same sum: the next call adds it
                            // over the ranks again.
                            let same: Vec<&[f32]> = (0..nr).map(|_| ycur.as_slice()).collect();
                            let t =
                                arn::twin(&same, &mut xcur, &w, eps).map_err(|e| e.to_string())?;
                            (ycur, ocur, qcur) = (t.y, t.out, t.q);
                            let r: Vec<&[f32]> = zs.iter().map(Vec::as_slice).collect();
                            let z = smelt_kernels::allreduce::twin(&r);
                            zs = vec![z; nr];
                        }
                        let repeated = bits(&gpu.download(&yb).expect("download")) == bits(&ycur)
                            && bits(&gpu.download(&xb).expect("download")) == bits(&xcur)
                            && bits(&gpu.download(&ob).expect("download")) == bits(&ocur)
                            && gpu.download(&qb).expect("download") == qcur
                            && bits(&gpu.download(&zb).expect("download")) == bits(&zs[0]);
                        // Timing on zeros (sums stay finite call after call).
                        let zy = gpu.zeros::<f32>(len).expect("zeros");
                        let zx = gpu.zeros::<f32>(len).expect("zeros");
                        let (pzy, pzx) = (gpu.ptr(&zy), gpu.ptr(&zx));
                        let fused = || {
                            // SAFETY: as above.
                            unsafe { p.all_reduce_add_norm(pzy, pzx, pw, po, pq, rows, n, eps) }
                                .expect("fused")
                        };
                        let unfused = || {
                            // SAFETY: as above.
                            unsafe { p.all_reduce(pzy, len) }.expect("peer");
                            launch_named(
                                &gpu,
                                smelt_kernels::fused::ADD_RMS_NORM_Q8,
                                smelt_kernels::fused::launch(rows, n),
                                smelt_kernels::fused::AddNormQ8Args {
                                    x: pzx,
                                    y: pzy,
                                    w: pw,
                                    out: po,
                                    q: pq,
                                    n: n as u32,
                                    ntiles: n.div_ceil(smelt_kernels::TILE) as u32,
                                    eps,
                                }
                                .values(),
                            );
                        };
                        let fused_us = per_call_graph(&gpu, &fused);
                        let unfused_us = per_call_graph(&gpu, &unfused);
                        out.push(NormResult {
                            rows,
                            n,
                            exact,
                            repeated,
                            fused_us,
                            unfused_us,
                        });
                    }
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let Some(per_rank) = ranks_ok(results, "ARNORM") else {
        return false;
    };
    let mut ok = true;
    for i in 0..per_rank[0].len() {
        let all = |f: &dyn Fn(&NormResult) -> bool| per_rank.iter().all(|r| f(&r[i]));
        let slow =
            |f: &dyn Fn(&NormResult) -> f64| per_rank.iter().map(|r| f(&r[i])).fold(0f64, f64::max);
        let (exact, repeated) = (all(&|r| r.exact), all(&|r| r.repeated));
        ok &= exact && repeated;
        let r0 = &per_rank[0][i];
        println!(
            "ARNORM {nr} GPUs {} x {}: y/x/out/q vs twin {} , 40 calls with the plain kernel between {} | graph: fused {:.1} us, peer all-reduce + add_rms_norm_q8_1 {:.1} us",
            r0.rows,
            r0.n,
            if exact { "exact" } else { "WRONG" },
            if repeated { "exact" } else { "WRONG" },
            slow(&|r| r.fused_us),
            slow(&|r| r.unfused_us),
        );
    }
    ok
}

/// Rank `r`'s input of `n` floats (fractions, so the order of the adds shows in the bits).
fn probe_input(r: usize, n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + r * 104_729 + seed * 31) % 2001) as f32) / 1000.0 - 1.0)
        .collect()
}

/// Microseconds per call of `f` (`iters` back to back after 20 to warm up), on one rank.
fn per_call(gpu: &smelt_cuda::Gpu, iters: usize, f: &dyn Fn()) -> f64 {
    for _ in 0..20 {
        f();
    }
    gpu.synchronize().expect("sync");
    let t = std::time::Instant::now();
    for _ in 0..iters {
        f();
    }
    gpu.synchronize().expect("sync");
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// Microseconds per call of `f` captured 100 times into a graph and replayed 5 times.
fn per_call_graph(gpu: &smelt_cuda::Gpu, f: &dyn Fn()) -> f64 {
    let g = gpu
        .capture(|| {
            for _ in 0..100 {
                f();
            }
            Ok(())
        })
        .expect("capture");
    g.launch().expect("replay");
    gpu.synchronize().expect("sync");
    let t = std::time::Instant::now();
    for _ in 0..5 {
        g.launch().expect("replay");
    }
    gpu.synchronize().expect("sync");
    t.elapsed().as_secs_f64() * 1e6 / 500.0
}

/// One size's results on one rank.
struct PeerResult {
    bytes: usize,
    exact: bool,
    nccl_same: bool,
    repeated: bool,
    custom_us: f64,
    nccl_us: f64,
    custom_graph_us: f64,
    nccl_graph_us: f64,
}

/// The peer all-reduce against the twin and NCCL on every GPU of `gpus` (one thread each);
/// false when a sum is wrong.
fn peer_probe(gpus: &[usize], comms: &[smelt_cuda::nccl::Comm]) -> bool {
    use smelt_kernels::allreduce::twin;
    let nr = gpus.len();
    let sizes = [2048usize, 4096, 4100, 16384, 65536, 262_144, 1 << 20];
    let cap = *sizes.iter().max().unwrap_or(&0);
    let rv = smelt_cuda::peer::Rendezvous::new(nr);
    let results: Vec<Result<Vec<PeerResult>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(gpus)
            .map(|(c, &o)| {
                let rv = rv.clone();
                s.spawn(move || -> Result<Vec<PeerResult>, String> {
                    let gpu = smelt_cuda::Gpu::open(o).map_err(|e| e.to_string())?;
                    let p =
                        smelt_cuda::peer::PeerReduce::start(Some(&gpu), c.rank, gpus, cap, &rv)?;
                    let stream = gpu.stream().cu_stream();
                    let mut out = Vec::new();
                    for (si, &n) in sizes.iter().enumerate() {
                        let inputs: Vec<Vec<f32>> =
                            (0..nr).map(|r| probe_input(r, n, si)).collect();
                        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
                        let want = twin(&refs);
                        let a = gpu.upload(&inputs[c.rank]).expect("upload");
                        let b = gpu.upload(&inputs[c.rank]).expect("upload");
                        let (pa, pb) = (gpu.ptr(&a), gpu.ptr(&b));
                        // SAFETY: both buffers hold `n` floats on this device; every rank
                        // makes the same calls.
                        unsafe { p.all_reduce(pa, n) }.map_err(|e| e.to_string())?;
                        unsafe { c.all_reduce_f32(pb, n, stream) }.map_err(|e| e.to_string())?;
                        let got = gpu.download(&a).expect("download");
                        let nccl = gpu.download(&b).expect("download");
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        let exact = bits(&got) == bits(&want);
                        let nccl_same = bits(&nccl) == bits(&got);
                        // 40 calls back to back, in place, alternating with a call on a
                        // second buffer of another size: a stale or early read shows.
                        let other_n = if n == 4096 { 1 << 18 } else { 4096 };
                        let mut x = inputs[c.rank].clone();
                        let mut y = probe_input(c.rank, other_n, 99);
                        let ya: Vec<Vec<f32>> =
                            (0..nr).map(|r| probe_input(r, other_n, 99)).collect();
                        let xb = gpu.upload(&x).expect("upload");
                        let yb = gpu.upload(&y).expect("upload");
                        let mut xs: Vec<Vec<f32>> = inputs.clone();
                        let mut ys = ya;
                        for _ in 0..40 {
                            // SAFETY: as above.
                            unsafe { p.all_reduce(gpu.ptr(&xb), n) }.map_err(|e| e.to_string())?;
                            unsafe { p.all_reduce(gpu.ptr(&yb), other_n) }
                                .map_err(|e| e.to_string())?;
                            let r: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
                            x = twin(&r);
                            xs = vec![x.clone(); nr];
                            let r: Vec<&[f32]> = ys.iter().map(Vec::as_slice).collect();
                            y = twin(&r);
                            ys = vec![y.clone(); nr];
                        }
                        let repeated = bits(&gpu.download(&xb).expect("download")) == bits(&x)
                            && bits(&gpu.download(&yb).expect("download")) == bits(&y);
                        let z = gpu.zeros::<f32>(n).expect("zeros");
                        let pz = gpu.ptr(&z);
                        // SAFETY: `z` holds `n` floats; every rank times the same calls.
                        let custom = || unsafe { p.all_reduce(pz, n) }.expect("peer all-reduce");
                        let viancc = || unsafe { c.all_reduce_f32(pz, n, stream) }.expect("NCCL");
                        let custom_us = per_call(&gpu, 200, &custom);
                        let nccl_us = per_call(&gpu, 200, &viancc);
                        let custom_graph_us = per_call_graph(&gpu, &custom);
                        let nccl_graph_us = per_call_graph(&gpu, &viancc);
                        out.push(PeerResult {
                            bytes: n * 4,
                            exact,
                            nccl_same,
                            repeated,
                            custom_us,
                            nccl_us,
                            custom_graph_us,
                            nccl_graph_us,
                        });
                    }
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let Some(per_rank) = ranks_ok(results, "ARPROBE") else {
        return false;
    };
    println!(
        "ARPROBE peer group of {nr} GPUs started (staging for {} KB)",
        cap * 4 / 1024
    );
    let mut ok = true;
    for i in 0..per_rank[0].len() {
        let all = |f: &dyn Fn(&PeerResult) -> bool| per_rank.iter().all(|r| f(&r[i]));
        let slow =
            |f: &dyn Fn(&PeerResult) -> f64| per_rank.iter().map(|r| f(&r[i])).fold(0f64, f64::max);
        let (exact, repeated) = (all(&|r| r.exact), all(&|r| r.repeated));
        ok &= exact && repeated;
        let b = per_rank[0][i].bytes;
        let size = if b % 1024 == 0 {
            format!("{} KB", b / 1024)
        } else {
            format!("{b} B")
        };
        println!(
            "ARPROBE {size}: sum vs twin {} , 40 calls {} , same bits as NCCL {} | eager: peer {:.1} us, NCCL {:.1} us | graph: peer {:.1} us, NCCL {:.1} us",
            if exact { "exact" } else { "WRONG" },
            if repeated { "exact" } else { "WRONG" },
            if all(&|r| r.nccl_same) { "yes" } else { "no" },
            slow(&|r| r.custom_us),
            slow(&|r| r.nccl_us),
            slow(&|r| r.custom_graph_us),
            slow(&|r| r.nccl_graph_us),
        );
    }
    ok
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--nccl-probe") {
        let gpus: Vec<usize> = match args.get(2).map(String::as_str) {
            Some("--gpus") => args[3]
                .split(',')
                .map(|s| s.parse().expect("ordinal"))
                .collect(),
            _ => vec![0, 1],
        };
        nccl_probe(&gpus);
        return;
    }
    let path = args
        .get(1)
        .expect("usage: tp_check MODEL [--gpus 0,1] [--steps N] [--prompt N] [--cpu]");
    let mut gpus = vec![0usize, 1];
    let mut steps = 32;
    let mut plen = 40;
    let mut cpu = false;
    let mut ranks: Option<Vec<usize>> = None;
    let mut i = 2;
    while i < args.len() {
        match args[i].as_str() {
            "--gpus" => {
                gpus = args[i + 1]
                    .split(',')
                    .map(|s| s.parse().expect("gpu ordinal"))
                    .collect();
                i += 1;
            }
            "--ranks" => {
                ranks = Some(
                    args[i + 1]
                        .split(',')
                        .map(|s| s.parse().expect("group size"))
                        .collect(),
                );
                i += 1;
            }
            "--steps" => {
                steps = args[i + 1].parse().expect("steps");
                i += 1;
            }
            "--prompt" => {
                plen = args[i + 1].parse().expect("prompt");
                i += 1;
            }
            "--cpu" => cpu = true,
            other => panic!("unknown argument {other}"),
        }
        i += 1;
    }
    let gguf = Arc::new(Gguf::open(path).expect("open model"));
    let opts = |device| EngineOptions {
        kv_tokens: plen + steps + 16,
        device,
        ..EngineOptions::default()
    };
    let n_vocab = smelt_engine::ModelInfo::from_gguf(&gguf)
        .expect("info")
        .n_vocab;
    let prompt: Vec<u32> = (0..plen)
        .map(|i| ((i as u64 * 7919 + 13) % n_vocab as u64) as u32)
        .collect();
    let mut runs = Vec::new();
    let mut load_failed = false;
    let mut go = |name: String, e: Result<Engine, smelt_engine::EngineError>| match e {
        Ok(mut e) => {
            let (tokens, logits, ms) = generate(&mut e, &prompt, steps);
            eprintln!("{name}: {} ({ms:.2} ms/token)", e.device_name());
            runs.push(Run {
                name,
                tokens,
                logits,
                ms_per_token: ms,
            });
        }
        Err(err) => {
            println!("TPCHECK {name} FAILED to load: {err}");
            load_failed = true;
        }
    };
    let g0 = Device::Cuda(gpus[0]);
    go(
        format!("cuda:{}", gpus[0]),
        Engine::from_gguf(gguf.clone(), &opts(g0)),
    );
    go(
        "tp1".into(),
        Engine::from_gguf_tp(gguf.clone(), &opts(g0), &[g0]),
    );
    let sizes = ranks.unwrap_or_else(|| (2..=gpus.len()).collect());
    for n in sizes.into_iter().filter(|&n| n >= 2 && n <= gpus.len()) {
        let devs: Vec<Device> = gpus[..n].iter().map(|&o| Device::Cuda(o)).collect();
        go(
            format!("tp{n}"),
            Engine::from_gguf_tp(gguf.clone(), &opts(g0), &devs),
        );
    }
    if cpu {
        go(
            "cpu".into(),
            Engine::from_gguf(gguf.clone(), &opts(Device::Cpu)),
        );
        for n in [2, 4] {
            go(
                format!("cpu-tp{n}"),
                Engine::from_gguf_tp(gguf.clone(), &opts(Device::Cpu), &vec![Device::Cpu; n]),
            );
        }
    }
    if runs.is_empty() {
        println!("TPCHECK nothing ran");
        std::process::exit(1);
    }
    let mut failed = load_failed;
    let reference = &runs[0];
    let cpu_run = runs.iter().find(|r| r.name == "cpu");
    let mut table = vec![
        "| run | tokens = ref | first divergence | ref logit gap there | max |dlogit| vs cpu (prompt end, of scale) | ms/token |".to_string(),
        "|---|---|---|---|---|---|".to_string(),
    ];
    for r in &runs {
        let div = reference
            .tokens
            .iter()
            .zip(&r.tokens)
            .position(|(a, b)| a != b);
        let gap = div.map(|d| {
            let l = &reference.logits[d];
            l[reference.tokens[d] as usize] - l[r.tokens[d] as usize]
        });
        let vs_cpu = cpu_run.map(|c| {
            let a = &c.logits[0];
            let b = &r.logits[0];
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
                / scale
        });
        let same = div.is_none();
        // A divergence is a failure unless the reference's top two were within 1% of the scale.
        if let Some(g) = gap {
            let l = &reference.logits[div.unwrap_or(0)];
            let scale = l.iter().fold(0f32, |m, x| m.max(x.abs()));
            if g.abs() > 0.01 * scale {
                failed = true;
            }
        }
        println!(
            "TPCHECK {} same={} divergence={} gap={} vs_cpu={} ms_per_token={:.3}",
            r.name,
            same,
            div.map_or("none".into(), |d| d.to_string()),
            gap.map_or("-".into(), |g| format!("{g:.4}")),
            vs_cpu.map_or("-".into(), |v| format!("{v:.2e}")),
            r.ms_per_token
        );
        table.push(format!(
            "| {} | {} | {} | {} | {} | {:.2} |",
            r.name,
            if same { "yes" } else { "no" },
            div.map_or("none".into(), |d| format!("step {d}")),
            gap.map_or("-".into(), |g| format!("{g:.4}")),
            vs_cpu.map_or("-".into(), |v| format!("{v:.2e}")),
            r.ms_per_token
        ));
    }
    println!("{}", table.join("\n"));
    if failed {
        println!(
            "TPCHECK FAIL: a run diverged where the reference's lead was clear, or failed to load"
        );
        std::process::exit(1);
    }
}

/// Every rank's results, or `None` after printing `TAG FAIL rank r: why` for the first rank
/// that failed (the probes' rank threads each return their rows or an error).
fn ranks_ok<T>(results: Vec<Result<T, String>>, tag: &str) -> Option<Vec<T>> {
    let mut per_rank = Vec::with_capacity(results.len());
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(v) => per_rank.push(v),
            Err(why) => {
                println!("{tag} FAIL rank {r}: {why}");
                return None;
            }
        }
    }
    Some(per_rank)
}
