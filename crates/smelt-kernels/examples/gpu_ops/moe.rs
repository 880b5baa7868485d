//! The mixture-of-experts ops against their CPU twins (`-o moe`; `bench/gpu/moe.sh` runs it
//! beside whole-model parity): each op goes through the backend as the model
//! calls it (`Backend::moe_route`, `matmul_id`, `moe_combine`, the router's f32 matmul), on
//! fresh random inputs, with outputs poisoned with NaN first, over ragged shapes (rows that
//! are not a multiple of a block's rows, one token and many, x per token and per slot, all
//! tokens routed to one expert so it gets many tiles, 16 to 512 experts).
//!
//! Twins and bars:
//! - router: the CPU backend's `moe::route` (ggml's order): the same expert ids, weights
//!   within 1e-5 relative (the GPU's `ex2.approx` against ggml's `expf`);
//! - expert matmuls: `smelt_kernels::gemv::cpu_with_magnitude` per slot on the q8_1 tiles
//!   of the same activations (`act::quantize_cpu`): each output within 1e-5 of the sum of
//!   its products' magnitudes (the GEMV check's bar);
//! - the grouped tensor-core GEMM (`gemm::grouped`, what prompts take): every Q4_K and Q6_K case
//!   again on a second backend opened with `moe_gemm_min_per_expert = 0` (so every step
//!   takes it), against `grouped::cpu_with_magnitude` on the f16 rows of the same
//!   activations (`gemm::f16::act_cpu`): within 1e-4 of the magnitudes (the f16 GEMM
//!   check's bar: f32 sums on the tensor cores against f64 sums);
//! - combine: the CPU backend's `moe::combine`, bit for bit;
//! - router matmul: an f64 dot, within 1e-5 of the magnitudes.
//!
//! - the whole MoE block (`model::moe::MoeFfn::forward`: router, route, paired gate/up,
//!   GLU, down, combine) on both backends from the same input, for a prompt (the planned,
//!   tiled path), a decode row and a small batch: the same experts for every token and
//!   the outputs within relative RMS 3e-2 for K-quants, 2e-3 for Q8_0 (the backends
//!   requantize the activations differently: ggml's Q8_0/Q8_K pairing on the CPU, q8_1 on
//!   the GPU; `block_bar`). A whole model's
//!   logits can still part more than that on a token whose router has a near-tie: a
//!   requantization difference upstream then picks another expert on one side.
//!
//! The MoE block runs on that second backend too (`moe block gemm`).
//!
//! These go through the engine's CUDA backend (opened twice: the engine's own choice, and
//! one that puts every expert matmul on the grouped GEMM), which loads its own module.
//! Perf: times one layer's expert matmuls (paired gate/up, then down) at
//! the Qwen3-30B-A3B shape for 32 to 1024 tokens on the grouped GEMV and on the grouped
//! GEMM, and prints a table of both (the data the engine's choice between them,
//! `gemm::grouped::MIN_PER_EXPERT`, is made from).

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;
use smelt_engine::backend::cpu::moe as cpu_moe;
use smelt_engine::backend::cuda::options::CudaOptions;
use smelt_engine::backend::cuda::{Cuda, CudaTensor};
use smelt_engine::backend::{Backend, Gating, MoeRouting};
use smelt_gguf::{GgmlType, Gguf, GgufWriter, Metadata, TensorSpec, Value};
use smelt_kernels::gemm::{f16 as gemm_f16, grouped};
use smelt_kernels::{act, gemv};

use super::harness::{want, Gpu, Report};

/// The router, the plan, the grouped GEMV (per type and tile), the grouped GEMM, the
/// combine and the router's f32 matmul.
pub const COVERS: &[&str] = &["moe_*", "gemm_f16_moe_*", "matmul_f32_rows"];

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A check file, its two expert tensors' ggml bytes and the router's weights.
type ExpertsFile = (Arc<Gguf>, [Vec<u8>; 2], Vec<f32>);

fn floats(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-scale..scale)).collect()
}

/// A GGUF (in memory) with two expert tensors `[ne][rows][cols]` of `ty` (up, gate) and
/// an F32 router `[ne][cols]`; also returns the expert tensors' ggml bytes.
fn experts_file(
    rng: &mut StdRng,
    ty: GgmlType,
    ne: usize,
    rows: usize,
    cols: usize,
) -> Res<ExpertsFile> {
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let mut quantized = || -> Res<Vec<u8>> {
        let mut bytes = vec![0u8; ne * rows * row_bytes];
        for dst in bytes.chunks_exact_mut(row_bytes) {
            let src = floats(rng, cols, 0.5);
            smelt_quant::quantize_row(ty, &src, dst)?;
        }
        Ok(bytes)
    };
    let (bytes, gate) = (quantized()?, quantized()?);
    let router = floats(rng, ne * cols, 0.2);
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("check".into()));
    let specs = vec![
        TensorSpec {
            name: "blk.0.ffn_up_exps.weight".into(),
            ty,
            shape: vec![cols as u64, rows as u64, ne as u64],
        },
        TensorSpec {
            name: "blk.0.ffn_gate_exps.weight".into(),
            ty,
            shape: vec![cols as u64, rows as u64, ne as u64],
        },
        TensorSpec {
            name: "blk.0.ffn_gate_inp.weight".into(),
            ty: GgmlType::F32,
            shape: vec![cols as u64, ne as u64],
        },
    ];
    let mut w = GgufWriter::new(Vec::new(), &md, specs)?;
    w.write_tensor("blk.0.ffn_up_exps.weight", &bytes)?;
    w.write_tensor("blk.0.ffn_gate_exps.weight", &gate)?;
    let rb: Vec<u8> = router.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.write_tensor("blk.0.ffn_gate_inp.weight", &rb)?;
    let file = w.finish()?;
    Ok((Arc::new(Gguf::from_bytes(file)?), [bytes, gate], router))
}

/// Largest `|got - want| / bound`, NaN anywhere makes it infinite.
fn worst_scaled(got: &[f32], want: &[f32], bound: impl Fn(usize) -> f64) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let mut w = 0f64;
    for (i, (&g, &e)) in got.iter().zip(want).enumerate() {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        let d = (g as f64 - e as f64).abs() / bound(i).max(1e-30);
        w = w.max(d);
    }
    w
}

/// A tensor of `rows x cols` NaNs on the device (a poisoned output).
fn poisoned(gpu: &Cuda, rows: usize, cols: usize) -> Res<CudaTensor> {
    Ok(gpu.upload(&vec![f32::NAN; rows * cols], rows, cols)?)
}

#[allow(clippy::too_many_arguments)]
fn check_case(
    gpu: &Cuda,
    rng: &mut StdRng,
    rep: &mut Report,
    ty: GgmlType,
    ne: usize,
    k: usize,
    n: usize,
    rows: usize,
    cols: usize,
    gating: Gating,
    skew: bool,
) -> Res<()> {
    let case = format!(
        "{ty:?} {ne}e k{k} n{n} {rows}x{cols} {gating:?}{}",
        if skew { " skewed" } else { "" }
    );
    let (gguf, ggml, router) = experts_file(rng, ty, ne, rows, cols)?;
    let we = gpu.load_experts(&gguf, "blk.0.ffn_up_exps.weight")?;
    let wg = gpu.load_experts(&gguf, "blk.0.ffn_gate_exps.weight")?;
    let wr = gpu.load_weight(&gguf, "blk.0.ffn_gate_inp.weight")?;
    let x = floats(rng, n * cols, 1.0);
    let xg = gpu.upload(&x, n, cols)?;
    // Router matmul.
    let mut logits = poisoned(gpu, n, ne)?;
    gpu.matmul(&wr, &xg, &mut logits)?;
    let lg = gpu.to_host(&logits);
    gpu.take_error()?;
    let want = smelt_kernels::moe::dense_cpu(&router, &x, ne, cols);
    let mag: Vec<f64> = (0..n * ne)
        .map(|i| {
            let (t, r) = (i / ne, i % ne);
            (0..cols)
                .map(|c| (router[r * cols + c] as f64 * x[t * cols + c] as f64).abs())
                .sum()
        })
        .collect();
    rep.add(
        "router matmul",
        case.clone(),
        worst_scaled(&lg, &want, |i| mag[i]),
        1e-5,
    );
    // Route (the skewed case feeds logits that send every token to experts 0..k).
    let mut lhost = lg.clone();
    if skew {
        for row in lhost.chunks_mut(ne) {
            for (e, v) in row.iter_mut().enumerate().take(k) {
                *v = 10.0 - e as f32;
            }
        }
    }
    let lgpu = gpu.upload(&lhost, n, ne)?;
    let p = MoeRouting {
        gating,
        k,
        norm: gating == Gating::Softmax,
        scale: if gating == Gating::Sigmoid { 2.5 } else { 0.0 },
    };
    let mut route = poisoned(gpu, n, 2 * k)?;
    gpu.moe_route(&lgpu, &p, &mut route)?;
    let rg = gpu.to_host(&route);
    let mut rc = vec![0f32; n * 2 * k];
    cpu_moe::route(&lhost, ne, &p, &mut rc);
    let ids_equal = rg
        .chunks(2 * k)
        .zip(rc.chunks(2 * k))
        .all(|(a, b)| a[..k] == b[..k]);
    let werr = if ids_equal {
        worst_scaled(&rg, &rc, |i| (rc[i].abs() as f64).max(1e-3))
    } else {
        f64::INFINITY
    };
    rep.add("route", case.clone(), werr, 1e-5);
    // Expert matmul, x per token (up and gate paired in one launch), then per slot (the
    // down projection's shape).
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let expert = |w: usize, e: usize| &ggml[w][e * rows * row_bytes..(e + 1) * rows * row_bytes];
    let ids: Vec<usize> = rg
        .chunks(2 * k)
        .flat_map(|r| r[..k].iter().map(|&v| v as usize).collect::<Vec<_>>())
        .collect();
    // Which kernel this backend runs the step's expert matmuls on.
    let on_gemm = grouped::name(ty).is_some()
        && grouped::preferred(n * k, ne, gpu.options().matmul.moe_gemm_min_per_expert);
    for per_slot in [false, true] {
        let xs = if per_slot {
            floats(rng, n * k * cols, 1.0)
        } else {
            x.clone()
        };
        let xrows = xs.len() / cols;
        let xsg = gpu.upload(&xs, xrows, cols)?;
        let mut out = poisoned(gpu, n * k, rows)?;
        let mut out2 = poisoned(gpu, n * k, rows)?;
        if per_slot {
            gpu.matmul_id(&we, &xsg, &route, &mut out)?;
        } else {
            gpu.matmul_id_pair([&we, &wg], &xsg, &route, [&mut out, &mut out2])?;
        }
        let og = gpu.to_host(&out);
        let og2 = gpu.to_host(&out2);
        gpu.take_error()?;
        let xq = act::quantize_cpu(&xs, cols)?;
        let qrow = act::row_bytes(cols)?;
        for (wi, got) in [(0, &og), (1, &og2)] {
            if per_slot && wi == 1 {
                continue;
            }
            let what = match (per_slot, wi) {
                (true, _) => " x/slot",
                (false, 0) => " pair up",
                _ => " pair gate",
            };
            if on_gemm {
                let xh = gemm_f16::act_cpu(&xs, cols)?;
                let ids32: Vec<u32> = ids.iter().map(|&e| e as u32).collect();
                let x_div = if per_slot { 1 } else { k };
                let (want, mag) =
                    grouped::cpu_with_magnitude(ty, &ggml[wi], ne, rows, cols, &xh, &ids32, x_div)?;
                rep.add(
                    "grouped gemm",
                    format!("{case}{what}"),
                    worst_scaled(got, &want, |i| mag[i] + want[i].abs() as f64 * 1e-7),
                    1e-4,
                );
                continue;
            }
            let mut want = vec![0f32; n * k * rows];
            let mut mag = vec![0f64; n * k * rows];
            for (s, &e) in ids.iter().enumerate() {
                let xr = if per_slot { s } else { s / k };
                let (y, m) = gemv::cpu_with_magnitude(
                    ty,
                    expert(wi, e),
                    rows,
                    cols,
                    &xq[xr * qrow..(xr + 1) * qrow],
                    1,
                )?;
                want[s * rows..(s + 1) * rows].copy_from_slice(&y);
                mag[s * rows..(s + 1) * rows].copy_from_slice(&m);
            }
            rep.add(
                "matmul_id",
                format!("{case}{what}"),
                worst_scaled(got, &want, |i| mag[i] + want[i].abs() as f64 * 1e-7),
                1e-5,
            );
        }
        if per_slot {
            // Combine of these outputs.
            let mut comb = poisoned(gpu, n, rows)?;
            gpu.moe_combine(&out, &route, &mut comb)?;
            let cg = gpu.to_host(&comb);
            gpu.take_error()?;
            let mut cc = vec![0f32; n * rows];
            cpu_moe::combine(&og, &rg, k, &mut cc);
            let same =
                cg.len() == cc.len() && cg.iter().zip(&cc).all(|(a, b)| a.to_bits() == b.to_bits());
            rep.add(
                "combine",
                case.clone(),
                if same { 0.0 } else { f64::INFINITY },
                0.0,
            );
        }
    }
    Ok(())
}

/// The bar on the relative RMS difference of the two backends' MoE block outputs. They
/// quantize the activations differently: the CPU pairs a K-quant weight with Q8_K rows
/// (one scale per 256 values), the GPU with q8_1 (one per 32), so for K-quants the outputs
/// differ by the CPU's coarser rounding: 1.4-1.9e-2 over 15 Q4_K cases on an H100
/// (2026-11-27), 2.13e-2 on one single-token case (256 values: the noisiest), against the
/// 2e-2 bar `moe_check` had with a fixed seed. A wiring fault (a wrong expert or weight, an
/// unwritten row) is O(1), so 3e-2 still catches one. Q8_0 rows are q8 blocks of 32 on both
/// sides: 2e-7 to 5e-5 there, bar 2e-3.
fn block_bar(ty: GgmlType) -> f64 {
    if ty.block_size() == 256 {
        3e-2
    } else {
        2e-3
    }
}

/// The whole MoE block on both backends: a layer with `ne` experts of `ff` x `e`, `k` per
/// token, from the same `n` input rows.
#[allow(clippy::too_many_arguments)]
fn check_block(
    gpu: &Cuda,
    op: &str,
    rng: &mut StdRng,
    rep: &mut Report,
    ty: GgmlType,
    ne: usize,
    k: usize,
    e: usize,
    ff: usize,
    ns: &[usize],
) -> Res<()> {
    use smelt_engine::backend::cpu::{Cpu, CpuTensor};
    use smelt_engine::model::moe::MoeFfn;
    use smelt_engine::model::MoeInfo;
    let quant = |rng: &mut StdRng, rows: usize, cols: usize| -> Res<Vec<u8>> {
        let rb = cols / ty.block_size() * ty.type_size();
        let mut bytes = vec![0u8; rows * rb];
        for dst in bytes.chunks_exact_mut(rb) {
            smelt_quant::quantize_row(ty, &floats(rng, cols, 0.1), dst)?;
        }
        Ok(bytes)
    };
    let up = quant(rng, ne * ff, e)?;
    let gate = quant(rng, ne * ff, e)?;
    let down = quant(rng, ne * e, ff)?;
    let router: Vec<u8> = floats(rng, ne * e, 0.3)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("check".into()));
    let spec = |name: &str, ty, shape: Vec<u64>| TensorSpec {
        name: name.into(),
        ty,
        shape,
    };
    let (e6, f6, n6) = (e as u64, ff as u64, ne as u64);
    let specs = vec![
        spec("blk.0.ffn_gate_inp.weight", GgmlType::F32, vec![e6, n6]),
        spec("blk.0.ffn_gate_exps.weight", ty, vec![e6, f6, n6]),
        spec("blk.0.ffn_up_exps.weight", ty, vec![e6, f6, n6]),
        spec("blk.0.ffn_down_exps.weight", ty, vec![f6, e6, n6]),
    ];
    let mut w = GgufWriter::new(Vec::new(), &md, specs)?;
    w.write_tensor("blk.0.ffn_gate_inp.weight", &router)?;
    w.write_tensor("blk.0.ffn_gate_exps.weight", &gate)?;
    w.write_tensor("blk.0.ffn_up_exps.weight", &up)?;
    w.write_tensor("blk.0.ffn_down_exps.weight", &down)?;
    let gguf = Arc::new(Gguf::from_bytes(w.finish()?)?);
    let info = MoeInfo {
        n_expert: ne,
        n_expert_used: k,
        n_ff_exp: ff,
        gating: Gating::Softmax,
        norm_weights: true,
        weights_scale: 0.0,
        n_ff_shared: 0,
    };
    let cpu = Cpu::GGML;
    let fc = MoeFfn::load(&cpu, &gguf, 0, e, &info)?;
    let fg = MoeFfn::load(gpu, &gguf, 0, e, &info)?;
    for &n in ns {
        let x = floats(rng, n * e, 1.0);
        let mut oc = cpu.alloc(n, e);
        fc.forward(
            &cpu,
            &CpuTensor {
                data: x.clone(),
                rows: n,
                cols: e,
            },
            &mut oc,
        )?;
        let xg = gpu.upload(&x, n, e)?;
        let mut og = poisoned(gpu, n, e)?;
        fg.forward(gpu, &xg, &mut og)?;
        let got = gpu.to_host(&og);
        gpu.take_error()?;
        let want = &oc.data;
        let (mut d2, mut w2) = (0f64, 0f64);
        for (a, b) in got.iter().zip(want) {
            d2 += (*a as f64 - *b as f64).powi(2);
            w2 += (*b as f64).powi(2);
        }
        let rel = if got.iter().all(|v| v.is_finite()) && got.len() == want.len() {
            (d2 / w2.max(1e-30)).sqrt()
        } else {
            f64::INFINITY
        };
        rep.add(
            op,
            format!("{ty:?} {ne}e k{k} {ff}x{e} n{n} (rel RMS)"),
            rel,
            block_bar(ty),
        );
    }
    Ok(())
}

/// One layer's expert matmuls at the Qwen3-30B-A3B shape (128 experts of 768 x 2048, 8 a
/// token; Q4_K; the same expert's bytes repeated, since speed does not depend on values):
/// for each token count, microseconds of the paired gate/up and the down projection
/// (activation conversion and plan included), on `gemv_gpu` and `gemm_gpu`.
fn speed(gemv_gpu: &Cuda, gemm_gpu: &Cuda, rng: &mut StdRng) -> Res<Vec<(usize, [f64; 2])>> {
    let (ty, ne, k, e, ff) = (GgmlType::Q4_K, 128usize, 8usize, 2048usize, 768usize);
    let one = |rng: &mut StdRng, rows: usize, cols: usize| -> Res<Vec<u8>> {
        let rb = cols / ty.block_size() * ty.type_size();
        let mut bytes = vec![0u8; rows * rb];
        for dst in bytes.chunks_exact_mut(rb) {
            smelt_quant::quantize_row(ty, &floats(rng, cols, 0.1), dst)?;
        }
        Ok(bytes.repeat(ne))
    };
    let (up, gate, down) = (one(rng, ff, e)?, one(rng, ff, e)?, one(rng, e, ff)?);
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("check".into()));
    let spec = |name: &str, shape: Vec<u64>| TensorSpec {
        name: name.into(),
        ty,
        shape,
    };
    let (e6, f6, n6) = (e as u64, ff as u64, ne as u64);
    let specs = vec![
        spec("blk.0.ffn_gate_exps.weight", vec![e6, f6, n6]),
        spec("blk.0.ffn_up_exps.weight", vec![e6, f6, n6]),
        spec("blk.0.ffn_down_exps.weight", vec![f6, e6, n6]),
    ];
    let mut w = GgufWriter::new(Vec::new(), &md, specs)?;
    w.write_tensor("blk.0.ffn_gate_exps.weight", &gate)?;
    w.write_tensor("blk.0.ffn_up_exps.weight", &up)?;
    w.write_tensor("blk.0.ffn_down_exps.weight", &down)?;
    let gguf = Arc::new(Gguf::from_bytes(w.finish()?)?);
    let p = MoeRouting {
        gating: Gating::Softmax,
        k,
        norm: true,
        scale: 0.0,
    };
    let mut rows = Vec::new();
    let loaded: Vec<_> = [gemv_gpu, gemm_gpu]
        .into_iter()
        .map(|g| -> Res<_> {
            Ok([
                g.load_experts(&gguf, "blk.0.ffn_up_exps.weight")?,
                g.load_experts(&gguf, "blk.0.ffn_gate_exps.weight")?,
                g.load_experts(&gguf, "blk.0.ffn_down_exps.weight")?,
            ])
        })
        .collect::<Res<_>>()?;
    for n in [32usize, 64, 128, 256, 512, 1024] {
        let x = floats(rng, n * e, 1.0);
        let xd = floats(rng, n * k * ff, 1.0);
        let logits = floats(rng, n * ne, 2.0);
        let mut us = [0f64; 2];
        for (j, g) in [gemv_gpu, gemm_gpu].into_iter().enumerate() {
            let [wu, wg, wd] = &loaded[j];
            let xg = g.upload(&x, n, e)?;
            let xdg = g.upload(&xd, n * k, ff)?;
            let lg = g.upload(&logits, n, ne)?;
            let mut route = g.alloc(n, 2 * k);
            g.moe_route(&lg, &p, &mut route)?;
            let (mut a, mut b, mut o) = (g.alloc(n * k, ff), g.alloc(n * k, ff), g.alloc(n * k, e));
            let mut layer = |g: &Cuda| -> Res<()> {
                g.matmul_id_pair([wu, wg], &xg, &route, [&mut a, &mut b])?;
                g.matmul_id(wd, &xdg, &route, &mut o)?;
                Ok(())
            };
            for _ in 0..3 {
                layer(g)?;
            }
            let _ = g.to_host(&route);
            g.take_error()?;
            let reps = 20;
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                layer(g)?;
            }
            let _ = g.to_host(&route);
            g.take_error()?;
            us[j] = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
        }
        println!(
            "speed n{n}: GEMV {:.1} us, GEMM {:.1} us a layer",
            us[0], us[1]
        );
        rows.push((n, us));
    }
    Ok(rows)
}

/// The engine's CUDA backend, with `min` as the grouped GEMM's least rows an expert.
fn open(min: Option<usize>) -> anyhow::Result<Cuda> {
    open_with(min, None)
}

/// [`open`], with the grouped GEMV's rows on at least `lanes` lanes.
fn open_with(min: Option<usize>, lanes: Option<u32>) -> anyhow::Result<Cuda> {
    let mut opts = CudaOptions::from_env(false);
    if let Some(m) = min {
        opts.matmul.moe_gemm_min_per_expert = m;
    }
    if lanes.is_some() {
        opts.matmul.moe_gemv_lanes = lanes;
    }
    Cuda::open_with(0, opts).map_err(|e| anyhow::anyhow!("CUDA backend: {e}"))
}

/// Every MoE op against its twin, and the whole block on both backends.
pub fn check(_gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> anyhow::Result<()> {
    // The engine's own choice, and one that puts every expert matmul on the grouped GEMM.
    let (gpu, ggpu) = (open(None)?, open(Some(0))?);
    // (type, experts, k, tokens, rows, cols, gating, skewed)
    let cases = [
        (GgmlType::Q4_K, 128, 8, 1, 768, 2048, Gating::Softmax, false),
        // Its down projection's shape (rows of three tiles: 16-lane groups), ragged rows.
        (GgmlType::Q4_K, 128, 8, 1, 2048, 768, Gating::Softmax, false),
        (GgmlType::Q6_K, 64, 8, 1, 200, 768, Gating::Softmax, false),
        (GgmlType::Q4_K, 128, 8, 7, 200, 512, Gating::Softmax, false),
        (GgmlType::Q4_K, 128, 8, 96, 264, 256, Gating::Softmax, false),
        (GgmlType::Q4_K, 16, 4, 40, 256, 256, Gating::Softmax, true),
        (GgmlType::Q6_K, 8, 2, 33, 136, 512, Gating::Softmax, false),
        (GgmlType::Q8_0, 16, 4, 5, 96, 320, Gating::Sigmoid, false),
        (GgmlType::Q5_K, 64, 6, 3, 72, 256, Gating::Softmax, false),
        (GgmlType::Q4_0, 512, 10, 2, 40, 256, Gating::Softmax, false),
        (GgmlType::Q8_0, 60, 4, 300, 64, 256, Gating::Sigmoid, true),
        // Prompt shapes (where the grouped GEMM is meant to take over): Qwen3-30B-A3B's
        // routing over ragged rows, and every token on two experts (three 128-slot tiles
        // each).
        (
            GgmlType::Q4_K,
            128,
            8,
            256,
            300,
            512,
            Gating::Softmax,
            false,
        ),
        (GgmlType::Q4_K, 8, 2, 300, 136, 768, Gating::Softmax, true),
        (GgmlType::Q6_K, 16, 4, 80, 136, 512, Gating::Softmax, false),
    ];
    let grouped_cases = cases.iter().filter(|c| grouped::name(c.0).is_some());
    // Rows of at most four tiles run on lane groups (`moe::row_lanes`); the whole-warp
    // rows they replaced, again, must meet the same bar.
    let wgpu = open_with(None, Some(32))?;
    let short_rows = cases.iter().filter(|c| c.5 <= 1024);
    let runs = cases
        .iter()
        .map(|c| (&gpu, c))
        .chain(grouped_cases.map(|c| (&ggpu, c)))
        .chain(short_rows.map(|c| (&wgpu, c)));
    for (g, &(ty, ne, k, n, rows, cols, gating, skew)) in runs {
        if !want(&format!("{ty:?} {ne}e k{k} n{n} {rows}x{cols}")) {
            continue;
        }
        if let Err(e) = check_case(g, rng, rep, ty, ne, k, n, rows, cols, gating, skew) {
            rep.error(&format!("moe {ty:?} {ne}e n{n}"), &anyhow::anyhow!("{e}"));
        }
    }
    for (g, op, ty, ne, k, e, ff) in [
        (&gpu, "moe block", GgmlType::Q8_0, 8, 2, 256, 256),
        (&gpu, "moe block", GgmlType::Q4_K, 16, 4, 256, 256),
        (&gpu, "moe block", GgmlType::Q4_K, 128, 8, 512, 256),
        (&ggpu, "moe block gemm", GgmlType::Q4_K, 16, 4, 256, 256),
        (&ggpu, "moe block gemm", GgmlType::Q4_K, 128, 8, 512, 256),
    ] {
        if !want(&format!("{op} {ty:?} {ne}e")) {
            continue;
        }
        if let Err(err) = check_block(g, op, rng, rep, ty, ne, k, e, ff, &[40, 1, 3, 200]) {
            rep.error(&format!("{op} {ty:?} {ne}e"), &anyhow::anyhow!("{err}"));
        }
    }
    Ok(())
}

/// One layer's expert matmuls at the Qwen3-30B-A3B shape on the grouped GEMV and GEMM.
pub fn perf(_gpu: &Gpu, rng: &mut StdRng, rep: &mut Report) -> anyhow::Result<()> {
    // The GEMV backend: every expert matmul on the grouped GEMV.
    let (gemv_gpu, ggpu) = (open(Some(usize::MAX))?, open(Some(0))?);
    let rows = speed(&gemv_gpu, &ggpu, rng).map_err(|e| anyhow::anyhow!("{e}"))?;
    rep.perf
        .push("MoE: one layer's expert matmuls, Qwen3-30B-A3B shape, Q4_K (us):".into());
    rep.perf
        .push("| tokens | slots an expert | grouped GEMV | grouped GEMM | GEMM / GEMV |".into());
    rep.perf.push("|---:|---:|---:|---:|---:|".into());
    for (n, [a, b]) in rows {
        rep.perf.push(format!(
            "| {n} | {:.0} | {a:.1} | {b:.1} | {:.2} |",
            (n * 8) as f64 / 128.0,
            b / a
        ));
    }
    Ok(())
}
