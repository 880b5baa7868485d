//! `smelt chat`: an interactive conversation in the terminal, streamed as it is generated.
//!
//! Each turn re-renders the whole conversation through the chat template (templates may
//! change earlier text when a message is added, so appending tokens by hand would drift from
//! what the model was trained on). When the new prompt's tokens extend what the KV cache
//! already holds, only the new tokens are computed; otherwise the sequence starts over.

use anyhow::{Context, Result};
use clap::Args;
use smelt_engine::generate::{generate, GenerateParams};
use smelt_engine::{Engine, SeqId};
use smelt_tokenizer::{ChatMessage, ChatTemplate};
use std::io::{BufRead, Write};

use super::model_ref;
use super::run::{summary, tokenize_prompt, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// A GGUF path, a Hugging Face model folder, or an alias (smollm2-135m, gemma3-270m).
    #[arg(long)]
    pub model: String,
    /// Quantize the weights as they load (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k ... q6_k, or a
    /// llama.cpp preset such as q4_k_m), with `smelt quantize`'s per-tensor rules.
    #[arg(long, value_name = "TYPE")]
    pub isq: Option<String>,
    /// A system message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// The most tokens one answer may take.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// auto (the GPU when one is usable, and says so), cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV cache room in tokens: the whole conversation must fit.
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Print prompt and generation speeds after each answer.
    #[arg(long)]
    pub verbose: bool,
}

/// The conversation's sequence and the tokens its KV cache holds.
struct Session {
    seq: SeqId,
    cached: Vec<u32>,
}

impl Session {
    fn new(engine: &mut Engine) -> Session {
        Session {
            seq: engine.new_sequence(),
            cached: Vec::new(),
        }
    }

    fn reset(&mut self, engine: &mut Engine) {
        engine.free_sequence(self.seq);
        *self = Session::new(engine);
    }
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let mut m = model_ref::load_isq(
        &args.model,
        &args.device,
        args.threads,
        args.ctx,
        args.isq.as_deref(),
    )?;
    let template = ChatTemplate::from_gguf(m.engine.gguf().metadata(), &m.tokenizer)
        .context("the model's chat template")?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: args.sampling.params(),
        ..GenerateParams::default()
    };
    let fresh = || -> Vec<ChatMessage> {
        args.system
            .iter()
            .map(|s| ChatMessage {
                role: "system".into(),
                content: s.clone(),
            })
            .collect()
    };
    let mut messages = fresh();
    let mut session = Session::new(&mut m.engine);
    eprintln!(
        "smelt chat with {} ({}): /reset starts over, /exit or Ctrl-D ends",
        m.path.display(),
        m.engine.info().arch.name()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut stdout = std::io::stdout();
    loop {
        write!(stdout, "> ")?;
        stdout.flush()?;
        let Some(line) = lines.next() else {
            writeln!(stdout)?;
            break;
        };
        let line = line.context("cannot read the terminal")?;
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = fresh();
                session.reset(&mut m.engine);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: input.to_string(),
        });
        let prompt = template.render(&messages, true)?;
        let ids = tokenize_prompt(&m.tokenizer, &prompt, true);
        // Reuse the cached prefix only when the new prompt strictly extends it.
        if !(ids.len() > session.cached.len() && ids.starts_with(&session.cached)) {
            session.reset(&mut m.engine);
        }
        let reused = session.cached.len();
        let new = ids[reused..].to_vec();
        let mut write_err = None;
        let result = generate(
            &mut m.engine,
            session.seq,
            &session.cached,
            &new,
            &m.tokenizer,
            &params,
            |d| {
                if write_err.is_none() {
                    if let Err(e) = stdout.write_all(d.as_bytes()).and_then(|()| stdout.flush()) {
                        write_err = Some(e);
                    }
                }
            },
        );
        if let Some(e) = write_err {
            return Err(e.into());
        }
        writeln!(stdout)?;
        let g = match result {
            Ok(g) => g,
            Err(e) => {
                // A full context is the usual cause: say so and let the user go on.
                eprintln!("error: {e} (try /reset)");
                messages.pop();
                session.reset(&mut m.engine);
                continue;
            }
        };
        if args.verbose {
            eprintln!("{} [{reused} tokens reused from the cache]", summary(&g));
        }
        // The KV holds the prompt and every generated token but the last.
        session.cached = ids;
        session
            .cached
            .extend_from_slice(&g.tokens[..g.tokens.len().saturating_sub(1)]);
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: g.text,
        });
    }
    Ok(())
}
