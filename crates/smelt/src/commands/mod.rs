//! One module per subcommand.

pub mod bench;
pub mod chat;
pub mod gateway;
pub mod inspect;
pub mod isq;
pub mod model_ref;
pub mod perplexity;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod serve_limits;
pub mod synth;

/// Sizes rayon's global pool (all cores when `None`). Every parallel step splits work by
/// rows or fixed chunks, so the thread count never changes an output byte.
pub fn use_threads(n: Option<usize>) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(n) = n {
        anyhow::ensure!(n > 0, "--threads must be at least 1");
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot start the thread pool")?;
    }
    Ok(())
}
