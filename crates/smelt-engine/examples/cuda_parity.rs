//! Whole-model parity of the CUDA backend against the CPU backend, run on the GPU machine
//! by `bench/gpu/parity.sh` (the full real models) and `bench/gpu/decode.sh` (cut-down ones).
//!
//! `cuda_parity shrink IN OUT --layers N --vocab V [--window W]` (here): a smaller copy of a
//! real model, for the GPU run's size limit: the first N layers and the first V rows of the
//! embedding table, every kept tensor byte-for-byte as in IN (`--window` sets Gemma 3's
//! sliding window, so a short test crosses it). The vocabulary lists are left out.
//! `--zero a,b` stores every tensor whose name contains `a` or `b` as zeros (same type and
//! shape): `--zero attn_output` leaves a layer's feed-forward path alone, `--zero ffn_down`
//! its attention, to see which path a difference comes from.
//!
//! `cuda_parity dequant IN OUT`: IN with every tensor stored as F32 (the quantized values,
//! unpacked). On the CPU backend such a file is the *reference*: the same weights, but no
//! 8-bit requantization of the activations before each matmul (ggml pairs F32 weights with
//! F32 activations).
//!
//! `cuda_parity check MODEL... [--no-ref] [--sweep 1,4,8]` (there): for each model, on the
//! CPU backend, the CUDA backend and (unless `--no-ref`) the F32 reference,
//! 1. a 40-token prompt of spread-out token ids, every row's logits;
//! 2. a 40-odd-token English prompt (the model's own tokenizer; the spread ids when the file
//!    has no vocabulary), every row, then 32 greedy decode steps fed the CPU's choice, so the
//!    three stay on one context and every step is compared;
//! 3. the same prompt decoded greedily by the CUDA backend on its own choices: its 32 tokens
//!    must equal the CPU's;
//! 4. three sequences at different positions (5, 23, 50) decoded together for 16 steps, one
//!    batch per step (descriptors, block tables and the batch's graph).
//!
//! `--sweep` repeats test 1 on the first N layers of each model (full vocabulary), to see
//! where along the depth a difference starts.
//!
//! Why these bars. The two backends requantize activations differently (CPU: ggml-cpu's
//! pairing, Q8_K for K-quant weights, Q8_1 for Q4_1/Q5_1, Q8_0 for Q4_0/Q5_0/Q8_0; CUDA:
//! ggml-cuda's MMVQ, q8_1 for every type), so their logits differ by rounding noise that
//! grows with depth. The reference measures that noise: the CPU's own distance from it is
//! the size of an 8-bit requantization scheme's error on this model and these tokens. A
//! test passes when
//! * the CUDA logits are no further from the reference than twice the CPU's distance, both
//!   in the largest |difference| and in relative RMS (a wrong kernel is far outside: the
//!   post-norm bug found by the first run gave top-1 0/40), and
//! * every top-1 disagreement with the CPU is a float tie: the CPU's top-2 gap is at most
//!   8 sigma, sigma the RMS of that row's cuda - cpu difference over the whole vocabulary.
//!   Sigma is the bulk noise, not the two logits in question, so a localized error that
//!   moves the winner past a clear gap fails (a bar of twice the row's *largest* difference
//!   could never fail: any flip implies the gap is below it).
//!
//! Without the reference (`--no-ref`) the noise bar is relative RMS(cuda - cpu) <= 0.25.
//! `PARITY_DEVICE=cpu` runs the "CUDA" side on the CPU (a self-test of this harness: every
//! difference must be 0); `PARITY_FAULT=blk.29.ffn_down,...` zeroes those tensors on that
//! side only (a simulated kernel bug: the bars must fail). Exit status 1 when a model fails.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use smelt_engine::{argmax, Device, Engine, EngineOptions, Logits, SeqId, SeqInput};
use smelt_gguf::{GgmlType, Gguf, GgufWriter, TensorSpec, Value};
use smelt_tokenizer::Tokenizer;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A top-1 disagreement is a tie when the CPU's top-2 gap is at most this many times the
/// RMS of the row's cuda - cpu difference (the noise of a difference of two logits is about
/// 1.4 sigma, so 8 sigma is 5.7 standard deviations).
const TIE_SIGMAS: f32 = 8.0;
/// CUDA's distance from the reference may be at most this many times the CPU's.
const NOISE_FACTOR: f64 = 2.0;
/// Relative RMS(cuda - cpu) bar when no reference runs.
const NO_REF_REL_RMS: f64 = 0.25;

const ENGLISH: &str = "The old lighthouse keeper climbed the spiral stairs every evening to \
light the great lamp. One stormy night in late November, he noticed a small fishing boat \
struggling against the waves near the northern rocks, so he";

fn arg_after(args: &[String], flag: &str) -> Option<usize> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn shrink(
    input: &Path,
    output: &Path,
    layers: usize,
    vocab: usize,
    window: Option<usize>,
    zero: &[String],
) -> Res<()> {
    let g = Gguf::open(input)?;
    let arch = g
        .metadata()
        .architecture()
        .ok_or("no general.architecture")?
        .to_string();
    let mut md = g.metadata().clone();
    md.insert(format!("{arch}.block_count"), Value::U32(layers as u32));
    md.insert(format!("{arch}.vocab_size"), Value::U32(vocab as u32));
    // The vocabulary lists (megabytes; the parity run feeds token ids, not text).
    let vocab_keys: Vec<String> = md
        .iter()
        .map(|(k, _)| k.to_string())
        .filter(|k| k.starts_with("tokenizer.ggml.") && k != "tokenizer.ggml.model")
        .collect();
    for k in vocab_keys {
        md.remove(&k);
    }
    if let Some(w) = window {
        md.insert(
            format!("{arch}.attention.sliding_window"),
            Value::U32(w as u32),
        );
    }
    let keep = |name: &str| -> bool {
        match name.strip_prefix("blk.") {
            Some(rest) => rest
                .split('.')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n < layers),
            None => true,
        }
    };
    let mut specs = Vec::new();
    let mut datas: Vec<&[u8]> = Vec::new();
    let zeros = vec![
        0u8;
        g.tensors()
            .iter()
            .map(|t| t.n_bytes() as usize)
            .max()
            .unwrap_or(0)
    ];
    for t in g.tensors().iter().filter(|t| keep(&t.name)) {
        let mut shape = t.shape.clone();
        let mut data = g.tensor_data(t);
        if t.name == "token_embd.weight" || t.name == "output.weight" {
            let rows = (vocab as u64).min(shape[1]);
            let row_bytes = data.len() / shape[1] as usize;
            shape[1] = rows;
            data = &data[..rows as usize * row_bytes];
        }
        if zero.iter().any(|z| t.name.contains(z.as_str())) {
            data = &zeros[..data.len()];
        }
        specs.push(TensorSpec {
            name: t.name.clone(),
            ty: t.ty,
            shape,
        });
        datas.push(data);
    }
    let mut w = GgufWriter::create(output, &md, specs.clone())?;
    for (s, d) in specs.iter().zip(datas) {
        w.write_tensor(&s.name, d)?;
    }
    w.finish()?;
    println!(
        "wrote {} ({layers} layers, vocab {vocab})",
        output.display()
    );
    Ok(())
}

/// Writes `input` with every tensor unpacked to F32 (the reference's weights).
fn dequant(input: &Path, output: &Path) -> Res<()> {
    let g = Gguf::open(input)?;
    let specs: Vec<TensorSpec> = g
        .tensors()
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            ty: GgmlType::F32,
            shape: t.shape.clone(),
        })
        .collect();
    let mut w = GgufWriter::create(output, g.metadata(), specs)?;
    for t in g.tensors() {
        let data = g.tensor_data(t);
        if t.ty == GgmlType::F32 {
            w.write_tensor(&t.name, data)?;
            continue;
        }
        let (n, rows) = (t.row_len() as usize, t.n_rows() as usize);
        let row_bytes = data.len() / rows.max(1);
        let mut out = vec![0f32; n * rows];
        out.par_chunks_mut(n.max(1))
            .zip(data.par_chunks(row_bytes.max(1)))
            .try_for_each(|(o, s)| smelt_quant::dequantize_row(t.ty, s, o))?;
        w.write_tensor(&t.name, bytemuck::cast_slice(&out))?;
    }
    w.finish()?;
    Ok(())
}

/// Distance of rows `a` from rows `b`: largest |a - b|, sum of (a - b)^2 and of
/// (b - mean b)^2 (relative RMS = sqrt of their ratio, pooled over the rows).
#[derive(Default, Debug, Clone, Copy)]
struct Dist {
    max: f32,
    ss: f64,
    ss_ref: f64,
}

impl Dist {
    fn add(&mut self, a: &[f32], b: &[f32]) {
        let mean = b.iter().map(|&v| v as f64).sum::<f64>() / b.len().max(1) as f64;
        for (&x, &y) in a.iter().zip(b) {
            let d = if x.is_finite() {
                (x - y).abs()
            } else {
                f32::INFINITY
            };
            self.max = self.max.max(d);
            self.ss += (d as f64) * (d as f64);
            self.ss_ref += (y as f64 - mean).powi(2);
        }
    }
    fn rel_rms(&self) -> f64 {
        (self.ss / self.ss_ref.max(1e-30)).sqrt()
    }
}

fn top2(x: &[f32]) -> (f32, f32) {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    (a, b)
}

fn top2_gap(x: &[f32]) -> f32 {
    let (a, b) = top2(x);
    a - b
}

/// One test's comparisons: cuda vs cpu, and both against the reference when it runs.
#[derive(Default, Debug)]
struct Cmp {
    gc: Dist,
    max_cpu: f32,
    gr: Option<Dist>,
    cr: Option<Dist>,
    top1_same: usize,
    rows: usize,
    real_flips: usize,
    tie_flips: usize,
    /// Each disagreement: row, cpu's and cuda's token, the cpu's gap and sigma.
    flips: Vec<String>,
    /// The rows where top-1 differs.
    flip_rows: Vec<usize>,
}

impl Cmp {
    fn add(&mut self, gpu: &[f32], cpu: &[f32], reference: Option<&[f32]>) {
        let mut row = Dist::default();
        row.add(gpu, cpu);
        self.gc.max = self.gc.max.max(row.max);
        self.gc.ss += row.ss;
        self.gc.ss_ref += row.ss_ref;
        self.max_cpu = cpu.iter().fold(self.max_cpu, |m, v| m.max(v.abs()));
        if let Some(r) = reference {
            self.gr.get_or_insert_with(Dist::default).add(gpu, r);
            self.cr.get_or_insert_with(Dist::default).add(cpu, r);
        }
        let (tg, tc) = (argmax(gpu), argmax(cpu));
        if tg == tc {
            self.top1_same += 1;
        } else {
            let sigma = (row.ss / cpu.len().max(1) as f64).sqrt() as f32;
            let gap = top2_gap(cpu);
            // (NaN anywhere counts as real.)
            let real = gap.is_nan() || sigma.is_nan() || gap > TIE_SIGMAS * sigma;
            self.flip_rows.push(self.rows);
            if real {
                self.real_flips += 1;
            } else {
                self.tie_flips += 1;
            }
            // Which of the two the F32-activation reference prefers, and by how much.
            let by_ref = reference
                .map(|r| {
                    format!(
                        ", ref: cpu's - cuda's {:+.4} (ref top-1 {})",
                        r[tc as usize] - r[tg as usize],
                        argmax(r)
                    )
                })
                .unwrap_or_default();
            self.flips.push(format!(
                "row {}: cpu {tc} cuda {tg}, cpu top-2 gap {gap:.4} = {:.2} sigma (sigma {sigma:.4}){by_ref}{}",
                self.rows,
                gap / sigma.max(1e-30),
                if real { " REAL" } else { "" }
            ));
        }
        self.rows += 1;
    }

    fn ok(&self) -> bool {
        let noise = match (self.gr, self.cr) {
            (Some(gr), Some(cr)) => {
                gr.max as f64 <= NOISE_FACTOR * cr.max as f64
                    && gr.rel_rms() <= NOISE_FACTOR * cr.rel_rms()
            }
            _ => self.gc.rel_rms() <= NO_REF_REL_RMS,
        };
        noise && self.real_flips == 0 && self.gc.max.is_finite()
    }

    fn line(&self, what: &str) -> String {
        let mut s = format!(
            "{what:30} max|cuda-cpu| {:.4} (max|cpu| {:.2}, {:.2}%)  relRMS {:.4}  top-1 {}/{}  flips {} real {} ties",
            self.gc.max,
            self.max_cpu,
            100.0 * self.gc.max / self.max_cpu.max(1e-9),
            self.gc.rel_rms(),
            self.top1_same,
            self.rows,
            self.real_flips,
            self.tie_flips,
        );
        if let (Some(gr), Some(cr)) = (self.gr, self.cr) {
            s += &format!(
                "  | vs f32-act ref: max cuda {:.4} cpu {:.4} ({:.2}x), relRMS cuda {:.4} cpu {:.4} ({:.2}x)",
                gr.max,
                cr.max,
                gr.max / cr.max.max(1e-30),
                gr.rel_rms(),
                cr.rel_rms(),
                gr.rel_rms() / cr.rel_rms().max(1e-30)
            );
        }
        s += if self.ok() { "  PASS" } else { "  FAIL" };
        for f in &self.flips {
            s += &format!("\n    {f}");
        }
        s
    }
}

/// The three engines: CPU, CUDA and the optional F32 reference (CPU on unpacked weights).
struct Sides {
    cpu: Engine,
    gpu: Engine,
    reference: Option<Engine>,
}

/// One sequence on each side.
#[derive(Clone, Copy)]
struct Seq3 {
    c: SeqId,
    g: SeqId,
    r: Option<SeqId>,
}

type Rows = Vec<Vec<f32>>;

fn step(e: &mut Engine, batch: &[(SeqId, Vec<u32>)], all: bool) -> Res<Vec<Rows>> {
    let inputs: Vec<SeqInput> = batch
        .iter()
        .map(|(seq, tokens)| SeqInput {
            seq: *seq,
            tokens: tokens.clone(),
            logits: if all { Logits::All } else { Logits::Last },
        })
        .collect();
    Ok(e.forward(&inputs)?)
}

impl Sides {
    fn new_seq(&mut self) -> Seq3 {
        Seq3 {
            c: self.cpu.new_sequence(),
            g: self.gpu.new_sequence(),
            r: self.reference.as_mut().map(|e| e.new_sequence()),
        }
    }

    fn free(&mut self, s: Seq3) {
        self.cpu.free_sequence(s.c);
        self.gpu.free_sequence(s.g);
        if let (Some(e), Some(r)) = (self.reference.as_mut(), s.r) {
            e.free_sequence(r);
        }
    }

    /// One batch on every side: per sequence, (cpu rows, cuda rows, reference rows).
    fn step(
        &mut self,
        batch: &[(Seq3, Vec<u32>)],
        all: bool,
    ) -> Res<Vec<(Rows, Rows, Option<Rows>)>> {
        let pick = |f: fn(&Seq3) -> SeqId| -> Vec<(SeqId, Vec<u32>)> {
            batch.iter().map(|(s, t)| (f(s), t.clone())).collect()
        };
        let c = step(&mut self.cpu, &pick(|s| s.c), all)?;
        let g = step(&mut self.gpu, &pick(|s| s.g), all)?;
        let r = match self.reference.as_mut() {
            Some(e) => {
                let b: Vec<(SeqId, Vec<u32>)> = batch
                    .iter()
                    .map(|(s, t)| (s.r.expect("reference sequence"), t.clone()))
                    .collect();
                step(e, &b, all)?.into_iter().map(Some).collect()
            }
            None => vec![None; batch.len()],
        };
        Ok(c.into_iter()
            .zip(g)
            .zip(r)
            .map(|((c, g), r)| (c, g, r))
            .collect())
    }

    /// Feeds `prompt` as one sequence, every row compared.
    fn prompt(&mut self, prompt: &[u32], cmp: &mut Cmp) -> Res<(Seq3, Vec<f32>)> {
        let s = self.new_seq();
        let mut out = self.step(&[(s, prompt.to_vec())], true)?;
        let (c, g, r) = out.remove(0);
        for (i, (gr, cr)) in g.iter().zip(&c).enumerate() {
            cmp.add(gr, cr, r.as_ref().map(|r| r[i].as_slice()));
        }
        Ok((s, c.last().cloned().unwrap_or_default()))
    }
}

fn gpu_device() -> Device {
    match std::env::var("PARITY_DEVICE").as_deref() {
        Ok("cpu") => Device::Cpu,
        _ => Device::Cuda(0),
    }
}

fn engine_opts(device: Device) -> EngineOptions {
    EngineOptions {
        kv_tokens: 1024,
        block_size: 16,
        device,
        ..EngineOptions::default()
    }
}

fn open_sides(model: &Path, reference: Option<&Path>) -> Res<Sides> {
    let gguf = Arc::new(Gguf::open(model)?);
    let cpu = Engine::from_gguf(gguf.clone(), &engine_opts(Device::Cpu))?;
    // A simulated kernel bug, to show the bars can fail: the "CUDA" side gets a copy with
    // the named tensors zeroed.
    let fault: Vec<String> = std::env::var("PARITY_FAULT")
        .map(|v| v.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let gpu = if fault.is_empty() {
        Engine::from_gguf(gguf, &engine_opts(gpu_device()))?
    } else {
        let p = scratch(model, "fault");
        let (layers, vocab) = (cpu.info().n_layer, cpu.info().n_vocab);
        shrink(model, &p, layers, vocab, None, &fault)?;
        println!("PARITY_FAULT: the cuda side runs with {fault:?} zeroed");
        let e = Engine::load(&p, &engine_opts(gpu_device()))?;
        let _ = std::fs::remove_file(&p);
        e
    };
    let reference = match reference {
        Some(p) => Some(Engine::load(p, &engine_opts(Device::Cpu))?),
        None => None,
    };
    Ok(Sides {
        cpu,
        gpu,
        reference,
    })
}

/// Spread-out token ids (no tokenizer needed).
fn spread(n_vocab: usize, from: usize, n: usize) -> Vec<u32> {
    (from..from + n)
        .map(|i| ((i * 7919 + 13) % (n_vocab - 1) + 1) as u32)
        .collect()
}

/// A scratch path for the reference and sweep files (large: TMPDIR, else /tmp).
fn scratch(model: &Path, tag: &str) -> PathBuf {
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "model".into());
    std::env::temp_dir().join(format!("parity-{stem}-{tag}.gguf"))
}

fn check(model: &Path, with_ref: bool, sweep: &[usize]) -> Res<bool> {
    let t0 = Instant::now();
    let ref_path = if with_ref {
        let p = scratch(model, "f32");
        dequant(model, &p)?;
        Some(p)
    } else {
        None
    };
    let t_ref = t0.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut sd = open_sides(model, ref_path.as_deref())?;
    let n_vocab = sd.cpu.info().n_vocab;
    let n_layer = sd.cpu.info().n_layer;
    println!(
        "\n== {} ({:?}, {n_layer} layers, vocab {n_vocab}) on {}, reference {} (loaded in {:.2} s, F32 copy {:.1} s)",
        model.display(),
        sd.cpu.info().arch,
        sd.gpu.device_name(),
        if with_ref { "F32 weights on CPU" } else { "none" },
        t.elapsed().as_secs_f64(),
        t_ref
    );
    let mut all_ok = true;

    // 1. Spread-out ids, every row.
    let mut c1 = Cmp::default();
    let (s, _) = sd.prompt(&spread(n_vocab, 0, 40), &mut c1)?;
    sd.free(s);
    println!("{}", c1.line("prompt 40 spread ids, all rows"));
    all_ok &= c1.ok();

    // 2. English prompt, every row, then 32 greedy steps fed the CPU's choice.
    let english = Tokenizer::from_gguf(sd.cpu.gguf().metadata())
        .map(|t| t.encode(ENGLISH, true, false))
        .ok()
        .filter(|t| t.len() > 8 && t.iter().all(|&x| (x as usize) < n_vocab));
    let (prompt, what) = match english {
        Some(t) => (t, "English"),
        None => (spread(n_vocab, 500, 40), "spread ids (no vocabulary)"),
    };
    let mut c2 = Cmp::default();
    let (s, last) = sd.prompt(&prompt, &mut c2)?;
    println!(
        "{}",
        c2.line(&format!("prompt {} tokens, {what}", prompt.len()))
    );
    all_ok &= c2.ok();
    let mut c3 = Cmp::default();
    let mut cpu_tokens = vec![argmax(&last)];
    for _ in 0..32 {
        let next = *cpu_tokens.last().expect("one token");
        let mut out = sd.step(&[(s, vec![next])], false)?;
        let (c, g, r) = out.remove(0);
        c3.add(&g[0], &c[0], r.as_ref().map(|r| r[0].as_slice()));
        cpu_tokens.push(argmax(&c[0]));
    }
    sd.free(s);
    println!("{}", c3.line("32 greedy steps (cpu-fed)"));
    all_ok &= c3.ok();

    // 3. The CUDA backend's own greedy run from the same prompt.
    // (Every prompt row, as in step 2: the prompt's matmuls are then the same launches.)
    let gs = sd.gpu.new_sequence();
    let rows = step(&mut sd.gpu, &[(gs, prompt.clone())], true)?;
    let mut gpu_tokens = vec![argmax(rows[0].last().ok_or("no prompt logits")?)];
    while gpu_tokens.len() < 32 {
        let next = *gpu_tokens.last().expect("one token");
        gpu_tokens.push(argmax(
            &step(&mut sd.gpu, &[(gs, vec![next])], false)?[0][0],
        ));
    }
    sd.gpu.free_sequence(gs);
    // The engine's greedy path (`forward_greedy`: the argmax inside the step, in the
    // decode graph once it is captured) must pick exactly what the host's argmax picks
    // from the same steps' logits (the prompt's last row only, in both runs).
    all_ok &= greedy_paths_agree(
        &mut sd.gpu,
        std::slice::from_ref(&prompt),
        32,
        "greedy 32 tokens",
    )?;
    let same = gpu_tokens
        .iter()
        .zip(&cpu_tokens)
        .take_while(|(a, b)| a == b)
        .count();
    println!(
        "greedy 32 tokens, each backend on its own choices: {}",
        if same == 32 {
            "32/32 equal".to_string()
        } else {
            format!("first difference at token {same}")
        }
    );
    println!("  cpu  {:?}", &cpu_tokens[..32]);
    println!("  cuda {gpu_tokens:?}");
    if let Ok(tk) = Tokenizer::from_gguf(sd.cpu.gguf().metadata()) {
        println!("  cpu text: {:?}", tk.decode(&cpu_tokens[..32]));
    }
    // The first difference must be where the cpu-fed run disagreed (its last prompt row for
    // token 0, else decode step `same - 1`); anything else means the CUDA run is not
    // deterministic. Whether that disagreement was a tie is judged by steps 2-3's bars.
    let explained = same == 32
        || (same == 0 && c2.flip_rows.contains(&(prompt.len() - 1)))
        || (same > 0 && c3.flip_rows.contains(&(same - 1)));
    if !explained {
        println!("  FAIL: the greedy runs differ but no cpu-fed step disagreed");
    }
    all_ok &= explained;

    // 4. Three sequences at different positions, decoded together.
    let lens = [5usize, 23, 50];
    let mut seqs = Vec::new();
    for (j, &n) in lens.iter().enumerate() {
        let p = spread(n_vocab, 1000 * (j + 1), n);
        let s = sd.new_seq();
        let out = sd.step(&[(s, p)], false)?;
        seqs.push((s, argmax(&out[0].0[0])));
    }
    let mut c4 = Cmp::default();
    for _ in 0..16 {
        let batch: Vec<_> = seqs.iter().map(|&(s, t)| (s, vec![t])).collect();
        let out = sd.step(&batch, false)?;
        for (k, (c, g, r)) in out.into_iter().enumerate() {
            c4.add(&g[0], &c[0], r.as_ref().map(|r| r[0].as_slice()));
            seqs[k].1 = argmax(&c[0]);
        }
    }
    println!("{}", c4.line("3 sequences x 16 steps, batched"));
    all_ok &= c4.ok();
    // The same batch on the CUDA engine alone, as `smelt serve` runs a greedy batch
    // (`argmax_rows` over the three rows in the step's graph).
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(j, &n)| spread(n_vocab, 1000 * (j + 1), n))
        .collect();
    all_ok &= greedy_paths_agree(&mut sd.gpu, &prompts, 17, "3 sequences x 16 steps")?;
    drop(sd);

    // Depth sweep: test 1 on the first N layers.
    for &d in sweep.iter().filter(|&&d| d < n_layer) {
        let q = scratch(model, &format!("{d}l"));
        shrink(model, &q, d, n_vocab, None, &[])?;
        let r = match &ref_path {
            Some(p) => {
                let r = scratch(model, &format!("{d}l-f32"));
                shrink(p, &r, d, n_vocab, None, &[])?;
                Some(r)
            }
            None => None,
        };
        let mut sd = open_sides(&q, r.as_deref())?;
        let mut c = Cmp::default();
        sd.prompt(&spread(n_vocab, 0, 40), &mut c)?;
        println!("{}", c.line(&format!("sweep: first {d} layers, prompt")));
        drop(sd);
        let _ = std::fs::remove_file(&q);
        if let Some(r) = r {
            let _ = std::fs::remove_file(r);
        }
    }
    if let Some(p) = ref_path {
        let _ = std::fs::remove_file(p);
    }
    println!(
        "{}: {} ({:.1} s)",
        model.display(),
        if all_ok { "PASS" } else { "FAIL" },
        t0.elapsed().as_secs_f64()
    );
    Ok(all_ok)
}

/// Decodes `prompts` together for `steps` steps on `e` twice, feeding back the greedy
/// tokens: from the logits on the host, and from the engine's greedy step
/// (`Engine::forward_greedy`). Prints whether the two token streams are the same.
fn greedy_paths_agree(e: &mut Engine, prompts: &[Vec<u32>], steps: usize, what: &str) -> Res<bool> {
    let mut runs = [Vec::new(), Vec::new()];
    for (on_engine, picks) in [false, true].into_iter().zip(&mut runs) {
        let mut live: Vec<(SeqId, Vec<u32>)> = prompts
            .iter()
            .map(|p| (e.new_sequence(), p.clone()))
            .collect();
        for _ in 0..steps {
            let input: Vec<SeqInput> = live
                .iter()
                .map(|(seq, t)| SeqInput {
                    seq: *seq,
                    tokens: t.clone(),
                    logits: Logits::Last,
                })
                .collect();
            let next: Vec<u32> = if on_engine {
                e.forward_greedy(&input)?
                    .into_iter()
                    .map(|t| t.ok_or("no greedy token"))
                    .collect::<Result<_, _>>()?
            } else {
                e.forward(&input)?
                    .iter()
                    .map(|rows| rows.first().map(|r| argmax(r)).ok_or("no logits"))
                    .collect::<Result<_, _>>()?
            };
            for ((_, t), &n) in live.iter_mut().zip(&next) {
                *t = vec![n];
            }
            picks.extend(next);
        }
        for (seq, _) in live {
            e.free_sequence(seq);
        }
    }
    let same = runs[0] == runs[1];
    println!(
        "{what}, CUDA's argmax in the step vs on the host: {}",
        if same { "equal" } else { "FAIL: different" }
    );
    Ok(same)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("shrink") if args.len() >= 3 => {
            let layers = arg_after(&args, "--layers").unwrap_or(4);
            let vocab = arg_after(&args, "--vocab").unwrap_or(8192);
            shrink(
                Path::new(&args[1]),
                Path::new(&args[2]),
                layers,
                vocab,
                arg_after(&args, "--window"),
                &args
                    .iter()
                    .position(|a| a == "--zero")
                    .and_then(|i| args.get(i + 1))
                    .map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .map(|()| true)
        }
        Some("dequant") if args.len() == 3 => {
            dequant(Path::new(&args[1]), Path::new(&args[2])).map(|()| true)
        }
        Some("check") if args.len() >= 2 => {
            let with_ref = !args.iter().any(|a| a == "--no-ref");
            let sweep: Vec<usize> = args
                .iter()
                .position(|a| a == "--sweep")
                .and_then(|i| args.get(i + 1))
                .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
                .unwrap_or_default();
            let mut skip_next = false;
            let mut all = true;
            for m in &args[1..] {
                if std::mem::take(&mut skip_next) {
                    continue;
                }
                if m == "--sweep" {
                    skip_next = true;
                    continue;
                }
                if m.starts_with("--") {
                    continue;
                }
                match check(Path::new(m), with_ref, &sweep) {
                    Ok(ok) => all &= ok,
                    Err(e) => {
                        println!("{m}: ERROR {e}");
                        all = false;
                    }
                }
            }
            println!("\nparity: {}", if all { "PASS" } else { "FAIL" });
            Ok(all)
        }
        _ => Err("usage: cuda_parity shrink IN OUT [--layers N] [--vocab V] [--window W] [--zero a,b] | dequant IN OUT | check MODEL... [--no-ref] [--sweep N,M]".into()),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
