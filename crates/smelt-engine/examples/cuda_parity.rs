//! Whole-model parity of the CUDA backend against the CPU backend, run on the GPU machine
//! by `bench/gpu/decode.sh`.
//!
//! `cuda_parity shrink IN OUT --layers N --vocab V [--window W]` (here): a smaller copy of a
//! real model, for the GPU run's size limit: the first N layers and the first V rows of the
//! embedding table, every kept tensor byte-for-byte as in IN (`--window` sets Gemma 3's
//! sliding window, so a short test crosses it). The vocabulary lists are left out.
//!
//! `cuda_parity check MODEL...` (there): for each model, on both backends,
//! 1. a 40-token prompt with every row's logits: max |cuda - cpu|, top-1 agreement;
//! 2. 32 greedy tokens fed back (the CPU's choice; the CUDA run must choose the same at
//!    every step; a different choice is reported with the CPU's own top-2 gap);
//! 3. three sequences at different positions decoded together for 16 steps (one batch per
//!    step: descriptors, block tables and the batch's graph), same comparisons.
//!
//! The decode steps after the second go through captured CUDA graphs. Exit status 1 when a
//! model fails: logits further apart than 2% of their range, or a greedy token differs
//! where the CPU's top-2 gap is wider than twice that row's largest difference (closer is
//! a float tie: activations are requantized to 8 bits before every matmul, so a rounding
//! flip anywhere moves logits by about that much).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use smelt_engine::{argmax, Device, Engine, EngineOptions, Logits, SeqId, SeqInput};
use smelt_gguf::{Gguf, GgufWriter, TensorSpec, Value};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

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
    for t in g.tensors().iter().filter(|t| keep(&t.name)) {
        let mut shape = t.shape.clone();
        let mut data = g.tensor_data(t);
        if t.name == "token_embd.weight" || t.name == "output.weight" {
            let rows = (vocab as u64).min(shape[1]);
            let row_bytes = data.len() / shape[1] as usize;
            shape[1] = rows;
            data = &data[..rows as usize * row_bytes];
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

/// Max |a - b|, max |b|, rows whose argmax agree, rows.
#[derive(Default, Debug)]
struct Cmp {
    max_diff: f32,
    max_ref: f32,
    top1_same: usize,
    rows: usize,
    /// Greedy disagreements where the CPU's top-2 gap is wider than the tie margin.
    real_flips: usize,
    /// Disagreements inside the tie margin.
    tie_flips: usize,
}

/// A top-1 disagreement is a float tie when the CPU's two best logits are closer than twice
/// the largest |cuda - cpu| of that row (each of the two may move by that much), or 0.05.
fn tie_margin(row_diff: f32) -> f32 {
    (2.0 * row_diff).max(0.05)
}

fn top2_gap(x: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

impl Cmp {
    fn add(&mut self, gpu: &[f32], cpu: &[f32]) {
        let mut row_diff = 0f32;
        for (g, c) in gpu.iter().zip(cpu) {
            let d = if g.is_finite() {
                (g - c).abs()
            } else {
                f32::INFINITY
            };
            row_diff = row_diff.max(d);
            self.max_ref = self.max_ref.max(c.abs());
        }
        self.max_diff = self.max_diff.max(row_diff);
        self.rows += 1;
        if argmax(gpu) == argmax(cpu) {
            self.top1_same += 1;
        } else if top2_gap(cpu) > tie_margin(row_diff) {
            self.real_flips += 1;
        } else {
            self.tie_flips += 1;
        }
    }
    fn ok(&self) -> bool {
        self.max_diff <= 0.02 * self.max_ref.max(1.0) && self.real_flips == 0
    }
    fn line(&self, what: &str) -> String {
        format!(
            "{what:28} max|cuda-cpu| {:.4} (max|cpu| {:.2}, {:.3}%)  top-1 {}/{}  flips: {} real, {} ties  {}",
            self.max_diff,
            self.max_ref,
            100.0 * self.max_diff / self.max_ref.max(1e-9),
            self.top1_same,
            self.rows,
            self.real_flips,
            self.tie_flips,
            if self.ok() { "PASS" } else { "FAIL" }
        )
    }
}

fn step(e: &mut Engine, batch: &[(SeqId, Vec<u32>)], all: bool) -> Res<Vec<Vec<Vec<f32>>>> {
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

fn check(model: &Path) -> Res<bool> {
    let gguf = Arc::new(Gguf::open(model)?);
    let opts = |device| EngineOptions {
        kv_tokens: 1024,
        block_size: 16,
        device,
        ..EngineOptions::default()
    };
    let mut cpu = Engine::from_gguf(gguf.clone(), &opts(Device::Cpu))?;
    let t = std::time::Instant::now();
    let mut gpu = Engine::from_gguf(gguf, &opts(Device::Cuda(0)))?;
    let n_vocab = cpu.info().n_vocab;
    println!(
        "\n== {} ({:?}, {} layers, vocab {n_vocab}) on {} (loaded in {:.2} s)",
        model.display(),
        cpu.info().arch,
        cpu.info().n_layer,
        gpu.device_name(),
        t.elapsed().as_secs_f64()
    );
    let tok = |i: usize| ((i * 7919 + 13) % (n_vocab - 1) + 1) as u32;

    // 1. Prompt, all rows.
    let prompt: Vec<u32> = (0..40).map(tok).collect();
    let (sc, sg) = (cpu.new_sequence(), gpu.new_sequence());
    let lc = step(&mut cpu, &[(sc, prompt.clone())], true)?;
    let lg = step(&mut gpu, &[(sg, prompt.clone())], true)?;
    let mut c1 = Cmp::default();
    for (g, c) in lg[0].iter().zip(&lc[0]) {
        c1.add(g, c);
    }
    println!("{}", c1.line("prompt 40 tokens, all rows"));

    // 2. Greedy decode, fed the CPU's tokens.
    let mut c2 = Cmp::default();
    let mut next = argmax(&lc[0][39]);
    let mut first_flip = None;
    for i in 0..32 {
        let c = step(&mut cpu, &[(sc, vec![next])], false)?;
        let g = step(&mut gpu, &[(sg, vec![next])], false)?;
        let before = c2.top1_same;
        c2.add(&g[0][0], &c[0][0]);
        if c2.top1_same == before && first_flip.is_none() {
            first_flip = Some((i, top2_gap(&c[0][0])));
        }
        next = argmax(&c[0][0]);
    }
    println!("{}", c2.line("greedy 32 tokens"));
    match first_flip {
        None => println!("greedy tokens: 32/32 equal"),
        Some((i, gap)) => {
            println!("greedy tokens: first difference at token {i} (cpu top-2 gap {gap:.4})")
        }
    }
    cpu.free_sequence(sc);
    gpu.free_sequence(sg);

    // 3. Three sequences at different positions, decoded together.
    let lens = [5usize, 23, 50];
    let mut seqs = Vec::new();
    for (j, &n) in lens.iter().enumerate() {
        let p: Vec<u32> = (0..n).map(|i| tok(1000 * (j + 1) + i)).collect();
        let (a, b) = (cpu.new_sequence(), gpu.new_sequence());
        let c = step(&mut cpu, &[(a, p.clone())], false)?;
        step(&mut gpu, &[(b, p)], false)?;
        seqs.push((a, b, argmax(&c[0][0])));
    }
    let mut c3 = Cmp::default();
    for _ in 0..16 {
        let bc: Vec<_> = seqs.iter().map(|s| (s.0, vec![s.2])).collect();
        let bg: Vec<_> = seqs.iter().map(|s| (s.1, vec![s.2])).collect();
        let c = step(&mut cpu, &bc, false)?;
        let g = step(&mut gpu, &bg, false)?;
        for (k, s) in seqs.iter_mut().enumerate() {
            c3.add(&g[k][0], &c[k][0]);
            s.2 = argmax(&c[k][0]);
        }
    }
    println!("{}", c3.line("3 sequences x 16 steps"));
    Ok(c1.ok() && c2.ok() && c3.ok())
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
            )
            .map(|()| true)
        }
        Some("check") if args.len() >= 2 => {
            let mut all = true;
            for m in &args[1..] {
                match check(Path::new(m)) {
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
        _ => Err("usage: cuda_parity shrink IN OUT [--layers N] [--vocab V] [--window W] | check MODEL...".into()),
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
