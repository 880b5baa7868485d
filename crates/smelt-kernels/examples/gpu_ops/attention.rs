//! Attention against its CPU twin: the KV append, the split decode kernels for every head
//! size (64..256 in steps of 16, 80/96/112 included) with their reduce and q8_1 combine,
//! the generic any-head-size kernel, and the tensor-core prompt attention (`ops::flash`)
//! for every head size: several sequences at different positions crossing KV block
//! boundaries, grouped-query heads, sliding windows, soft-capping, prompt chunks after
//! cached blocks, block sizes that are not powers of two; outputs poisoned first.
//! Perf: the prompt attention against the split kernel at Llama-3-8B shape.

use anyhow::{Context, Result};
use cudarc::driver::PushKernelArg;
use half::f16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use smelt_kernels::fused::Sink;
use smelt_kernels::ops::{attention, flash, kv};

use super::harness::{floats, launch_values, nan, ptr, Check, Gpu, Report};
use super::timing::time_launches;

/// The decode kernels, the KV append and the combine.
pub const DECODE: &[&str] = &[
    "kv_append",
    "attention_hd*",
    "attention_any",
    "attention_reduce",
];
/// The tensor-core prompt attention.
pub const PROMPT: &[&str] = &["attention_prefill_*"];

/// A paged KV layout for a batch: descriptors, block tables (shuffled block ids), and
/// the number of blocks.
pub struct Paged {
    pub seqs: Vec<kv::SeqDesc>,
    pub tables: Vec<u32>,
    pub n_blocks: usize,
    pub rows: usize,
    pub max_tokens: usize,
}

pub fn paged(rng: &mut impl Rng, shape: &[(usize, usize)], bs: usize) -> Paged {
    let mut seqs = Vec::new();
    let mut need = Vec::new();
    let mut row = 0;
    for &(start, n) in shape {
        need.push((start + n).div_ceil(bs));
        seqs.push(kv::SeqDesc {
            row: row as u32,
            n_tokens: n as u32,
            start_pos: start as u32,
            block_table_offset: 0,
        });
        row += n;
    }
    let n_blocks: usize = need.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = vec![0u32; 2]; // some padding before the first table
    let mut next = 0;
    for (s, &nb) in seqs.iter_mut().zip(&need) {
        s.block_table_offset = tables.len() as u32;
        tables.extend_from_slice(&ids[next..next + nb]);
        next += nb;
    }
    let max_tokens = shape.iter().map(|s| s.1).max().unwrap_or(1);
    Paged {
        seqs,
        tables,
        n_blocks,
        rows: row,
        max_tokens,
    }
}

pub fn f16_bits(rng: &mut impl Rng, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_bits())
        .collect()
}

#[allow(clippy::too_many_arguments)]
pub fn run_attention(
    gpu: &Gpu,
    p: &Paged,
    shape: &attention::AttnShape,
    n_splits: usize,
    qd: &cudarc::driver::CudaSlice<f32>,
    kcd: &cudarc::driver::CudaSlice<u16>,
    vcd: &cudarc::driver::CudaSlice<u16>,
    sd: &cudarc::driver::CudaSlice<u32>,
    td: &cudarc::driver::CudaSlice<u32>,
    acc: &mut cudarc::driver::CudaSlice<f32>,
    ml: &mut cudarc::driver::CudaSlice<f32>,
    out: &mut cudarc::driver::CudaSlice<f32>,
    what: Which,
    combine: Option<Combine<'_>>,
    stage: u32,
    skip_tokens: u32,
) -> Result<()> {
    let name = match combine {
        Some((_, _, sink)) => attention::combine_name(shape.head_dim, sink),
        None => attention::name(shape.head_dim),
    }
    .context("head_dim")?;
    let qt = attention::q_tiles(p.max_tokens, shape.n_head, shape.n_head_kv) as u32;
    let (ns, hd) = (n_splits as u32, shape.head_dim as u32);
    if what != Which::Reduce {
        let a = attention::Args {
            q: ptr(gpu, qd),
            k_cache: ptr(gpu, kcd),
            v_cache: ptr(gpu, vcd),
            seqs: ptr(gpu, sd),
            block_tables: ptr(gpu, td),
            part_acc: ptr(gpu, acc),
            part_ml: ptr(gpu, ml),
            n_head: shape.n_head as u32,
            n_head_kv: shape.n_head_kv as u32,
            block_size: shape.block_size as u32,
            n_splits: ns,
            q_tiles: qt,
            window: shape.window as u32,
            scale: shape.scale,
            stage_blocks: stage,
            skip_tokens,
        };
        let mut values = a.values();
        // The combining kernel also writes the output, its tiles and its counters.
        if let Some((tiles, counters, _)) = &combine {
            let c = attention::CombineArgs {
                out: ptr(gpu, out),
                sink: ptr(gpu, &**tiles),
                counters: ptr(gpu, &**counters),
            };
            values.extend(c.values());
        }
        let l = attention::launch(
            p.seqs.len(),
            p.max_tokens,
            shape.n_head,
            shape.n_head_kv,
            n_splits,
        );
        launch_values(gpu, name, l, &values)?;
    }
    if what != Which::Main && combine.is_none() {
        launch!(
            gpu,
            attention::REDUCE,
            attention::reduce_launch(p.rows, shape.n_head, shape.head_dim),
            [&*acc, &*ml, &mut *out, &ns, &hd]
        );
    }
    Ok(())
}

/// The combining attention's q8_1 tiles or f16 rows, its counters, and which of the two
/// it writes (`attention::combine_kernel`).
pub type Combine<'a> = (
    &'a mut cudarc::driver::CudaSlice<u8>,
    &'a mut cudarc::driver::CudaSlice<u32>,
    Sink,
);

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Both,
    Main,
    Reduce,
}

/// (seqs as (start_pos, new tokens), n_head, n_head_kv, head_dim, block size, window, splits)
pub type AttnCase = (
    Vec<(usize, usize)>,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
);

pub fn check_kv_attention(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (mut ckv, mut catt) = (Check::new(kv::KV_APPEND), Check::new("attention + reduce"));
    let (mut ccomb, mut ctiles) = (
        Check::new("attention_hd*_combine_* (f32)"),
        Check::new("attention_hd*_combine_* (tiles)"),
    );
    let (mut ccount, mut crun) = (
        Check::new("attention_hd*_combine_* (counters)"),
        Check::new("attention_hd*_combine_* (rerun)"),
    );
    let mut cany = Check::new(attention::ANY);
    // (seqs as (start_pos, new tokens), n_head, n_head_kv, head_dim, block size, window, splits)
    let cases: Vec<AttnCase> = vec![
        (vec![(0, 1), (37, 1), (300, 1)], 8, 2, 128, 16, 0, 4),
        (vec![(0, 20), (45, 7)], 9, 3, 64, 16, 0, 3),
        (vec![(100, 5), (10, 3)], 4, 1, 256, 32, 50, 8),
        (vec![(5, 1), (61, 9), (0, 13)], 6, 6, 128, 12, 0, 5),
        (vec![(700, 1)], 8, 4, 64, 16, 129, 7),
        (vec![(4095, 1)], 32, 8, 128, 16, 0, 32),
        (vec![(0, 64)], 4, 2, 128, 16, 0, 1),
        // More new tokens than kv_append's grid has z blocks (it strides over them).
        (vec![(3, 1100)], 4, 2, 64, 16, 0, 4),
        (
            vec![(33, 4), (2, 2), (17, 1), (250, 3)],
            16,
            4,
            256,
            8,
            20,
            64,
        ),
        // The other multiples of 16 (lanes that hold no chunk, partial slots, staged rows
        // that are not a power of two of 16-byte pieces); 96, 160, 192 and 224 with whole
        // tiles per row also run the combining kernel.
        (vec![(0, 1), (37, 1), (300, 1)], 8, 2, 80, 16, 0, 4),
        (vec![(0, 20), (45, 7)], 8, 4, 96, 16, 0, 3),
        (vec![(100, 5), (10, 3)], 4, 1, 112, 32, 50, 8),
        (vec![(5, 1), (61, 9), (0, 13)], 6, 2, 144, 12, 0, 5),
        (vec![(700, 1)], 8, 4, 160, 16, 129, 7),
        (vec![(33, 4), (250, 3)], 6, 2, 176, 8, 20, 16),
        (vec![(1000, 1), (3, 1)], 4, 4, 192, 16, 0, 12),
        (vec![(17, 6)], 5, 1, 208, 16, 0, 2),
        (vec![(90, 2)], 8, 8, 224, 16, 33, 6),
        (vec![(0, 40)], 2, 1, 240, 16, 0, 3),
        // No kernel of their own: the generic one only (`attention::any_kernel`).
        (vec![(0, 9), (40, 1)], 4, 2, 72, 16, 0, 1),
        (vec![(3, 5)], 8, 2, 32, 16, 6, 1),
        (vec![(20, 3), (0, 1)], 3, 1, 264, 16, 0, 1),
    ];
    for (shape, n_head, n_head_kv, hd, bs, window, n_splits) in cases {
        let p = paged(rng, &shape, bs);
        let kv_dim = n_head_kv * hd;
        let cache_len = p.n_blocks * bs * kv_dim;
        let mut kc = f16_bits(rng, cache_len);
        let mut vc = f16_bits(rng, cache_len);
        let knew = floats(rng, p.rows * kv_dim, 1.0);
        let vnew = floats(rng, p.rows * kv_dim, 1.0);
        let mut kcd = gpu.stream.clone_htod(&kc)?;
        let mut vcd = gpu.stream.clone_htod(&vc)?;
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let sd = gpu.stream.clone_htod(&words)?;
        let td = gpu.stream.clone_htod(&p.tables)?;
        let (knd, vnd) = (gpu.stream.clone_htod(&knew)?, gpu.stream.clone_htod(&vnew)?);
        let (kd32, bs32) = (kv_dim as u32, bs as u32);
        launch!(
            gpu,
            kv::KV_APPEND,
            kv::launch(p.seqs.len(), p.max_tokens, kv_dim),
            [&knd, &vnd, &mut kcd, &mut vcd, &sd, &td, &kd32, &bs32]
        );
        kv::kv_append_cpu(
            &knew, &vnew, &mut kc, &mut vc, &p.seqs, &p.tables, kv_dim, bs,
        );
        let case = format!("seqs {shape:?} heads {n_head}/{n_head_kv} hd {hd} bs {bs} window {window} splits {n_splits}");
        ckv.bits(&format!("K {case}"), &gpu.stream.clone_dtoh(&kcd)?, &kc);
        ckv.bits(&format!("V {case}"), &gpu.stream.clone_dtoh(&vcd)?, &vc);

        let q = floats(rng, p.rows * n_head * hd, 1.0);
        let qd = gpu.stream.clone_htod(&q)?;
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window,
            scale: 1.0 / (hd as f32).sqrt() * 2.0,
        };
        let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
        // Both kernels (or the combining one) on fresh poisoned partials and output.
        let launch = |combine: Option<Combine<'_>>, stage: u32| -> Result<Vec<f32>> {
            let mut acc = gpu.stream.clone_htod(&nan(al))?;
            let mut ml = gpu.stream.clone_htod(&nan(mll))?;
            let mut out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
            run_attention(
                gpu,
                &p,
                &s,
                n_splits,
                &qd,
                &kcd,
                &vcd,
                &sd,
                &td,
                &mut acc,
                &mut ml,
                &mut out,
                Which::Both,
                combine,
                stage,
                0,
            )?;
            Ok(gpu.stream.clone_dtoh(&out)?)
        };
        let mut want = vec![0f32; p.rows * n_head * hd];
        attention::attention_cpu(&q, &kc, &vc, &p.seqs, &p.tables, &s, &mut want);
        // The generic kernel takes every head size.
        let out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
        let a = attention::AnyArgs {
            q: ptr(gpu, &qd),
            k_cache: ptr(gpu, &kcd),
            v_cache: ptr(gpu, &vcd),
            seqs: ptr(gpu, &sd),
            block_tables: ptr(gpu, &td),
            out: ptr(gpu, &out),
            n_head: n_head as u32,
            n_head_kv: n_head_kv as u32,
            head_dim: hd as u32,
            block_size: bs as u32,
            window: window as u32,
            scale: s.scale,
        };
        let l = attention::any_launch(p.seqs.len(), p.max_tokens, n_head);
        launch_values(gpu, attention::ANY, l, &a.values())?;
        cany.add(&case, &gpu.stream.clone_dtoh(&out)?, &want, 2e-5, 1e-4);
        if attention::name(hd).is_none() {
            continue;
        }
        // Unstaged (every key read from the cache in the loop) and staged.
        catt.add(&case, &launch(None, 0)?, &want, 2e-5, 1e-4);
        catt.add(
            &format!("{case} staged"),
            &launch(None, 32)?,
            &want,
            2e-5,
            1e-4,
        );
        if attention::combine_fits(n_head, hd, n_splits) {
            // Twice on the same inputs: the counters must come back to zero, so the
            // second launch combines as the first did.
            let groups = attention::combine_counters(p.seqs.len(), p.max_tokens, n_head, n_head_kv);
            let mut counters = gpu.stream.alloc_zeros::<u32>(groups)?;
            let mut first: Option<Vec<f32>> = None;
            // Round 0 stages as much as fits, round 1 one block per split (the loop then
            // reads shared memory and the cache), round 2 writes f16 rows: the same bits.
            for (round, (stage, sink)) in [(32, Sink::Q8_1), (1, Sink::Q8_1), (32, Sink::F16Rows)]
                .into_iter()
                .enumerate()
            {
                let row_q = sink.row_bytes(n_head * hd)?;
                let mut qt = gpu.stream.clone_htod(&vec![0xFFu8; p.rows * row_q])?;
                let got = launch(Some((&mut qt, &mut counters, sink)), stage)?;
                let c = format!("{case} round {round} {sink:?}");
                ccomb.add(&c, &got, &want, 2e-5, 1e-4);
                let tiles = smelt_kernels::fused::sink_cpu(&got, n_head * hd, sink)?;
                ctiles.bits(&c, &gpu.stream.clone_dtoh(&qt)?, &tiles);
                let left = gpu.stream.clone_dtoh(&counters)?;
                ccount.bits(&c, &left, &vec![0u32; groups]);
                match &first {
                    None => first = Some(got),
                    Some(f) => {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        crun.bits(&c, &bits(&got), &bits(f))
                    }
                }
            }
        }
    }
    rep.push(kv::KV_APPEND, ckv, "exact (bits)");
    rep.push("attention + reduce", catt, "2e-5 + 1e-4|r|");
    rep.push(attention::ANY, cany, "2e-5 + 1e-4|r|");
    rep.push("attention_hd*_combine_* (f32)", ccomb, "2e-5 + 1e-4|r|");
    rep.push(
        "attention_hd*_combine_* (tiles)",
        ctiles,
        "exact (q8_1 or f16 rows of its f32)",
    );
    rep.push(
        "attention_hd*_combine_* (counters)",
        ccount,
        "all zero after",
    );
    rep.push("attention_hd*_combine_* (rerun)", crun, "same bits");
    Ok(())
}

/// The tensor-core prompt attention (`ops::flash`) for every head size against the
/// attention twin: prompt chunks after cached blocks, several sequences of different
/// lengths in one launch (rows a block leaves empty), grouped-query heads packed into a
/// block's rows, sliding windows, block sizes that are not powers of two.
pub fn check_prefill(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let (mut c, mut cmix) = (
        Check::new("attention_prefill_hd*"),
        Check::new("split (short) + prefill (long)"),
    );
    let mut cserial = Check::new("attention_prefill_serial_hd*");
    let mut c16 = Check::new("attention_prefill_hd* (f16 rows)");
    // (seqs as (start_pos, new tokens), n_head, n_head_kv, head_dim, block size, window)
    type Case = (Vec<(usize, usize)>, usize, usize, usize, usize, usize);
    let mut cases: Vec<Case> = vec![
        (vec![(0, 100)], 8, 2, 128, 16, 0),
        (vec![(37, 64), (0, 5), (300, 33)], 8, 2, 64, 16, 0),
        (vec![(200, 70)], 4, 4, 80, 16, 50),
        (vec![(5, 40)], 16, 2, 96, 12, 0),
        (vec![(1000, 48), (7, 1)], 4, 1, 112, 32, 0),
        (vec![(0, 1)], 2, 1, 128, 16, 0),
        // A prompt chunk beside decode rows of a long context (a mixed step).
        (vec![(0, 64), (2000, 1), (90, 1)], 8, 2, 128, 16, 0),
    ];
    for (i, hd) in (144..=256).step_by(16).enumerate() {
        let window = [0, 20, 0, 45][i % 4];
        cases.push((vec![(10 + 17 * i, 37), (0, 20)], 4, 2, hd, 16, window));
    }
    for (shape, n_head, n_head_kv, hd, bs, window) in cases {
        let p = paged(rng, &shape, bs);
        let kv_dim = n_head_kv * hd;
        let cache_len = p.n_blocks * bs * kv_dim;
        let (kc, vc) = (f16_bits(rng, cache_len), f16_bits(rng, cache_len));
        let q = floats(rng, p.rows * n_head * hd, 1.0);
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window,
            scale: 1.0 / (hd as f32).sqrt() * 2.0,
        };
        let mut want = vec![0f32; p.rows * n_head * hd];
        attention::attention_cpu(&q, &kc, &vc, &p.seqs, &p.tables, &s, &mut want);
        let (kcd, vcd) = (gpu.stream.clone_htod(&kc)?, gpu.stream.clone_htod(&vc)?);
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let (sd, td) = (
            gpu.stream.clone_htod(&words)?,
            gpu.stream.clone_htod(&p.tables)?,
        );
        let qd = gpu.stream.clone_htod(&q)?;
        let out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
        let a = flash::Args {
            q: ptr(gpu, &qd),
            k_cache: ptr(gpu, &kcd),
            v_cache: ptr(gpu, &vcd),
            seqs: ptr(gpu, &sd),
            block_tables: ptr(gpu, &td),
            out: ptr(gpu, &out),
            n_head: n_head as u32,
            n_head_kv: n_head_kv as u32,
            block_size: bs as u32,
            window: window as u32,
            scale: s.scale,
            min_tokens: 0,
            out16: 0,
        };
        let name = flash::name(hd).context("prefill head_dim")?;
        let serial = flash::serial_name(hd).context("prefill head_dim")?;
        let l = flash::launch(p.seqs.len(), p.max_tokens, n_head, n_head_kv);
        let case =
            format!("seqs {shape:?} heads {n_head}/{n_head_kv} hd {hd} bs {bs} window {window}");
        launch_values(gpu, name, l, &a.values())?;
        let got = gpu.stream.clone_dtoh(&out)?;
        c.add(&case, &got, &want, 6e-4, 1e-3);
        // The f16 rows for the output projection, where rows are whole 256-value tiles:
        // the same f32 output, and its rows as `gemm::f16::act_cpu` converts them.
        if (n_head * hd) % 256 == 0 {
            let cols = n_head * hd;
            let out3 = gpu.stream.clone_htod(&nan(p.rows * cols))?;
            let h = gpu.stream.clone_htod(&vec![0xffffu16; p.rows * cols])?;
            let a3 = flash::Args {
                out: ptr(gpu, &out3),
                out16: ptr(gpu, &h),
                ..a
            };
            launch_values(gpu, name, l, &a3.values())?;
            let got3 = gpu.stream.clone_dtoh(&out3)?;
            c16.add(&format!("{case} f32"), &got3, &got, 0.0, 0.0);
            let want16 = smelt_kernels::gemm::f16::act_cpu(&got3, cols)?;
            c16.bits(&case, &gpu.stream.clone_dtoh(&h)?, &want16);
        }
        let out2 = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
        let a2 = flash::Args {
            out: ptr(gpu, &out2),
            ..a
        };
        launch_values(gpu, serial, l, &a2.values())?;
        cserial.add(&case, &gpu.stream.clone_dtoh(&out2)?, &want, 6e-4, 1e-3);
        // A mixed step as the CUDA backend runs it: the split kernel and its reduce for
        // the short sequences (all rows), then the prompt kernel over the long ones' rows.
        let min = flash::MIN_TOKENS;
        if shape.iter().any(|x| x.1 < min) && shape.iter().any(|x| x.1 >= min) {
            let n_splits = 4;
            let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
            let mut acc = gpu.stream.clone_htod(&nan(al))?;
            let mut ml = gpu.stream.clone_htod(&nan(mll))?;
            let mut out = gpu.stream.clone_htod(&nan(p.rows * n_head * hd))?;
            run_attention(
                gpu,
                &p,
                &s,
                n_splits,
                &qd,
                &kcd,
                &vcd,
                &sd,
                &td,
                &mut acc,
                &mut ml,
                &mut out,
                Which::Both,
                None,
                32,
                min as u32,
            )?;
            let a = flash::Args {
                out: ptr(gpu, &out),
                min_tokens: min as u32,
                ..a
            };
            launch_values(gpu, name, l, &a.values())?;
            cmix.add(&case, &gpu.stream.clone_dtoh(&out)?, &want, 6e-4, 1e-3);
        }
    }
    rep.push("attention_prefill_hd*", c, "6e-4 + 1e-3|r| (f16 P)");
    rep.push(
        "attention_prefill_serial_hd*",
        cserial,
        "6e-4 + 1e-3|r| (f16 P)",
    );
    rep.push("split (short) + prefill (long)", cmix, "6e-4 + 1e-3|r|");
    rep.push(
        "attention_prefill_hd* (f16 rows)",
        c16,
        "same f32; rows = act_cpu (bits)",
    );
    Ok(())
}

/// Prompt attention at Llama-3-8B shape: the tensor-core kernel against the split kernel +
/// reduce the engine runs below `flash::MIN_TOKENS`, for a whole prompt and for a chunk
/// after a cached prefix: what the threshold is to be chosen from.
pub fn perf_prefill(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let lines = prefill_speed(gpu, rng)?;
    rep.perf.extend(lines);
    Ok(())
}

fn prefill_speed(gpu: &Gpu, rng: &mut StdRng) -> Result<Vec<String>> {
    println!("\n== speed: prompt attention at Llama-3-8B shape (32 heads, 8 KV heads, head_dim 128, block 16) ==");
    let mut table = vec![
        "| prompt attention | tokens | cached | tensor cores us | tensor cores, serial us | split + reduce us | split/tensor |"
            .to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let (n_head, n_head_kv, hd, bs) = (32usize, 8usize, 128usize, 16usize);
    for (start, n) in [
        (0usize, 32usize),
        (0, 128),
        (0, 512),
        (3584, 512),
        (0, 2048),
    ] {
        let p = paged(rng, &[(start, n)], bs);
        let cache_len = p.n_blocks * bs * n_head_kv * hd;
        let kcd = gpu.stream.clone_htod(&f16_bits(rng, cache_len))?;
        let vcd = gpu.stream.clone_htod(&f16_bits(rng, cache_len))?;
        let words: Vec<u32> = p.seqs.iter().flat_map(|s| s.words()).collect();
        let (sd, td) = (
            gpu.stream.clone_htod(&words)?,
            gpu.stream.clone_htod(&p.tables)?,
        );
        let qd = gpu
            .stream
            .clone_htod(&floats(rng, p.rows * n_head * hd, 1.0))?;
        let mut out = gpu.stream.alloc_zeros::<f32>(p.rows * n_head * hd)?;
        let s = attention::AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
            block_size: bs,
            window: 0,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let a = flash::Args {
            q: ptr(gpu, &qd),
            k_cache: ptr(gpu, &kcd),
            v_cache: ptr(gpu, &vcd),
            seqs: ptr(gpu, &sd),
            block_tables: ptr(gpu, &td),
            out: ptr(gpu, &out),
            n_head: n_head as u32,
            n_head_kv: n_head_kv as u32,
            block_size: bs as u32,
            window: 0,
            scale: s.scale,
            min_tokens: 0,
            out16: 0,
        };
        let name = flash::name(hd).context("head_dim")?;
        let l = flash::launch(1, n, n_head, n_head_kv);
        let values = a.values();
        let reps = if n >= 2048 { 5 } else { 20 };
        let tc = time_launches(&gpu.stream, 5, 2, reps, |_| {
            launch_values(gpu, name, l, &values)
        })? * 1e3;
        let serial = flash::serial_name(hd).context("head_dim")?;
        let ts = time_launches(&gpu.stream, 5, 2, reps, |_| {
            launch_values(gpu, serial, l, &values)
        })? * 1e3;
        // The split kernel as the engine launches it for one sequence: 16 splits on 132 SMs.
        let n_splits = (gpu.sms / n_head_kv).clamp(4, 64);
        let (al, mll) = attention::partial_lens(p.rows, n_head, n_splits, hd);
        let mut acc = gpu.stream.alloc_zeros::<f32>(al)?;
        let mut ml = gpu.stream.alloc_zeros::<f32>(mll)?;
        let split = time_launches(&gpu.stream, 5, 2, reps, |_| {
            run_attention(
                gpu,
                &p,
                &s,
                n_splits,
                &qd,
                &kcd,
                &vcd,
                &sd,
                &td,
                &mut acc,
                &mut ml,
                &mut out,
                Which::Both,
                None,
                32,
                0,
            )
        })? * 1e3;
        let line = format!(
            "| attention_prefill_hd128 | {n} | {start} | {tc:.1} | {ts:.1} | {split:.1} | {:.2} |",
            split / tc
        );
        println!("{line}");
        table.push(line);
    }
    Ok(table)
}
