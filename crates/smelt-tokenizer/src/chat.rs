//! Chat templates: the GGUF's `tokenizer.chat_template` rendered with minijinja in the
//! environment Hugging Face and llama.cpp give it, or llama.cpp's built-in format for the
//! architecture when the GGUF has none.

use std::ops::Range;
use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use smelt_gguf::Metadata;

use crate::{Tokenizer, TokenizerError};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// llama.cpp's hard-coded chat formats (`llm_chat_apply_template`), for GGUFs without a
/// template of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuiltinTemplate {
    ChatMl,
    Llama3,
    Gemma,
}

impl BuiltinTemplate {
    /// By llama.cpp's template name (`chatml`, `llama3`, `gemma`).
    pub fn from_name(name: &str) -> Option<BuiltinTemplate> {
        match name {
            "chatml" => Some(BuiltinTemplate::ChatMl),
            "llama3" => Some(BuiltinTemplate::Llama3),
            "gemma" => Some(BuiltinTemplate::Gemma),
            _ => None,
        }
    }

    /// The format an architecture's chat models use; ChatML otherwise, llama.cpp's default.
    pub fn for_architecture(arch: &str) -> BuiltinTemplate {
        if arch.starts_with("gemma") {
            BuiltinTemplate::Gemma
        } else {
            BuiltinTemplate::ChatMl
        }
    }

    fn render(self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let mut s = String::new();
        match self {
            BuiltinTemplate::ChatMl => {
                for m in messages {
                    s += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
                }
                if add_generation_prompt {
                    s += "<|im_start|>assistant\n";
                }
            }
            BuiltinTemplate::Llama3 => {
                for m in messages {
                    s += &format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role,
                        trim(&m.content)
                    );
                }
                if add_generation_prompt {
                    s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
                }
            }
            BuiltinTemplate::Gemma => {
                // Gemma has no system turn: the system text opens the next user turn
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system += trim(&m.content);
                        continue;
                    }
                    let role = if m.role == "assistant" {
                        "model"
                    } else {
                        m.role.as_str()
                    };
                    s += &format!("<start_of_turn>{role}\n");
                    if !system.is_empty() && role != "model" {
                        s += &system;
                        s += "\n\n";
                        system.clear();
                    }
                    s += trim(&m.content);
                    s += "<end_of_turn>\n";
                }
                if add_generation_prompt {
                    s += "<start_of_turn>model\n";
                }
            }
        }
        s
    }
}

/// Marks where message content starts and ends in a rendering (Unicode noncharacters,
/// meant for a program's internal use).
const OPEN: char = '\u{FDD0}';
const CLOSE: char = '\u{FDD1}';

/// The text without its markers and the ranges they enclosed, or `None` when a marker is
/// unpaired.
fn unmark(marked: &str) -> Option<Marked> {
    let mut out = String::with_capacity(marked.len());
    let mut spans = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for c in marked.chars() {
        match c {
            OPEN => {
                if depth == 0 {
                    start = out.len();
                }
                depth += 1;
            }
            CLOSE => {
                if depth == 0 {
                    return None;
                }
                if depth == 1 && out.len() > start {
                    spans.push(start..out.len());
                }
                depth -= 1;
            }
            c => out.push(c),
        }
    }
    (depth == 0).then_some((out, spans))
}

/// C's `isspace` trim, as llama-chat.cpp's `trim`.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

#[derive(Clone)]
enum Source {
    /// The source and an environment holding it compiled (as template `chat`).
    Jinja(String, Arc<Environment<'static>>),
    Builtin(BuiltinTemplate),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Jinja(src, _) => f.debug_tuple("Jinja").field(src).finish(),
            Source::Builtin(b) => f.debug_tuple("Builtin").field(b).finish(),
        }
    }
}

impl Source {
    /// Compiles once, so a broken template is a load error and rendering costs no parsing.
    fn jinja(src: &str) -> Result<Source, TokenizerError> {
        let mut env = environment();
        env.add_template_owned("chat", without_generation_tags(src))?;
        Ok(Source::Jinja(src.to_string(), Arc::new(env)))
    }
}

/// A rendered chat prompt and the byte ranges of it that are message content.
pub type Marked = (String, Vec<Range<usize>>);

/// A model's chat template.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: Source,
    bos_token: String,
    eos_token: String,
    add_bos: bool,
    add_eos: bool,
}

impl ChatTemplate {
    /// The GGUF's `tokenizer.chat_template`, or llama.cpp's built-in format for the
    /// architecture when there is none.
    pub fn from_gguf(meta: &Metadata, tok: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        let source = match meta.get_str("tokenizer.chat_template") {
            Some(t) => Source::jinja(t)?,
            None => Source::Builtin(BuiltinTemplate::for_architecture(
                meta.architecture().unwrap_or(""),
            )),
        };
        Ok(ChatTemplate::with_source(source, tok))
    }

    /// A Jinja template from its source, with the tokenizer's BOS/EOS.
    pub fn from_jinja(source: &str, tok: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        Ok(ChatTemplate::with_source(Source::jinja(source)?, tok))
    }

    /// A user's template choice (a `--chat-template` value): a built-in format's name
    /// (`chatml`, `llama3`, `gemma`) or Jinja source.
    pub fn from_spec(spec: &str, tok: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        match BuiltinTemplate::from_name(spec.trim()) {
            Some(b) => Ok(ChatTemplate::builtin(b, tok)),
            None => ChatTemplate::from_jinja(spec, tok),
        }
    }

    /// One of llama.cpp's built-in formats.
    pub fn builtin(which: BuiltinTemplate, tok: &Tokenizer) -> ChatTemplate {
        ChatTemplate::with_source(Source::Builtin(which), tok)
    }

    fn with_source(source: Source, tok: &Tokenizer) -> ChatTemplate {
        let text = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(&tok.token_bytes(i)).into_owned())
                .unwrap_or_default()
        };
        ChatTemplate {
            source,
            bos_token: text(tok.bos()),
            eos_token: text(tok.eos()),
            add_bos: tok.add_bos(),
            add_eos: tok.add_eos(),
        }
    }

    /// The Jinja source, or `None` for a built-in format.
    pub fn jinja_source(&self) -> Option<&str> {
        match &self.source {
            Source::Jinja(s, _) => Some(s),
            Source::Builtin(_) => None,
        }
    }

    /// The prompt for `messages`, ready for `encode(prompt, add_special = true,
    /// parse_special = true)`: as llama.cpp does, a BOS (EOS) text the template writes at the
    /// start (end) is removed when the tokenizer adds that token itself, so it is not doubled.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let mut out = self.render_raw(messages, add_generation_prompt)?;
        if self.add_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.add_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }

    /// [`render`](Self::render), and the byte ranges of the prompt that are message content,
    /// for [`Tokenizer::encode_with_plain`]: special-token text a user wrote stays text.
    ///
    /// Each non-empty content is wrapped in two Unicode noncharacters before rendering and
    /// the ranges are read off where they land, when the markers change nothing else: tried
    /// with the content as it is, then trimmed (for templates that trim it). `None` when
    /// neither gives the unmarked rendering with every marker paired (a template that cuts
    /// content apart): the caller decides. Noncharacters in the content are dropped.
    pub fn render_marked(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Option<Marked>, TokenizerError> {
        let clean: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage {
                role: m.role.clone(),
                content: m.content.replace([OPEN, CLOSE], ""),
            })
            .collect();
        let plain = self.render(&clean, add_generation_prompt)?;
        let mark = |trimmed: bool| -> Result<Option<Marked>, TokenizerError> {
            let marked: Vec<ChatMessage> = clean
                .iter()
                .map(|m| {
                    let c = if trimmed {
                        trim(&m.content)
                    } else {
                        &m.content
                    };
                    let content = if c.is_empty() {
                        String::new()
                    } else {
                        format!("{OPEN}{c}{CLOSE}")
                    };
                    ChatMessage {
                        role: m.role.clone(),
                        content,
                    }
                })
                .collect();
            Ok(unmark(&self.render(&marked, add_generation_prompt)?))
        };
        for trimmed in [false, true] {
            if let Ok(Some((text, spans))) = mark(trimmed) {
                if text == plain {
                    return Ok(Some((text, spans)));
                }
            }
        }
        Ok(None)
    }

    /// The prompt for messages given as JSON objects as OpenAI's API sends them (`tool_calls`,
    /// `tool_call_id`, `name` ...) and the `tools` the template may list, as
    /// [`render`](Self::render) trims it. A built-in format sees only roles and contents.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let mut out = match &self.source {
            Source::Builtin(b) => {
                let plain: Vec<ChatMessage> = messages
                    .iter()
                    .map(|m| {
                        let field = |k: &str| m.get(k).and_then(|v| v.as_str()).unwrap_or("");
                        ChatMessage::new(field("role"), field("content"))
                    })
                    .collect();
                b.render(&plain, add_generation_prompt)
            }
            Source::Jinja(_, env) => {
                let tmpl = env.get_template("chat")?;
                let ctx = minijinja::context! {
                    messages => Value::from(Serde(messages)),
                    tools => tools.map(|t| Value::from(Serde(t))),
                    add_generation_prompt => add_generation_prompt,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                };
                tmpl.render(ctx)?
            }
        };
        if self.add_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.add_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }

    /// Exactly what the template writes (Jinja's output, BOS text included).
    pub fn render_raw(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        match &self.source {
            Source::Builtin(b) => Ok(b.render(messages, add_generation_prompt)),
            Source::Jinja(_, env) => {
                let tmpl = env.get_template("chat")?;
                let ctx = minijinja::context! {
                    messages => Value::from(Serde(messages)),
                    add_generation_prompt => add_generation_prompt,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                };
                Ok(tmpl.render(ctx)?)
            }
        }
    }
}

/// The environment Hugging Face's `apply_chat_template` renders in: blocks trimmed,
/// `raise_exception`, `strftime_now`, `tojson`, and Python's string/dict methods.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    if let Ok(syntax) = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", |fmt: String| {
        crate::time::strftime_now(&fmt)
    });
    env.add_filter("tojson", tojson);
    env
}

/// Hugging Face's `{% generation %}` ... `{% endgeneration %}` extension tags (they mark
/// assistant text for training masks and render nothing) become `{% if true %}` ...
/// `{% endif %}`, which plain Jinja knows, keeping the tags' whitespace control.
fn without_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(open) = rest.find("{%") {
        let Some(len) = rest[open..].find("%}").map(|i| i + 2) else {
            break;
        };
        let tag = &rest[open..open + len];
        let inner = &tag[2..len - 2];
        let word = inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..open]);
        match word {
            "generation" => out.push_str(&tag.replacen("generation", "if true", 1)),
            "endgeneration" => out.push_str(&tag.replacen("endgeneration", "endif", 1)),
            _ => out.push_str(tag),
        }
        rest = &rest[open + len..];
    }
    out.push_str(rest);
    out
}

/// `tojson` as Hugging Face defines it for chat templates: Python's `json.dumps` with
/// `ensure_ascii=False` (`", "` and `": "` separators, no HTML escaping), keys in insertion
/// order, and an optional `indent`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::without_generation_tags;

    #[test]
    fn generation_tags_are_dropped() {
        let src = "{% for m in messages %}{%- generation -%}{{ m.content }}{% endgeneration %}{% endfor %}";
        assert_eq!(
            without_generation_tags(src),
            "{% for m in messages %}{%- if true -%}{{ m.content }}{% endif %}{% endfor %}"
        );
        assert_eq!(without_generation_tags("{{ x }} {% if"), "{{ x }} {% if");
    }
}
