//! The hybrid models' kernels (`smelt_kernels::delta_net`, `delta_chunk`) against their CPU
//! twins (`-o delta` runs only these): the
//! convolution and the delta-rule step over several sequences of 1 to 70 tokens at their own
//! state addresses and offsets (a decode row beside prompt chunks), the strided q/k L2
//! norm, the gated output norm, the column gather, the split halves and the sigmoid gate,
//! the chunked prompt kernels (`delta_chunk`) over ragged prompts against both the chunked
//! and the token-by-token twin, outputs poisoned first; then the step kernels' time (32
//! rows a block, and run 1's block a head) and the chunked kernels' at the Qwen3.6-27B
//! shape (48 value heads of 128): one decode token for 1 and 32 sequences, prompts of 64
//! and 512 tokens. The MoE hybrids' router matmul (`moe::dense_f32_kernel`) is checked and
//! timed here too, beside its first version.

use anyhow::Result;
use rand::rngs::StdRng;
use rand::Rng;
use smelt_kernels::delta_chunk as dc;
use smelt_kernels::delta_net as dn;
use smelt_kernels::moe;

use super::harness::{floats, launch_values, nan, ptr, Check, Gpu, Report};
use super::timing::time_launches;

/// Every delta-net kernel, and the MoE router's f32 matmul (both versions), which the MoE
/// hybrids run and this check times.
pub const COVERS: &[&str] = &["delta_*", "matmul_f32_rows", "matmul_f32_rows_scalar"];

/// One test batch: sequences of `lens` tokens, rows in order, each with its descriptor
/// `{row, n_tokens, 0, 0}`.
fn descs(lens: &[usize]) -> Vec<u32> {
    let mut row = 0;
    let mut d = Vec::new();
    for &n in lens {
        d.extend([row as u32, n as u32, 0, 0]);
        row += n;
    }
    d
}

/// A state block per sequence with every layer's state at `off` floats into it: the
/// device buffer, each sequence's address, and the floats between sequences.
fn state_blocks(
    gpu: &Gpu,
    init: &[Vec<f32>],
    off: usize,
) -> Result<(cudarc::driver::CudaSlice<f32>, Vec<u64>, usize)> {
    let each = init.iter().map(Vec::len).max().unwrap_or(0) + off + 64;
    // Sequences in reverse memory order: the kernels must follow the addresses.
    let mut host = vec![f32::NAN; each * init.len()];
    for (i, s) in init.iter().enumerate() {
        let at = (init.len() - 1 - i) * each + off;
        host[at..at + s.len()].copy_from_slice(s);
    }
    let d = gpu.stream.clone_htod(&host)?;
    let base = ptr(gpu, &d);
    let addrs = (0..init.len())
        .map(|i| base + 4 * ((init.len() - 1 - i) * each) as u64)
        .collect();
    Ok((d, addrs, each))
}

/// The state of sequence `i` back from the device.
fn state_of(
    gpu: &Gpu,
    buf: &cudarc::driver::CudaSlice<f32>,
    n_seqs: usize,
    each: usize,
    i: usize,
    off: usize,
    len: usize,
) -> Result<Vec<f32>> {
    let all = gpu.stream.clone_dtoh(buf)?;
    let at = (n_seqs - 1 - i) * each + off;
    Ok(all[at..at + len].to_vec())
}

fn check_conv(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut out_c, mut win_c) = (Check::new("delta"), Check::new("delta"));
    for (ch, lens) in [
        (512usize, vec![1usize]),
        (200, vec![1, 5, 1]),
        (1280, vec![40, 1, 70]),
        (33, vec![3, 2]),
    ] {
        let n: usize = lens.iter().sum();
        let x = floats(rng, n * ch, 2.0);
        let w = floats(rng, ch * dn::CONV_TAPS, 1.0);
        let wins: Vec<Vec<f32>> = lens
            .iter()
            .map(|_| floats(rng, (dn::CONV_TAPS - 1) * ch, 1.0))
            .collect();
        let off = 24;
        let (sbuf, addrs, each) = state_blocks(gpu, &wins, off)?;
        let xd = gpu.stream.clone_htod(&x)?;
        let wd = gpu.stream.clone_htod(&w)?;
        let od = gpu.stream.clone_htod(&nan(n * ch))?;
        let ad = gpu.stream.clone_htod(&addrs)?;
        let dd = gpu.stream.clone_htod(&descs(&lens))?;
        launch_values(
            gpu,
            dn::CONV1D,
            dn::conv1d_launch(ch, lens.len()),
            &dn::ConvArgs {
                x: ptr(gpu, &xd),
                out: ptr(gpu, &od),
                w: ptr(gpu, &wd),
                windows: ptr(gpu, &ad),
                seqs: ptr(gpu, &dd),
                ch: ch as u32,
                state_off: (4 * off) as u32,
            }
            .values(),
        )?;
        let got = gpu.stream.clone_dtoh(&od)?;
        let mut row = 0;
        for (i, &len) in lens.iter().enumerate() {
            let mut win = wins[i].clone();
            let want = dn::conv1d_cpu(&x[row * ch..(row + len) * ch], &mut win, &w, ch);
            let case = format!("ch {ch} seq {i} ({len} tokens)");
            out_c.add(&case, &got[row * ch..(row + len) * ch], &want, 1e-6, 1e-5);
            let gw = state_of(gpu, &sbuf, lens.len(), each, i, off, win.len())?;
            win_c.add(&case, &gw, &win, 0.0, 0.0);
            row += len;
        }
    }
    rep.push("delta conv1d + silu", out_c, "1e-6 + 1e-5|r|");
    rep.push("delta conv1d window", win_c, "exact");
    Ok(())
}

fn check_norms(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut l2, mut gated) = (Check::new("delta"), Check::new("delta"));
    for (rows, s, hk, hv) in [
        (1usize, 128usize, 16usize, 48usize),
        (7, 64, 2, 4),
        (3, 128, 2, 6),
    ] {
        let ch = (2 * hk + hv) * s;
        let x = floats(rng, rows * ch, 2.0);
        let eps = 1e-6f32;
        let mut want = x.clone();
        for r in want.chunks_mut(ch) {
            dn::l2_norm_cpu(&mut r[..2 * hk * s], s, eps);
        }
        let xd = gpu.stream.clone_htod(&x)?;
        launch_values(
            gpu,
            dn::L2_NORM,
            dn::norm_launch(rows * 2 * hk),
            &dn::L2Args {
                x: ptr(gpu, &xd),
                n_chunks: (rows * 2 * hk) as u32,
                width: s as u32,
                eps,
                per_row: (2 * hk) as u32,
                row_stride: ch as u32,
            }
            .values(),
        )?;
        let case = format!("{rows} rows, {hk} key heads of {s}");
        l2.add(&case, &gpu.stream.clone_dtoh(&xd)?, &want, 1e-6, 1e-5);

        let o = floats(rng, rows * hv * s, 3.0);
        let z = floats(rng, rows * hv * s, 3.0);
        let w = floats(rng, s, 1.5);
        let mut want = o.clone();
        dn::gated_norm_cpu(&mut want, &w, &z, eps);
        let od = gpu.stream.clone_htod(&o)?;
        let zd = gpu.stream.clone_htod(&z)?;
        let wd = gpu.stream.clone_htod(&w)?;
        launch_values(
            gpu,
            dn::GATED_NORM,
            dn::norm_launch(rows * hv),
            &dn::GatedNormArgs {
                o: ptr(gpu, &od),
                w: ptr(gpu, &wd),
                z: ptr(gpu, &zd),
                n_chunks: (rows * hv) as u32,
                width: s as u32,
                eps,
            }
            .values(),
        )?;
        gated.add(&case, &gpu.stream.clone_dtoh(&od)?, &want, 1e-5, 1e-5);
    }
    rep.push("delta l2 norm (strided)", l2, "1e-6 + 1e-5|r|");
    rep.push("delta gated norm", gated, "1e-5 + 1e-5|r|");
    Ok(())
}

/// The step kernel over a batch (`lens` tokens per sequence) against the twin token by
/// token; q/k/v inside conv-like rows of `(2 h_k + h_v) s` floats.
#[allow(clippy::too_many_arguments)]
fn step_case(
    gpu: &Gpu,
    rng: &mut impl Rng,
    head_blocks: bool,
    s: usize,
    hk: usize,
    hv: usize,
    grouped: bool,
    lens: &[usize],
    out_c: &mut Check,
    state_c: &mut Check,
) -> Result<()> {
    let n: usize = lens.iter().sum();
    let kw = hk * s;
    let ch = 2 * kw + hv * s;
    let mut rows = floats(rng, n * ch, 1.0);
    for r in rows.chunks_mut(ch) {
        dn::l2_norm_cpu(&mut r[..2 * kw], s, 1e-6);
    }
    let alpha = floats(rng, n * hv, 2.0);
    let beta = floats(rng, n * hv, 3.0);
    let dt = floats(rng, hv, 1.0);
    let a: Vec<f32> = (0..hv).map(|_| -rng.gen_range(0.1f32..2.0)).collect();
    let init: Vec<Vec<f32>> = lens.iter().map(|_| floats(rng, hv * s * s, 0.5)).collect();
    let off = 3 * ch; // as a layer's matrices after its window
    let (sbuf, addrs, each) = state_blocks(gpu, &init, off)?;
    let xd = gpu.stream.clone_htod(&rows)?;
    let ald = gpu.stream.clone_htod(&alpha)?;
    let bed = gpu.stream.clone_htod(&beta)?;
    let dtd = gpu.stream.clone_htod(&dt)?;
    let ad = gpu.stream.clone_htod(&a)?;
    let od = gpu.stream.clone_htod(&nan(n * hv * s))?;
    let addr_d = gpu.stream.clone_htod(&addrs)?;
    let dd = gpu.stream.clone_htod(&descs(lens))?;
    let x = ptr(gpu, &xd);
    let (name, launch) = if head_blocks {
        (
            dn::step_head_name(s),
            dn::step_launch_rows(s, hv, lens.len(), s),
        )
    } else {
        (dn::step_name(s), dn::step_launch(s, hv, lens.len()))
    };
    launch_values(
        gpu,
        name,
        launch,
        &dn::StepArgs {
            q: x,
            k: x + 4 * kw as u64,
            v: x + 8 * kw as u64,
            alpha: ptr(gpu, &ald),
            beta: ptr(gpu, &bed),
            dt_bias: ptr(gpu, &dtd),
            a: ptr(gpu, &ad),
            out: ptr(gpu, &od),
            states: ptr(gpu, &addr_d),
            seqs: ptr(gpu, &dd),
            h_k: hk as u32,
            h_v: hv as u32,
            grouped: u32::from(grouped),
            stride: ch as u32,
            state_off: (4 * off) as u32,
        }
        .values(),
    )?;
    let got = gpu.stream.clone_dtoh(&od)?;
    let mut row = 0;
    for (i, &len) in lens.iter().enumerate() {
        let mut st = init[i].clone();
        let mut want = Vec::new();
        for t in row..row + len {
            let r = &rows[t * ch..(t + 1) * ch];
            want.extend(dn::step_cpu(
                s,
                hk,
                grouped,
                &r[..kw],
                &r[kw..2 * kw],
                &r[2 * kw..],
                &alpha[t * hv..(t + 1) * hv],
                &beta[t * hv..(t + 1) * hv],
                &dt,
                &a,
                &mut st,
            ));
        }
        let case = format!("s {s}, {hk}/{hv} heads, grouped {grouped}, seq {i} of {len} tokens");
        let o = &got[row * hv * s..(row + len) * hv * s];
        out_c.add(&case, o, &want, 2e-5, 1e-3);
        let gs = state_of(gpu, &sbuf, lens.len(), each, i, off, st.len())?;
        state_c.add(&case, &gs, &st, 2e-5, 1e-3);
        row += len;
    }
    Ok(())
}

fn check_step(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    // The 32-rows-a-block kernel (the engine's) and run 1's one block a head.
    for (head_blocks, what) in [(false, "32 rows a block"), (true, "a block a head, run 1")] {
        let (mut out_c, mut state_c) = (Check::new("delta"), Check::new("delta"));
        for (s, hk, hv, lens) in [
            (128usize, 16usize, 48usize, vec![1usize]),
            (128, 16, 32, vec![1, 1, 1]),
            (64, 2, 4, vec![1, 7, 1]),
            (128, 2, 6, vec![33, 1]),
            (64, 4, 4, vec![70]),
        ] {
            for grouped in [false, true] {
                step_case(
                    gpu,
                    rng,
                    head_blocks,
                    s,
                    hk,
                    hv,
                    grouped,
                    &lens,
                    &mut out_c,
                    &mut state_c,
                )?;
            }
        }
        rep.push(
            &format!("delta step, {what} (outputs)"),
            out_c,
            "2e-5 + 1e-3|r|",
        );
        rep.push(
            &format!("delta step, {what} (state)"),
            state_c,
            "2e-5 + 1e-3|r|",
        );
    }
    Ok(())
}

/// The chunked kernels over a batch (`lens` tokens per sequence) against the chunked twin
/// and against the token-by-token twin; q/k/v inside conv-like rows as for the step.
#[allow(clippy::too_many_arguments)]
fn chunk_case(
    gpu: &Gpu,
    rng: &mut impl Rng,
    s: usize,
    hk: usize,
    hv: usize,
    grouped: bool,
    lens: &[usize],
    c: &mut [Check; 4],
) -> Result<()> {
    let n: usize = lens.iter().sum();
    let kw = hk * s;
    let ch = 2 * kw + hv * s;
    let mut rows = floats(rng, n * ch, 1.0);
    for r in rows.chunks_mut(ch) {
        dn::l2_norm_cpu(&mut r[..2 * kw], s, 1e-6);
    }
    let alpha = floats(rng, n * hv, 2.0);
    let beta = floats(rng, n * hv, 3.0);
    let dt = floats(rng, hv, 1.0);
    let a: Vec<f32> = (0..hv).map(|_| -rng.gen_range(0.1f32..2.0)).collect();
    let init: Vec<Vec<f32>> = lens.iter().map(|_| floats(rng, hv * s * s, 0.5)).collect();
    let off = 3 * ch;
    let (sbuf, addrs, each) = state_blocks(gpu, &init, off)?;
    let xd = gpu.stream.clone_htod(&rows)?;
    let ald = gpu.stream.clone_htod(&alpha)?;
    let bed = gpu.stream.clone_htod(&beta)?;
    let dtd = gpu.stream.clone_htod(&dt)?;
    let ad = gpu.stream.clone_htod(&a)?;
    let od = gpu.stream.clone_htod(&nan(n * hv * s))?;
    let scratch = gpu
        .stream
        .clone_htod(&nan(dc::scratch_bytes(lens.len(), n, hv) / 4))?;
    let addr_d = gpu.stream.clone_htod(&addrs)?;
    let dd = gpu.stream.clone_htod(&descs(lens))?;
    let x = ptr(gpu, &xd);
    let chunks = lens.iter().max().copied().unwrap_or(0).div_ceil(dc::CHUNK);
    launch_values(
        gpu,
        dc::prep_name(s),
        dc::prep_launch(hv, chunks, lens.len()),
        &dc::PrepArgs {
            q: x,
            k: x + 4 * kw as u64,
            alpha: ptr(gpu, &ald),
            beta: ptr(gpu, &bed),
            dt_bias: ptr(gpu, &dtd),
            a: ptr(gpu, &ad),
            scratch: ptr(gpu, &scratch),
            seqs: ptr(gpu, &dd),
            h_k: hk as u32,
            h_v: hv as u32,
            grouped: u32::from(grouped),
            stride: ch as u32,
        }
        .values(),
    )?;
    launch_values(
        gpu,
        dc::chunk_name(s),
        dc::chunk_launch(s, hv, lens.len()),
        &dc::ChunkArgs {
            q: x,
            k: x + 4 * kw as u64,
            v: x + 8 * kw as u64,
            alpha: ptr(gpu, &ald),
            beta: ptr(gpu, &bed),
            dt_bias: ptr(gpu, &dtd),
            a: ptr(gpu, &ad),
            scratch: ptr(gpu, &scratch),
            out: ptr(gpu, &od),
            states: ptr(gpu, &addr_d),
            seqs: ptr(gpu, &dd),
            h_k: hk as u32,
            h_v: hv as u32,
            grouped: u32::from(grouped),
            stride: ch as u32,
            state_off: (4 * off) as u32,
        }
        .values(),
    )?;
    let got = gpu.stream.clone_dtoh(&od)?;
    let mut row = 0;
    for (i, &len) in lens.iter().enumerate() {
        let r = &rows[row * ch..(row + len) * ch];
        let pick = |from: usize, to: usize| -> Vec<f32> {
            r.chunks(ch).flat_map(|x| x[from..to].to_vec()).collect()
        };
        let (q, k, v) = (pick(0, kw), pick(kw, 2 * kw), pick(2 * kw, ch));
        let (al, be) = (
            &alpha[row * hv..(row + len) * hv],
            &beta[row * hv..(row + len) * hv],
        );
        let mut st = init[i].clone();
        let want = dc::chunked_cpu(s, hk, grouped, &q, &k, &v, al, be, &dt, &a, &mut st);
        let mut st_steps = init[i].clone();
        let mut steps = Vec::new();
        for t in 0..len {
            steps.extend(dn::step_cpu(
                s,
                hk,
                grouped,
                &q[t * kw..(t + 1) * kw],
                &k[t * kw..(t + 1) * kw],
                &v[t * hv * s..(t + 1) * hv * s],
                &al[t * hv..(t + 1) * hv],
                &be[t * hv..(t + 1) * hv],
                &dt,
                &a,
                &mut st_steps,
            ));
        }
        let case = format!("s {s}, {hk}/{hv} heads, grouped {grouped}, seq {i} of {len} tokens");
        let o = &got[row * hv * s..(row + len) * hv * s];
        let gs = state_of(gpu, &sbuf, lens.len(), each, i, off, st.len())?;
        c[0].add(&case, o, &want, 2e-5, 1e-3);
        c[1].add(&case, &gs, &st, 2e-5, 1e-3);
        c[2].add(&case, o, &steps, 2e-5, 1e-3);
        c[3].add(&case, &gs, &st_steps, 2e-5, 1e-3);
        row += len;
    }
    Ok(())
}

/// The chunked kernels over ragged prompts (1, 63, 64, 65, 200, 512 tokens; several
/// sequences of a step, a decode row among them), both head sizes and mappings.
fn check_chunked(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let mut c: [Check; 4] = std::array::from_fn(|_| Check::new("delta chunked"));
    for (s, hk, hv, lens) in [
        (128usize, 2usize, 6usize, vec![1usize]),
        (128, 2, 6, vec![63]),
        (128, 2, 4, vec![64]),
        (128, 2, 6, vec![65]),
        (128, 4, 8, vec![200]),
        (128, 2, 4, vec![512]),
        (64, 2, 4, vec![65, 1, 200]),
        (64, 4, 4, vec![512, 63]),
    ] {
        for grouped in [false, true] {
            chunk_case(gpu, rng, s, hk, hv, grouped, &lens, &mut c)?;
        }
    }
    let [a, b, cc, d] = c;
    rep.push(
        "delta chunked (outputs) vs chunked twin",
        a,
        "2e-5 + 1e-3|r|",
    );
    rep.push("delta chunked (state) vs chunked twin", b, "2e-5 + 1e-3|r|");
    rep.push(
        "delta chunked (outputs) vs recurrent twin",
        cc,
        "2e-5 + 1e-3|r|",
    );
    rep.push(
        "delta chunked (state) vs recurrent twin",
        d,
        "2e-5 + 1e-3|r|",
    );
    Ok(())
}

fn check_small(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut gather, mut split, mut sig) = (
        Check::new("delta"),
        Check::new("delta"),
        Check::new("delta"),
    );
    for (rows, x_cols) in [(1usize, 96usize), (5, 1000), (3, 7)] {
        let x = floats(rng, rows * x_cols, 2.0);
        let cols: Vec<u32> = (0..x_cols * 2 / 3)
            .map(|_| rng.gen_range(0..x_cols as u32))
            .collect();
        let want = dn::gather_cols_cpu(&x, x_cols, &cols);
        let xd = gpu.stream.clone_htod(&x)?;
        let cd = gpu.stream.clone_htod(&cols)?;
        let od = gpu.stream.clone_htod(&nan(want.len()))?;
        launch_values(
            gpu,
            dn::GATHER_COLS,
            dn::flat_launch(want.len()),
            &dn::GatherArgs {
                x: ptr(gpu, &xd),
                out: ptr(gpu, &od),
                cols: ptr(gpu, &cd),
                n: want.len() as u32,
                n_cols: cols.len() as u32,
                x_cols: x_cols as u32,
            }
            .values(),
        )?;
        gather.add(
            &format!("{rows}x{x_cols}"),
            &gpu.stream.clone_dtoh(&od)?,
            &want,
            0.0,
            0.0,
        );
    }
    for (rows, width, chunks) in [(1usize, 256usize, 24usize), (9, 128, 4), (2, 512, 1)] {
        let x = floats(rng, rows * 2 * width * chunks, 2.0);
        let (wa, wb) = dn::split_halves_cpu(&x, width);
        let xd = gpu.stream.clone_htod(&x)?;
        let ad = gpu.stream.clone_htod(&nan(wa.len()))?;
        let bd = gpu.stream.clone_htod(&nan(wb.len()))?;
        launch_values(
            gpu,
            dn::SPLIT_HALVES,
            dn::flat_launch(wa.len()),
            &dn::SplitArgs {
                x: ptr(gpu, &xd),
                a: ptr(gpu, &ad),
                b: ptr(gpu, &bd),
                n: wa.len() as u32,
                width: width as u32,
            }
            .values(),
        )?;
        let case = format!("{rows} rows of {chunks} x 2 x {width}");
        split.add(&case, &gpu.stream.clone_dtoh(&ad)?, &wa, 0.0, 0.0);
        split.add(&case, &gpu.stream.clone_dtoh(&bd)?, &wb, 0.0, 0.0);
    }
    for (rows, cols, per_row) in [
        (1usize, 6144usize, false),
        (4, 2048, true),
        (7, 33, false),
        (3, 5, true),
    ] {
        let x = floats(rng, rows * cols, 3.0);
        let g = floats(rng, if per_row { rows } else { rows * cols }, 6.0);
        let mut want = x.clone();
        dn::mul_sigmoid_cpu(&mut want, &g, cols, per_row);
        let xd = gpu.stream.clone_htod(&x)?;
        let gd = gpu.stream.clone_htod(&g)?;
        launch_values(
            gpu,
            dn::MUL_SIGMOID,
            dn::flat_launch(rows * cols),
            &dn::MulSigmoidArgs {
                x: ptr(gpu, &xd),
                g: ptr(gpu, &gd),
                n: (rows * cols) as u32,
                cols: cols as u32,
                per_row: u32::from(per_row),
            }
            .values(),
        )?;
        let case = format!("{rows}x{cols} per_row {per_row}");
        sig.add(&case, &gpu.stream.clone_dtoh(&xd)?, &want, 1e-6, 1e-5);
    }
    rep.push("delta gather_cols", gather, "exact");
    rep.push("delta split_halves", split, "exact");
    rep.push("delta mul_sigmoid", sig, "1e-6 + 1e-5|r|");
    Ok(())
}

/// The router's f32 matmul (`moe::dense_f32_kernel`, and the first version) against its
/// twin: router shapes of 1 to 512 rows, widths with a partial last stretch (2052) and
/// not a multiple of 4 (the scalar loop), 1 to 3 tokens.
fn check_router(gpu: &Gpu, rng: &mut impl Rng, rep: &mut Report) -> Result<()> {
    let (mut vec_c, mut scalar_c) = (Check::new("delta"), Check::new("delta"));
    for (rows, cols, ntok) in [
        (128usize, 2048usize, 1usize),
        (512, 2048, 3),
        (1, 2048, 1),
        (7, 2052, 2),
        (13, 70, 2),
        (5, 4, 1),
    ] {
        let w = floats(rng, rows * cols, 0.1);
        let x = floats(rng, ntok * cols, 1.0);
        let want = moe::dense_cpu(&w, &x, rows, cols);
        let wd = gpu.stream.clone_htod(&w)?;
        let xd = gpu.stream.clone_htod(&x)?;
        for (name, c) in [
            (moe::DENSE_F32, &mut vec_c),
            (moe::DENSE_F32_SCALAR, &mut scalar_c),
        ] {
            let yd = gpu.stream.clone_htod(&nan(ntok * rows))?;
            launch_values(
                gpu,
                name,
                moe::dense_launch(rows, ntok),
                &moe::DenseArgs {
                    w: ptr(gpu, &wd),
                    x: ptr(gpu, &xd),
                    y: ptr(gpu, &yd),
                    nrows: rows as u32,
                    cols: cols as u32,
                }
                .values(),
            )?;
            let case = format!("{rows}x{cols}, {ntok} tokens");
            c.add(&case, &gpu.stream.clone_dtoh(&yd)?, &want, 1e-5, 1e-4);
        }
    }
    rep.push("router f32 matmul (16-byte loads)", vec_c, "1e-5 + 1e-4|r|");
    rep.push(
        "router f32 matmul (first, scalar)",
        scalar_c,
        "1e-5 + 1e-4|r|",
    );
    Ok(())
}

/// The router's f32 matmul at the MoE models' shapes, one decode token: microseconds a
/// layer, the 16-byte loop beside the first, scalar one.
fn router_speed(gpu: &Gpu, rng: &mut impl Rng) -> Result<Vec<String>> {
    let mut lines = vec![
        "| router f32 matmul, 1 token | rows x cols | 16-byte loads us | first (scalar) us |"
            .to_string(),
        "|---|---|---:|---:|".to_string(),
    ];
    for (what, rows, cols) in [
        ("qwen3-30b-a3b router", 128usize, 2048usize),
        ("qwen3-next-80b-a3b router", 512, 2048),
        ("shared-expert gate", 1, 2048),
    ] {
        let wd = gpu.stream.clone_htod(&floats(rng, rows * cols, 0.1))?;
        let xd = gpu.stream.clone_htod(&floats(rng, cols, 1.0))?;
        let yd = gpu.stream.alloc_zeros::<f32>(rows)?;
        let a = moe::DenseArgs {
            w: ptr(gpu, &wd),
            x: ptr(gpu, &xd),
            y: ptr(gpu, &yd),
            nrows: rows as u32,
            cols: cols as u32,
        };
        let mut us = Vec::new();
        for name in [moe::DENSE_F32, moe::DENSE_F32_SCALAR] {
            let ms = time_launches(&gpu.stream, 5, 3, 20, |_| {
                launch_values(gpu, name, moe::dense_launch(rows, 1), &a.values())
            })?;
            us.push(ms * 1e3);
        }
        lines.push(format!(
            "| {what} | {rows} x {cols} | {:.1} | {:.1} |",
            us[0], us[1]
        ));
    }
    Ok(lines)
}

/// Every parity check of the hybrid kernels.
pub fn check(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    check_conv(gpu, rng, rep)?;
    check_norms(gpu, rng, rep)?;
    check_step(gpu, rng, rep)?;
    check_chunked(gpu, rng, rep)?;
    check_router(gpu, rng, rep)?;
    check_small(gpu, rng, rep)
}

/// The step kernel at Qwen3.6-27B's delta-net shape (16 key / 48 value heads of 128):
/// microseconds per layer for one decode token of 1 and 32 sequences and for a 512-token
/// prompt, and the state bytes read + written per second at decode.
pub fn perf(gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> Result<()> {
    let lines = speed(gpu, rng)?;
    rep.perf.extend(lines);
    rep.perf.push(String::new());
    let lines = router_speed(gpu, rng)?;
    rep.perf.extend(lines);
    Ok(())
}

/// The step and chunked kernels' lines of [`perf`].
fn speed(gpu: &Gpu, rng: &mut impl Rng) -> Result<Vec<String>> {
    let (s, hk, hv) = (128usize, 16usize, 48usize);
    let ch = (2 * hk + hv) * s;
    let mut lines = vec![
        "| delta step, 27B shape | tokens x seqs | us / layer | state GB/s |".to_string(),
        "|---|---|---:|---:|".to_string(),
    ];
    for (tokens, n_seqs) in [
        (1usize, 1usize),
        (1, 32),
        (64, 1),
        (128, 1),
        (256, 1),
        (512, 1),
        (512, 4),
    ] {
        let lens = vec![tokens; n_seqs];
        let n = tokens * n_seqs;
        let xd = gpu.stream.clone_htod(&floats(rng, n * ch, 0.05))?;
        let ald = gpu.stream.clone_htod(&floats(rng, n * hv, 1.0))?;
        let bed = gpu.stream.clone_htod(&floats(rng, n * hv, 1.0))?;
        let dtd = gpu.stream.clone_htod(&floats(rng, hv, 1.0))?;
        let ad = gpu.stream.clone_htod(&vec![-0.5f32; hv])?;
        let od = gpu.stream.alloc_zeros::<f32>(n * hv * s)?;
        let st = gpu.stream.alloc_zeros::<f32>(n_seqs * hv * s * s)?;
        let base = ptr(gpu, &st);
        let addrs: Vec<u64> = (0..n_seqs)
            .map(|i| base + (4 * i * hv * s * s) as u64)
            .collect();
        let addr_d = gpu.stream.clone_htod(&addrs)?;
        let dd = gpu.stream.clone_htod(&descs(&lens))?;
        let x = ptr(gpu, &xd);
        let args = dn::StepArgs {
            q: x,
            k: x + 4 * (hk * s) as u64,
            v: x + 8 * (hk * s) as u64,
            alpha: ptr(gpu, &ald),
            beta: ptr(gpu, &bed),
            dt_bias: ptr(gpu, &dtd),
            a: ptr(gpu, &ad),
            out: ptr(gpu, &od),
            states: ptr(gpu, &addr_d),
            seqs: ptr(gpu, &dd),
            h_k: hk as u32,
            h_v: hv as u32,
            grouped: 0,
            stride: ch as u32,
            state_off: 0,
        };
        let bytes = 2.0 * (n_seqs * hv * s * s * 4) as f64;
        for (what, name, launch) in [
            (
                "delta step",
                dn::step_name(s),
                dn::step_launch(s, hv, n_seqs),
            ),
            (
                "delta step, a block a head (run 1)",
                dn::step_head_name(s),
                dn::step_launch_rows(s, hv, n_seqs, s),
            ),
        ] {
            let ms = time_launches(&gpu.stream, 5, 3, 20, |_| {
                launch_values(gpu, name, launch, &args.values())
            })?;
            lines.push(format!(
                "| {what} | {tokens} x {n_seqs} | {:.1} | {:.0} |",
                ms * 1e3,
                bytes / (ms * 1e-3) / 1e9
            ));
        }
        if tokens > 1 {
            // The same prompt in chunks: both kernels, as the engine launches them.
            let scratch = gpu
                .stream
                .alloc_zeros::<f32>(dc::scratch_bytes(n_seqs, n, hv) / 4)?;
            let prep = dc::PrepArgs {
                q: x,
                k: x + 4 * (hk * s) as u64,
                alpha: args.alpha,
                beta: args.beta,
                dt_bias: args.dt_bias,
                a: args.a,
                scratch: ptr(gpu, &scratch),
                seqs: args.seqs,
                h_k: hk as u32,
                h_v: hv as u32,
                grouped: 0,
                stride: ch as u32,
            };
            let chunk = dc::ChunkArgs {
                q: x,
                k: args.k,
                v: args.v,
                alpha: args.alpha,
                beta: args.beta,
                dt_bias: args.dt_bias,
                a: args.a,
                scratch: ptr(gpu, &scratch),
                out: args.out,
                states: args.states,
                seqs: args.seqs,
                h_k: hk as u32,
                h_v: hv as u32,
                grouped: 0,
                stride: ch as u32,
                state_off: 0,
            };
            let chunks = tokens.div_ceil(dc::CHUNK);
            let one = |with_prep: bool, with_chunk: bool| {
                time_launches(&gpu.stream, 5, 3, 20, |_| {
                    if with_prep {
                        launch_values(
                            gpu,
                            dc::prep_name(s),
                            dc::prep_launch(hv, chunks, n_seqs),
                            &prep.values(),
                        )?;
                    }
                    if with_chunk {
                        launch_values(
                            gpu,
                            dc::chunk_name(s),
                            dc::chunk_launch(s, hv, n_seqs),
                            &chunk.values(),
                        )?;
                    }
                    Ok(())
                })
            };
            for (what, p, c) in [
                ("delta chunked (prep + chunks)", true, true),
                ("delta chunked, prep only", true, false),
                ("delta chunked, chunks only", false, true),
            ] {
                let ms = one(p, c)?;
                lines.push(format!(
                    "| {what} | {tokens} x {n_seqs} | {:.1} | {:.0} |",
                    ms * 1e3,
                    bytes / (ms * 1e-3) / 1e9
                ));
            }
        }
    }
    Ok(lines)
}
