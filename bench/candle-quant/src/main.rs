//! Quantization throughput of one large F32 tensor: smelt-quant (all cores, and one core)
//! against candle-core's `QTensor::quantize`, with a byte comparison of the two.
//!
//! It also writes the input tensor and smelt's output for each type into `--out`, so
//! `bench/quant_ggml.py` can time ggml on the same floats and check smelt byte for byte;
//! `bench/quant.sh` runs both and prints the table.

mod data;
mod timing;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use smelt_quant::GgmlType;
use std::fmt::Write as _;
use std::path::PathBuf;

struct Args {
    out: PathBuf,
    rows: usize,
    cols: usize,
    runs: usize,
    seed: u64,
    /// File stems of the types to run (`q4_k,q6_k`), all of [`TYPES`] by default.
    types: Option<Vec<String>>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        out: PathBuf::from("out"),
        rows: 4096,
        cols: 14336,
        runs: 3,
        seed: 42,
        types: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag.as_str() {
            "--out" => args.out = PathBuf::from(value()?),
            "--rows" => args.rows = value()?.parse().context("--rows")?,
            "--cols" => args.cols = value()?.parse().context("--cols")?,
            "--runs" => args.runs = value()?.parse().context("--runs")?,
            "--seed" => args.seed = value()?.parse().context("--seed")?,
            "--types" => {
                args.types = Some(
                    value()?
                        .split(',')
                        .map(|t| t.trim().to_lowercase())
                        .collect(),
                )
            }
            "-h" | "--help" => {
                println!("usage: candle-quant [--out DIR] [--rows 4096] [--cols 14336] [--runs 3] [--seed 42] [--types q4_k,q6_k,q8_0]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (see --help)"),
        }
    }
    if let Some(unknown) = args
        .types
        .iter()
        .flatten()
        .find(|w| !TYPES.iter().any(|t| t.2 == w.as_str()))
    {
        bail!("unknown type {unknown} in --types (one of q4_k, q6_k, q8_0)");
    }
    Ok(args)
}

/// The types the benchmark covers, as each library names them, and the file stem used for
/// smelt's output.
const TYPES: [(GgmlType, GgmlDType, &str); 3] = [
    (GgmlType::Q4_K, GgmlDType::Q4K, "q4_k"),
    (GgmlType::Q6_K, GgmlDType::Q6K, "q6_k"),
    (GgmlType::Q8_0, GgmlDType::Q8_0, "q8_0"),
];

/// What differs between two quantized buffers, counted in blocks (the unit both libraries
/// write), or `None` when they are byte-identical.
fn diff_blocks(a: &[u8], b: &[u8], block_bytes: usize) -> Option<(usize, usize)> {
    if a == b {
        return None;
    }
    if a.len() != b.len() {
        return Some((0, usize::MAX));
    }
    let mut differing = a
        .chunks(block_bytes)
        .zip(b.chunks(block_bytes))
        .enumerate()
        .filter(|(_, (x, y))| x != y);
    let first = differing.next().map_or(0, |(i, _)| i);
    Some((first, 1 + differing.count()))
}

/// Runs smelt's quantizer, turning the `todo!()` of a format that has not landed yet into
/// an error, so the rest of the benchmark still runs.
fn smelt_quantize(
    ty: GgmlType,
    src: &[f32],
    cols: usize,
    threads: Option<usize>,
) -> Result<Vec<u8>> {
    std::panic::catch_unwind(|| smelt_quant::quantize_tensor(ty, src, cols, threads))
        .map_err(|_| anyhow!("smelt panicked quantizing {ty} (format not implemented yet?)"))?
        .map_err(Into::into)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    // One line per panic: a format still being written panics on every call, and
    // RUST_BACKTRACE would otherwise bury the results under backtraces.
    std::panic::set_hook(Box::new(|info| eprintln!("panic: {info}")));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;

    eprintln!(
        "data: {}x{} standard normals, seed {}",
        args.rows, args.cols, args.seed
    );
    let values = data::normals(args.rows * args.cols, args.seed);
    let input_name = format!("input-{}x{}-seed{}.f32", args.rows, args.cols, args.seed);
    data::write_f32(&args.out.join(&input_name), &values)?;
    let tensor = Tensor::from_slice(&values, (args.rows, args.cols), &Device::Cpu)?;

    let mut entries = Vec::new();
    let wanted = |stem: &str| {
        args.types
            .as_ref()
            .is_none_or(|t| t.iter().any(|w| w == stem))
    };
    for (ty, dtype, stem) in TYPES.into_iter().filter(|t| wanted(t.2)) {
        let name = ty.to_string().to_uppercase();
        eprintln!("{name}: candle ...");
        let (candle_ms, candle_q) =
            timing::best_of(args.runs, || QTensor::quantize(&tensor, dtype));
        let candle_q = candle_q?;
        let candle_bytes = candle_q.data()?;

        eprintln!("{name}: smelt, {threads} threads ...");
        // One row first: a format that has not landed yet fails here once, not per chunk.
        let (smelt_ms, smelt_out) =
            match smelt_quantize(ty, &values[..args.cols], args.cols, Some(1)) {
                Ok(_) => {
                    timing::best_of(args.runs, || smelt_quantize(ty, &values, args.cols, None))
                }
                Err(e) => (f64::NAN, Err(e)),
            };
        let mut entry = format!("{{\"type\": \"{name}\", \"candle_ms\": {candle_ms:.3}");
        match smelt_out {
            Err(e) => {
                eprintln!("{name}: {e:#}");
                write!(
                    entry,
                    ", \"smelt_error\": \"{}\"",
                    format!("{e:#}").replace('"', "'")
                )?;
            }
            Ok(smelt_bytes) => {
                eprintln!("{name}: smelt, 1 thread ...");
                let (smelt_1t_ms, _) = timing::best_of(args.runs, || {
                    smelt_quantize(ty, &values, args.cols, Some(1))
                });
                let file = format!("smelt-{stem}.bin");
                std::fs::write(args.out.join(&file), &smelt_bytes)
                    .with_context(|| format!("writing {}", args.out.join(&file).display()))?;
                let diff = diff_blocks(&smelt_bytes, &candle_bytes, ty.type_size());
                if let Some((first, count)) = diff {
                    eprintln!(
                        "{name}: smelt and candle differ in {count} blocks, first at block {first}"
                    );
                }
                write!(
                    entry,
                    ", \"smelt_ms\": {smelt_ms:.3}, \"smelt_1t_ms\": {smelt_1t_ms:.3}, \"smelt_file\": \"{file}\", \
                     \"smelt_eq_candle\": {}, \"blocks_differing_from_candle\": {}, \"first_block_differing_from_candle\": {}",
                    diff.is_none(),
                    diff.map_or(0, |d| d.1),
                    diff.map_or_else(|| "null".into(), |d| d.0.to_string()),
                )?;
            }
        }
        entry.push('}');
        eprintln!("{entry}");
        entries.push(entry);
    }

    let json = format!(
        "{{\"rows\": {}, \"cols\": {}, \"seed\": {}, \"runs\": {}, \"threads\": {threads}, \"input\": \"{input_name}\", \
         \"types\": [\n  {}\n]}}\n",
        args.rows,
        args.cols,
        args.seed,
        args.runs,
        entries.join(",\n  ")
    );
    let path = args.out.join("rust.json");
    std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::diff_blocks;

    #[test]
    fn diff_blocks_counts_whole_blocks() {
        let a = [0u8; 12];
        let mut b = a;
        assert_eq!(diff_blocks(&a, &b, 4), None);
        b[5] = 1;
        b[11] = 1;
        assert_eq!(diff_blocks(&a, &b, 4), Some((1, 2)));
        assert_eq!(diff_blocks(&a, &b[..8], 4), Some((0, usize::MAX)));
    }
}
