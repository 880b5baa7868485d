//! `smelt run`: generate from one prompt (or a file of prompts), streaming the text. The
//! prompt goes through the model's chat template when the model has one (an instruct model
//! answers a question rather than continuing it); `--raw` gives plain completion.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use smelt_engine::generate::{generate, GenerateParams, Generation, DEFAULT_PREFILL_CHUNK};
use smelt_engine::sampler::SamplingParams;
use smelt_engine::GpuMemory;
use smelt_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use std::io::Write as _;
use std::path::PathBuf;

use super::model_ref;

/// How tokens are picked; shared with `smelt chat`.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 or less: greedy (the most likely token every time).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: the most likely tokens up to this probability (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Make tokens seen in the last --penalty-last-n less likely by this factor, as
    /// llama.cpp does (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every token seen in the last --penalty-last-n
    /// (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times its count from the logit of every token seen in the last
    /// --penalty-last-n (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// How many of the latest tokens the penalties look at.
    #[arg(long, default_value_t = 64)]
    pub penalty_last_n: usize,
    /// Seed of the sampler's random numbers: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed,
        }
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[arg(long, short = 'm', value_name = "MODEL", default_value = model_ref::DEFAULT_MODEL,
          help = model_ref::MODEL_HELP)]
    pub model: String,
    /// Quantize the weights as they load (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k ... q6_k, or a
    /// llama.cpp preset such as q4_k_m), with `smelt quantize`'s per-tensor rules
    /// [default: none: the weights as stored]
    #[arg(long, value_name = "TYPE")]
    pub isq: Option<String>,
    /// The prompt text (this, --prompt-ids or --prompts-file is required).
    #[arg(
        long,
        required_unless_present_any = ["prompts_file", "prompt_ids"],
        conflicts_with_all = ["prompts_file", "prompt_ids"]
    )]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated, used as they are (benchmarks, tests;
    /// no chat template) [default: none: --prompt is tokenized]
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["prompts_file", "chat", "system"])]
    pub prompt_ids: Option<Vec<u32>>,
    /// Many prompts, one JSON string per line, each generated from a fresh sequence; prints
    /// one JSON object per prompt (implies --json). Loads the model once for all of them
    /// [default: none: one --prompt]
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop before this text (repeatable); it is not printed.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Plain completion: the prompt as it is, without the chat template (what a model
    /// without a template always gets).
    #[arg(long, conflicts_with_all = ["chat", "system"])]
    pub raw: bool,
    /// Wrap the prompt as one user message in a chat template even when the model has none
    /// (llama.cpp's built-in format for its architecture). A model with one uses it anyway.
    #[arg(long)]
    pub chat: bool,
    /// A system message before the prompt, through the chat template [default: none, or
    /// the template's own]
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value = "cpu", help = model_ref::DEVICE_HELP)]
    pub device: String,
    #[arg(long, value_name = "N", help = model_ref::THREADS_HELP)]
    pub threads: Option<usize>,
    #[arg(long, value_name = "N", help = model_ref::TP_HELP)]
    pub tp: Option<usize>,
    /// KV cache room in tokens (prompt plus generation).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Most prompt tokens in one step (llama.cpp's n_ubatch): a longer prompt is fed in
    /// chunks, so activation memory depends on this, not on the prompt's length.
    #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub ubatch: usize,
    /// On a GPU, the KV cache fills this fraction of its memory after the weights and one
    /// step's activations, holding at least --ctx tokens (vLLM's gpu_memory_utilization)
    /// [default: it holds exactly --ctx]. The CPU ignores it
    #[arg(long, value_name = "FRACTION")]
    pub gpu_memory: Option<GpuMemory>,
    #[arg(long, help = model_ref::BATCH_INVARIANT_HELP)]
    pub batch_invariant: bool,
    /// After the text, print one JSON object on the last line: prompt_tokens, tokens, text,
    /// finish_reason, timings.
    #[arg(long)]
    pub json: bool,
    /// Generate exactly --max-tokens, past end-of-generation tokens (benchmarks).
    #[arg(long)]
    pub ignore_eog: bool,
}

pub fn run(args: &RunArgs) -> Result<()> {
    if args.ubatch == 0 {
        bail!("--ubatch must be at least 1");
    }
    let kv = model_ref::KvArgs {
        tokens: args.ctx,
        gpu_memory: args.gpu_memory,
        batch_invariant: args.batch_invariant,
        step_tokens: args.ubatch,
        tp: args.tp,
    };
    let mut m = model_ref::load_kv(
        &args.model,
        &args.device,
        args.threads,
        &kv,
        args.isq.as_deref(),
    )?;
    let templated = !args.raw
        && args.prompt_ids.is_none()
        && (args.chat || args.system.is_some() || has_template(&m));
    let template = if templated {
        Some(
            ChatTemplate::from_gguf(m.engine.gguf().metadata(), &m.tokenizer)
                .context("the model's chat template")?,
        )
    } else {
        None
    };
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        stop: args.stop.clone(),
        sampling: args.sampling.params(),
        ignore_eog: args.ignore_eog,
        prefill_chunk: args.ubatch,
        ..GenerateParams::default()
    };
    let prompts = match &args.prompts_file {
        Some(f) => read_prompts(f)?,
        None => vec![args.prompt.clone().unwrap_or_default()],
    };
    let batch = args.prompts_file.is_some();
    let mut stdout = std::io::stdout().lock();
    for text in &prompts {
        let prompt_text = match &template {
            Some(t) => render_chat(t, args.system.as_deref(), text)?,
            None => text.clone(),
        };
        let ids = match &args.prompt_ids {
            Some(ids) => ids.clone(),
            None => tokenize_prompt(&m.tokenizer, &prompt_text, templated),
        };
        if ids.is_empty() {
            bail!("the prompt tokenizes to nothing: give some text");
        }
        let seq = m.engine.new_sequence();
        let mut write_err = None;
        let result = generate(&mut m.engine, seq, &[], &ids, &m.tokenizer, &params, |d| {
            if !batch && write_err.is_none() {
                if let Err(e) = stdout.write_all(d.as_bytes()).and_then(|()| stdout.flush()) {
                    write_err = Some(e);
                }
            }
        });
        m.engine.free_sequence(seq);
        if let Some(e) = write_err {
            return Err(e.into());
        }
        let g = result.with_context(|| format!("generation failed on {}", m.path.display()))?;
        if smelt_cuda::GpuOptions::from_env().load_log {
            eprintln!(
                "smelt: {} tokens generated {:.2} s after launch (prompt {:.1} ms, decode {:.1} ms)",
                g.tokens.len(),
                crate::started().elapsed().as_secs_f64(),
                g.timings.prompt.as_secs_f64() * 1e3,
                g.timings.decode.as_secs_f64() * 1e3
            );
        }
        if !batch {
            writeln!(stdout)?;
        }
        if args.json || batch {
            writeln!(stdout, "{}", to_json(&ids, &prompt_text, &g))?;
        } else {
            eprintln!("{}", summary(&g));
        }
    }
    Ok(())
}

/// Whether the model's GGUF carries a chat template of its own.
fn has_template(m: &model_ref::Loaded) -> bool {
    m.engine
        .gguf()
        .metadata()
        .get_str("tokenizer.chat_template")
        .is_some()
}

/// One user message (after an optional system one), rendered to end where the assistant's
/// answer starts.
pub fn render_chat(t: &ChatTemplate, system: Option<&str>, user: &str) -> Result<String> {
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(ChatMessage {
            role: "system".into(),
            content: s.into(),
        });
    }
    msgs.push(ChatMessage {
        role: "user".into(),
        content: user.into(),
    });
    Ok(t.render(&msgs, true)?)
}

/// llama.cpp's tokenization of a prompt: BOS as the GGUF says; a chat prompt has its
/// special tokens parsed, and keeps one BOS when the template already wrote its text (as
/// llama.cpp's chat path does).
pub fn tokenize_prompt(tok: &Tokenizer, text: &str, chat: bool) -> Vec<u32> {
    let mut ids = tok.encode(text, true, chat);
    if chat {
        if let Some(bos) = tok.bos() {
            if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
    }
    ids
}

fn read_prompts(path: &PathBuf) -> Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<String>(l).with_context(|| {
                format!("{} line {}: expected a JSON string", path.display(), i + 1)
            })
        })
        .collect()
}

fn to_json(prompt: &[u32], prompt_text: &str, g: &Generation) -> String {
    let t = &g.timings;
    json!({
        "prompt_tokens": prompt,
        "prompt_text": prompt_text,
        "tokens": g.tokens,
        "text": g.text,
        "finish_reason": g.finish_reason.as_str(),
        "timings": {
            "prompt_n": t.prompt_tokens,
            "prompt_ms": t.prompt.as_secs_f64() * 1e3,
            "prompt_tokens_per_s": t.prompt_tokens_per_s(),
            "decode_n": t.decode_tokens,
            "decode_ms": t.decode.as_secs_f64() * 1e3,
            "decode_tokens_per_s": t.decode_tokens_per_s(),
        },
    })
    .to_string()
}

pub fn summary(g: &Generation) -> String {
    let t = &g.timings;
    format!(
        "[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, finish: {}]",
        t.prompt_tokens,
        t.prompt_tokens_per_s(),
        g.tokens.len(),
        t.decode_tokens_per_s(),
        g.finish_reason.as_str()
    )
}
