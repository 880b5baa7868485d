//! `smelt perplexity`: how well a model predicts a text, by llama.cpp's method so the two
//! numbers compare: the text is cut into non-overlapping windows of `--ctx` tokens, each run
//! from an empty cache (its first token replaced by BOS when the model adds one), and only
//! the second half of each window is scored, so every scored token has at least ctx/2
//! tokens of context.

use anyhow::{bail, Context, Result};
use clap::Args;
use smelt_engine::sampler::log_prob;
use smelt_engine::{Logits, SeqInput};
use std::path::PathBuf;
use std::time::Instant;

use super::model_ref;

/// Logit rows computed per forward while scoring: a row is n_vocab floats (1 MiB for a
/// 262k vocabulary), so a window's second half at once would be hundreds of MiB.
const SCORE_CHUNK: usize = 64;
/// Prompt tokens per forward for the unscored first half.
const PREFILL_CHUNK: usize = 512;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[arg(long, short = 'm', value_name = "MODEL", default_value = model_ref::DEFAULT_MODEL,
          help = model_ref::MODEL_HELP)]
    pub model: String,
    /// The text to score (UTF-8).
    #[arg(long)]
    pub file: PathBuf,
    /// Tokens per window; the text needs at least two windows.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    #[arg(long, default_value = "cpu", help = model_ref::DEVICE_HELP)]
    pub device: String,
    #[arg(long, value_name = "N", help = model_ref::THREADS_HELP)]
    pub threads: Option<usize>,
    /// Also write each window as a JSON line: its token ids (BOS in front as scored) and
    /// every scored position's log-probability (`{"window", "tokens", "scored": [[pos,
    /// logprob], ...]}`), to compare with other scorers (the server's `echo` + `logprobs`)
    /// [default: none]
    #[arg(long, value_name = "FILE")]
    pub per_token: Option<PathBuf>,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    if args.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {} as UTF-8 text", args.file.display()))?;
    let mut m = model_ref::load(&args.model, &args.device, args.threads, args.ctx)?;
    let tokens = m.tokenizer.encode(&text, true, false);
    let bos = m.tokenizer.bos();
    // The model adds BOS when tokenizing with special tokens gave one more token up front.
    let add_bos = bos.is_some()
        && tokens.first().copied() == bos
        && m.tokenizer.encode(&text, false, false).len() < tokens.len();
    let n_ctx = args.ctx;
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} has {} tokens; perplexity needs at least 2 x --ctx = {} (use a smaller --ctx)",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let n_chunk = tokens.len() / n_ctx;
    let first = n_ctx / 2;
    eprintln!(
        "perplexity: {} tokens, {n_chunk} windows of {n_ctx}, scoring the last {} of each",
        tokens.len(),
        n_ctx - 1 - first
    );
    let started = Instant::now();
    let mut per_token = match &args.per_token {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let (mut nll, mut count) = (0.0f64, 0usize);
    for i in 0..n_chunk {
        let mut window = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let (true, Some(b)) = (add_bos, bos) {
            window[0] = b;
        }
        let seq = m.engine.new_sequence();
        let scored = score_window(&mut m.engine, seq, &window, first);
        m.engine.free_sequence(seq);
        let scored = scored?;
        nll -= scored.iter().map(|&(_, lp)| lp).sum::<f64>();
        count += scored.len();
        if let Some(w) = per_token.as_mut() {
            use std::io::Write;
            let line = serde_json::json!({"window": i, "tokens": window, "scored": scored});
            writeln!(w, "{line}").context("cannot write --per-token")?;
        }
        eprintln!(
            "[{}/{n_chunk}] {:.4} ({:.1} s)",
            i + 1,
            (nll / count as f64).exp(),
            started.elapsed().as_secs_f64()
        );
    }
    if let Some(mut w) = per_token {
        use std::io::Write;
        w.flush().context("cannot write --per-token")?;
    }
    println!("perplexity: {:.4}", (nll / count as f64).exp());
    Ok(())
}

/// The log-likelihood of each token of `window[first+1..]` given what precedes it, as
/// (position, log-probability).
fn score_window(
    engine: &mut smelt_engine::Engine,
    seq: smelt_engine::SeqId,
    window: &[u32],
    first: usize,
) -> Result<Vec<(usize, f64)>> {
    for part in window[..first].chunks(PREFILL_CHUNK) {
        engine.forward(&[SeqInput {
            seq,
            tokens: part.to_vec(),
            logits: Logits::None,
        }])?;
    }
    let mut scored = Vec::with_capacity(window.len() - first);
    let mut pos = first;
    for part in window[first..].chunks(SCORE_CHUNK) {
        let rows = engine
            .forward(&[SeqInput {
                seq,
                tokens: part.to_vec(),
                logits: Logits::All,
            }])?
            .pop()
            .unwrap_or_default();
        for row in rows {
            // The row at `pos` predicts the token at `pos + 1`; the window's last row has
            // nothing to predict.
            if let Some(&next) = window.get(pos + 1) {
                scored.push((pos + 1, log_prob(&row, next as usize)));
            }
            pos += 1;
        }
    }
    Ok(scored)
}
