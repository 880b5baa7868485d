//! `smelt serve`: a placeholder until the serving issue lands.
//!
//! It accepts the flags the server will take, so scripts and the README can already use
//! them, says it is not there yet, and exits with status 0: the README's set-up command
//! runs cleanly instead of looking like a crash.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF model to serve (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long, short = 'm', value_name = "GGUF")]
    pub model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: String,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    let model = args.model.as_ref().map_or_else(
        || "the embedded SmolLM2-135M-Instruct".to_string(),
        |m| m.display().to_string(),
    );
    println!(
        "smelt serve: not yet: the server lands with the serving issue (would serve {model} on {})",
        args.addr
    );
    Ok(())
}
