//! The `smelt` command line.

mod commands;
mod fmt;
mod output;
mod plan;
mod progress;
mod shapes;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use commands::{bench, chat, gateway, inspect, perplexity, quantize, run, serve, synth};
use std::io::IsTerminal;
use std::process::ExitCode;

/// smelt: a Rust LLM inference server for GGUF models.
#[derive(Parser, Debug)]
#[command(name = "smelt", about, long_about = None)]
struct Cli {
    /// How log lines look on stderr: text (coloured only on a terminal) or json (one object
    /// a line, for log collectors). RUST_LOG picks the level (default: info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
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
    /// One OpenAI endpoint in front of many `smelt serve` nodes: routing by model, loading
    /// on demand, LRU eviction with pins, failover.
    Gateway(gateway::GatewayArgs),
}

/// What `smelt --version` says: the version, the commit it was built from (when built from a
/// git checkout), and the GPU kernels in the binary.
fn version() -> String {
    let commit = match (env!("SMELT_GIT_COMMIT"), env!("SMELT_GIT_DATE")) {
        ("", _) => "commit unknown: built outside git".to_string(),
        (c, d) => format!("commit {c}, {d}"),
    };
    let gemv: Vec<String> = smelt_kernels::catalog::GEMV_TYPES
        .iter()
        .map(|t| t.name().to_ascii_lowercase())
        .collect();
    format!(
        "{} ({commit})\nGPU kernels: {} CUDA kernels, emitted as PTX for sm_80 and sm_90 at first use \
         and compiled by the NVIDIA driver (no CUDA toolkit); GEMVs for {}",
        env!("CARGO_PKG_VERSION"),
        smelt_kernels::catalog::all().len(),
        gemv.join(" ")
    )
}

/// Log lines on stderr, as `--log-format` says; colour only when stderr is a terminal (and
/// `NO_COLOR` is unset), so a log written to a file has no escape codes.
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .try_init(),
    };
}

/// When this process started (its first instruction of `main`): load timings count from it.
pub(crate) fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

fn main() -> ExitCode {
    started();
    let v = version();
    let matches = Cli::command()
        .version(v.clone())
        .long_version(v)
        .get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    init_logging(cli.log_format);
    let result = match &cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Gateway(a) => gateway::run(a),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every option of every command says what it does, and one that takes a value without
    /// a default says what happens without it.
    #[test]
    fn every_flag_has_help_and_its_default() {
        let mut cli = Cli::command();
        // Built, so each argument knows how many values it takes.
        cli.build();
        let mut missing = Vec::new();
        let mut checked = 0;
        for sub in cli.get_subcommands() {
            for a in sub.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = a
                    .get_help()
                    .or(a.get_long_help())
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                let name = format!("{} --{}", sub.get_name(), id);
                if help.trim().is_empty() {
                    missing.push(format!("{name}: no help"));
                    continue;
                }
                let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
                let flag_only = matches!(
                    a.get_action(),
                    clap::ArgAction::SetTrue | clap::ArgAction::Count
                );
                let says_default = !a.get_default_values().is_empty()
                    || help.contains("default")
                    || help.contains("required")
                    || help.to_lowercase().contains("without it")
                    || a.is_required_set()
                    || matches!(a.get_action(), clap::ArgAction::Append);
                if takes_value && !flag_only {
                    checked += 1;
                    if !says_default {
                        missing.push(format!("{name}: no default in {help:?}"));
                    }
                }
            }
        }
        assert!(checked > 50, "only {checked} options take a value");
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// Every command that runs or reads a model takes `-m`/`--model` with the same
    /// reference (here an alias) and, without it, the same default model.
    #[test]
    fn every_model_command_takes_the_same_model_reference() {
        use commands::model_ref::DEFAULT_MODEL;
        let model_of = |args: &[&str]| -> String {
            let cli = Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            match cli.command {
                Command::Run(a) => a.model,
                Command::Chat(a) => a.model,
                Command::Perplexity(a) => a.model,
                Command::Bench(a) => a.model,
                Command::Serve(a) => a.model.first().cloned().unwrap_or(DEFAULT_MODEL.into()),
                Command::Inspect(a) => a.model.or(a.file).unwrap_or(DEFAULT_MODEL.into()),
                other => panic!("not a model command: {other:?}"),
            }
        };
        for (cmd, extra) in [
            ("run", &["--prompt", "x"][..]),
            ("chat", &[][..]),
            ("perplexity", &["--file", "f.txt"][..]),
            ("bench", &[][..]),
            ("serve", &[][..]),
            ("inspect", &[][..]),
        ] {
            for flag in ["-m", "--model"] {
                let args: Vec<&str> = ["smelt", cmd, flag, "gemma3-270m"]
                    .into_iter()
                    .chain(extra.iter().copied())
                    .collect();
                assert_eq!(model_of(&args), "gemma3-270m", "{args:?}");
            }
            let args: Vec<&str> = ["smelt", cmd]
                .into_iter()
                .chain(extra.iter().copied())
                .collect();
            assert_eq!(model_of(&args), DEFAULT_MODEL, "{args:?}");
        }
    }

    #[test]
    fn the_version_names_the_build_and_the_gpu_kernels() {
        let v = version();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        assert!(v.contains("commit "), "{v}");
        assert!(v.contains("GPU kernels:") && v.contains("q4_k"), "{v}");
    }
}
