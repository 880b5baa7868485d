//! `smelt chat`: an interactive conversation in the terminal, streamed as it is generated.
//!
//! Each turn re-renders the whole conversation through the chat template (templates may
//! change earlier text when a message is added, so appending tokens by hand would drift from
//! what the model was trained on). When the new prompt's tokens extend what the KV cache
//! already holds, only the new tokens are computed; otherwise the sequence starts over.
//!
//! On a terminal the input line is edited with rustyline (arrows, Home/End, history with
//! Up/Down, kept in `$SMELT_HISTORY` or `~/.local/state/smelt/chat_history`), and Ctrl-C
//! stops the answer being written (the conversation goes on) or clears the line being
//! typed. Piped input is read line by line, as a script would send it.

use anyhow::{Context, Result};
use clap::Args;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use smelt_engine::generate::{generate, Cancel, GenerateParams};
use smelt_engine::{Engine, SeqId};
use smelt_tokenizer::{ChatMessage, ChatTemplate};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::model_ref;
use super::run::{summary, tokenize_prompt, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[arg(long, short = 'm', value_name = "MODEL", default_value = model_ref::DEFAULT_MODEL,
          help = model_ref::MODEL_HELP)]
    pub model: String,
    /// Quantize the weights as they load (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k ... q6_k, or a
    /// llama.cpp preset such as q4_k_m), with `smelt quantize`'s per-tensor rules
    /// [default: none: the weights as stored]
    #[arg(long, value_name = "TYPE")]
    pub isq: Option<String>,
    /// A system message that opens the conversation [default: none, or the template's own]
    #[arg(long)]
    pub system: Option<String>,
    /// The most tokens one answer may take.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[arg(long, default_value = "cpu", help = model_ref::DEVICE_HELP)]
    pub device: String,
    #[arg(long, value_name = "N", help = model_ref::THREADS_HELP)]
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
    let mut input = Input::new()?;
    // On a terminal, Ctrl-C while an answer is written raises this flag, which stops it (the
    // editor reads Ctrl-C as a key while a line is typed).
    let cancel = Cancel::default();
    if matches!(input, Input::Editor { .. }) {
        signal_hook::flag::register(signal_hook::consts::SIGINT, cancel.0.clone())
            .context("cannot catch Ctrl-C")?;
    }
    let params = GenerateParams {
        cancel: Some(cancel.clone()),
        ..params
    };
    eprintln!(
        "smelt chat with {} ({}): /reset starts over, /exit or Ctrl-D ends, Ctrl-C stops an answer",
        m.path.display(),
        m.engine.info().arch.name()
    );
    let mut stdout = std::io::stdout();
    loop {
        cancel.0.store(false, Ordering::SeqCst);
        let Some(line) = input.line()? else {
            writeln!(stdout)?;
            break;
        };
        let text = line.trim();
        match text {
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
            content: text.to_string(),
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
        if cancel.is_set() {
            eprintln!("(stopped)");
        }
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

/// Where the user's lines come from: an editor on a terminal, else plain lines.
enum Input {
    Editor {
        editor: Box<DefaultEditor>,
        history: Option<PathBuf>,
    },
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Input {
    fn new() -> Result<Input> {
        if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
            return Ok(Input::Lines(std::io::stdin().lock().lines()));
        }
        let mut editor = DefaultEditor::new().context("cannot set up line editing")?;
        let history = history_file();
        if let Some(h) = &history {
            // No file yet is the usual first run.
            let _ = editor.load_history(h);
        }
        Ok(Input::Editor {
            editor: Box::new(editor),
            history,
        })
    }

    /// The next line, or `None` at the end of input (Ctrl-D).
    fn line(&mut self) -> Result<Option<String>> {
        match self {
            Input::Lines(lines) => {
                let mut out = std::io::stdout();
                write!(out, "> ")?;
                out.flush()?;
                lines
                    .next()
                    .transpose()
                    .context("cannot read the standard input")
            }
            Input::Editor { editor, history } => loop {
                match editor.readline("> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                            if let Some(h) = history.as_ref() {
                                save_history(editor, h);
                            }
                        }
                        return Ok(Some(line));
                    }
                    // Ctrl-C on the input line drops the line, as in a shell.
                    Err(ReadlineError::Interrupted) => continue,
                    Err(ReadlineError::Eof) => return Ok(None),
                    Err(e) => return Err(e).context("cannot read the terminal"),
                }
            },
        }
    }
}

/// `$SMELT_HISTORY`, else `$XDG_STATE_HOME/smelt/chat_history`, else
/// `~/.local/state/smelt/chat_history`; `None` when there is no home.
fn history_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMELT_HISTORY") {
        return Some(PathBuf::from(p));
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("smelt/chat_history"))
}

/// Best effort: a history that cannot be written must not end the chat.
fn save_history(editor: &mut DefaultEditor, path: &std::path::Path) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = editor.save_history(path);
}
