//! The `smelt` command line.

mod commands;
mod fmt;
mod output;
mod plan;
mod progress;
mod shapes;

use clap::{Parser, Subcommand};
use commands::{bench, chat, inspect, perplexity, quantize, run, serve, synth};
use std::process::ExitCode;

/// smelt: a Rust LLM inference server for GGUF models.
#[derive(Parser, Debug)]
#[command(name = "smelt", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show a GGUF file's metadata, tensor table and totals.
    Inspect(inspect::InspectArgs),
    /// Rewrite a GGUF in another format or a llama.cpp mixture (q4_k_m ...).
    Quantize(quantize::QuantizeArgs),
    /// Write a random-weight GGUF of a real model's shape, for speed tests.
    Synth(synth::SynthArgs),
    /// Generate text from a prompt (streamed; --json for one object with ids and timings).
    Run(run::RunArgs),
    /// Talk with a model in the terminal; the conversation is kept until /reset.
    Chat(chat::ChatArgs),
    /// Score a text file with llama.cpp's perplexity method.
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt and decode tokens/s of a model (or GEMV bandwidth with --kernels).
    Bench(bench::BenchArgs),
    /// Serve models over an OpenAI-compatible API (continuous batching, SSE, metrics).
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Perplexity(a) => perplexity::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A closed pipe (`smelt inspect big.gguf | head`) is the reader's choice, not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // The chain of causes says what failed and why; a backtrace would only hide it.
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}
