//! BPE pre-tokenization: splitting text into words before merges, per `tokenizer.ggml.pre`.
//!
//! llama.cpp runs a list of regexes in sequence, each one splitting the pieces the previous
//! one produced (text between matches is kept as its own piece). Two of its patterns (GPT-2's
//! and Llama 3's) are hand-written scanners rather than regexes, and their quirks decide token
//! ids, so they are reproduced here as scanners too; every other pattern runs through
//! `fancy-regex` with llama.cpp's exact expression.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use fancy_regex::Regex;

use crate::unicode::{
    byte_encode_into, collapse, flags, is_whitespace, Flags, COLLAPSED_LETTER, COLLAPSED_MARK,
    COLLAPSED_NUMBER, COLLAPSED_PUNCTUATION, COLLAPSED_SYMBOL,
};
use crate::TokenizerError;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5/3.6: Qwen2's pattern with combining marks (`\p{M}`) inside letter runs, so an
/// accent or a vowel sign stays in its word instead of starting a new one.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's pre-tokenizer settings for one `tokenizer.ggml.pre` value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreType {
    pub patterns: &'static [&'static str],
    /// `clean_up_tokenization_spaces`: detokenize removes spaces before punctuation.
    pub clean_spaces: bool,
    /// A whole word that is already a token skips the merges (Llama 3's tiktoken heritage).
    pub ignore_merges: bool,
    /// The default for add_bos when the GGUF does not say.
    pub add_bos: bool,
}

impl PreType {
    /// The settings for `tokenizer.ggml.pre` (empty or absent means "default").
    pub(crate) fn from_name(name: &str) -> Result<PreType, TokenizerError> {
        const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];
        const STARCODER: &[&str] = &[r"\p{N}", GPT2];
        let pre = |patterns, clean_spaces| PreType {
            patterns,
            clean_spaces,
            ignore_merges: false,
            add_bos: false,
        };
        Ok(match name {
            "" | "default" => pre(DEFAULT, true),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => PreType {
                ignore_merges: true,
                add_bos: true,
                ..pre(&[LLAMA3], true)
            },
            "dbrx" | "smaug-bpe" => pre(&[LLAMA3], true),
            "qwen2" | "deepseek-r1-qwen" | "megrez" => pre(&[QWEN2], false),
            "qwen35" => pre(&[QWEN35], false),
            "stablelm2" => pre(&[QWEN2], true),
            "smollm" | "command-r" => pre(STARCODER, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => pre(STARCODER, true),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "mpt" | "olmo" | "jais" | "exaone4" => {
                pre(&[GPT2], true)
            }
            "falcon" => pre(&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"], true),
            "deepseek-coder" => pre(
                &[
                    "[\r\n]",
                    r"\s?\p{L}+",
                    r"\s?\p{P}+",
                    r"[\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+",
                    r"\p{N}",
                ],
                false,
            ),
            "deepseek-v3" | "hunyuan-dense" => pre(
                &[
                    r"\p{N}{1,3}",
                    r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+",
                    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
                ],
                false,
            ),
            "tekken" => PreType {
                ignore_merges: true,
                add_bos: true,
                ..pre(&[TEKKEN], false)
            },
            "gpt-4o" | "llama4" => pre(&[GPT4O], false),
            "bloom" | "gpt3-finnish" => pre(&[BLOOM], true),
            "poro-chat" => pre(&[BLOOM], false),
            "viking" => pre(&[BLOOM, r"\p{N}"], false),
            "hunyuan" | "grok-2" => pre(&[QWEN2], false),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => pre(
                &[
                    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
                ],
                false,
            ),
            "seed-coder" => pre(
                &[
                    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
                ],
                false,
            ),
            "chatglm-bpe" | "glm4" => pre(&[LLAMA3], true),
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
        })
    }
}

enum Step {
    Gpt2,
    Llama3,
    /// A pattern naming categories, over the collapsed text.
    Collapsed(Box<Regex>),
    /// A pattern without categories, over the real characters (llama.cpp's `std::wregex`
    /// path, where non-ASCII whitespace reads as `\x0B`).
    Wide(Box<Regex>),
}

/// What decides how a byte-level BPE vocabulary whose `tokenizer.ggml.pre` is `name` encodes
/// text: the split patterns and whether a whole word that is a token skips the merges; `None`
/// for a name smelt does not know. Two names with the same key give the same ids from
/// `encode(text, false, _)` for the same vocabulary (they may differ in the BOS default and in
/// detokenize's space clean-up), so a caller trying names in turn can skip repeats.
pub fn pre_tokenizer_key(name: &str) -> Option<(&'static [&'static str], bool)> {
    PreType::from_name(name)
        .ok()
        .map(|p| (p.patterns, p.ignore_merges))
}

/// `p` compiled (over the collapsed text when `collapsed`), from a cache shared by every
/// tokenizer of the process: compiling one of these patterns builds DFAs and costs
/// milliseconds, and a Hugging Face folder's conversion builds a tokenizer for each candidate
/// pre-tokenizer (`smelt_load`'s `detect_pre`). The patterns are this file's constants, so the
/// cache holds a few dozen entries at most; a clone shares the compiled program.
fn compiled(p: &'static str, collapsed: bool) -> Result<Regex, TokenizerError> {
    static CACHE: OnceLock<Mutex<HashMap<(&'static str, bool), Regex>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(re) = cache.get(&(p, collapsed)) {
        return Ok(re.clone());
    }
    let re = if collapsed {
        Regex::new(&collapse_pattern(p))
    } else {
        Regex::new(p)
    }
    .map_err(|e| TokenizerError::Regex(p.to_string(), e.to_string()))?;
    cache.insert((p, collapsed), re.clone());
    Ok(re)
}

/// A compiled pre-tokenizer.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

impl PreTokenizer {
    pub(crate) fn new(pre: &PreType) -> Result<PreTokenizer, TokenizerError> {
        let steps = pre
            .patterns
            .iter()
            .map(|&p| match p {
                GPT2 => Ok(Step::Gpt2),
                LLAMA3 => Ok(Step::Llama3),
                _ if p.contains(r"\p{") => Ok(Step::Collapsed(Box::new(compiled(p, true)?))),
                _ => Ok(Step::Wide(Box::new(compiled(p, false)?))),
            })
            .collect::<Result<_, TokenizerError>>()?;
        Ok(PreTokenizer { steps })
    }

    /// The words of `text`, each in the GPT-2 byte alphabet.
    pub(crate) fn split(&self, text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let fl: Vec<Flags> = chars.iter().map(|&c| flags(c)).collect();
        // byte offset of each char, plus the end
        let mut pos: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        pos.push(text.len());

        let needs = |f: fn(&Step) -> bool| self.steps.iter().any(f);
        let collapsed =
            needs(|s| matches!(s, Step::Collapsed(_))).then(|| mapped(&chars, collapse));
        let wide = needs(|s| matches!(s, Step::Wide(_))).then(|| {
            mapped(&chars, |c| {
                if !c.is_ascii() && is_whitespace(c) {
                    '\x0B'
                } else {
                    c
                }
            })
        });

        let mut pieces = vec![chars.len()];
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            let mut start = 0;
            for &len in &pieces {
                let end = start + len;
                match step {
                    Step::Gpt2 => split_gpt2(&chars, &fl, start, end, &mut next),
                    Step::Llama3 => split_llama3(&chars, &fl, start, end, &mut next),
                    Step::Collapsed(re) => {
                        if let Some((ctext, cpos)) = &collapsed {
                            split_regex(re, ctext, cpos, start, end, &mut next);
                        }
                    }
                    Step::Wide(re) => {
                        if let Some((wtext, wpos)) = &wide {
                            split_regex(re, wtext, wpos, start, end, &mut next);
                        }
                    }
                }
                start = end;
            }
            pieces = next;
        }

        let mut words = Vec::with_capacity(pieces.len());
        let mut start = 0;
        for len in pieces {
            let mut w = String::with_capacity(len * 2);
            byte_encode_into(&text[pos[start]..pos[start + len]], &mut w);
            words.push(w);
            start += len;
        }
        words
    }
}

/// The text with every char mapped, and the byte offset of each char (plus the end).
fn mapped(chars: &[char], f: impl Fn(char) -> char) -> (String, Vec<usize>) {
    let text: String = chars.iter().map(|&c| f(c)).collect();
    let mut pos: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    pos.push(text.len());
    (text, pos)
}

/// llama.cpp's rewrite of a pattern for the collapsed text: each `\p{N}`, `\p{L}`, `\p{P}`,
/// `\p{M}`, `\p{S}` becomes its stand-in plus the ASCII members of the category, bracketed
/// unless already inside a class.
fn collapse_pattern(p: &str) -> String {
    let class = |cat: &str| -> Option<String> {
        let (stand_in, ascii) = match cat {
            "N" => (COLLAPSED_NUMBER, "0-9"),
            "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => (COLLAPSED_LETTER, "A-Za-z"),
            "P" => (COLLAPSED_PUNCTUATION, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
            "M" => (COLLAPSED_MARK, ""),
            "S" => (COLLAPSED_SYMBOL, r"\$\+<->\^`\|"),
            _ => return None,
        };
        Some(format!("{stand_in}{ascii}"))
    };
    let b = p.as_bytes();
    let mut out = String::with_capacity(p.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < p.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !escaped {
            inside = true;
        } else if inside && b[i] == b']' && !escaped {
            inside = false;
        } else if p[i..].starts_with(r"\p{") {
            if let Some(close) = p[i..].find('}') {
                if let Some(c) = class(&p[i + 3..i + close]) {
                    if inside {
                        out += &c;
                    } else {
                        out += &format!("[{c}]");
                    }
                    i += close + 1;
                    continue;
                }
            }
        }
        let ch = p[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Splits chars `[ini, end)` at every match of `re`, keeping the text between matches
/// (std::regex_iterator over the piece, as llama.cpp's `unicode_regex_split_stl`).
fn split_regex(
    re: &Regex,
    text: &str,
    pos: &[usize],
    ini: usize,
    end: usize,
    out: &mut Vec<usize>,
) {
    let base = pos[ini];
    let slice = &text[base..pos[end]];
    // byte offset within the slice -> char index
    let to_char = |b: usize| pos[ini..=end].partition_point(|&p| p < base + b) + ini;
    let mut prev = ini;
    for m in re.find_iter(slice) {
        // only a backtracking limit fails a match; the rest of the piece then stays whole
        let Ok(m) = m else { break };
        let (s, e) = (to_char(m.start()), to_char(m.end()));
        if s > prev {
            out.push(s - prev);
        }
        if e > s {
            out.push(e - s);
        }
        prev = e;
    }
    if end > prev {
        out.push(end - prev);
    }
}

/// A scanner over one piece: out-of-piece positions read as "no char" with empty flags.
struct Scan<'a> {
    chars: &'a [char],
    fl: &'a [Flags],
    ini: usize,
    end: usize,
    prev_end: usize,
}

impl Scan<'_> {
    fn cpt(&self, p: usize) -> Option<char> {
        (self.ini <= p && p < self.end).then(|| self.chars[p])
    }
    fn flags(&self, p: usize) -> Flags {
        if self.ini <= p && p < self.end {
            self.fl[p]
        } else {
            Flags::default()
        }
    }
    fn add(&mut self, end: usize, out: &mut Vec<usize>) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            out.push(len);
        }
        self.prev_end = end;
        len
    }
    /// `\s+(?!\S)|\s+` at `pos`, after the other alternatives failed.
    fn whitespace(&mut self, pos: &mut usize, out: &mut Vec<usize>) -> bool {
        let mut n = 0;
        while self.flags(*pos + n).whitespace {
            n += 1;
        }
        if n > 1 && self.cpt(*pos + n).is_some() {
            *pos += n - 1;
        } else if n > 0 {
            *pos += n;
        } else {
            return false;
        }
        self.add(*pos, out);
        true
    }
}

fn is_other(f: Flags) -> bool {
    !(f.whitespace || f.letter || f.number) && f.present
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(chars: &[char], fl: &[Flags], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut s = Scan {
        chars,
        fl,
        ini,
        end,
        prev_end: ini,
    };
    let mut pos = ini;
    while pos < end {
        let cpt = chars[pos];
        if cpt == '\'' && pos + 1 < end {
            let next = chars[pos + 1];
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += s.add(pos + 2, out);
                continue;
            }
            if pos + 2 < end {
                let nn = chars[pos + 2];
                if matches!((next, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += s.add(pos + 3, out);
                    continue;
                }
            }
        }
        let f2 = if cpt == ' ' {
            s.flags(pos + 1)
        } else {
            fl[pos]
        };
        let class: Option<fn(Flags) -> bool> = if f2.letter {
            Some(|f| f.letter)
        } else if f2.number {
            Some(|f| f.number)
        } else if is_other(f2) {
            Some(is_other)
        } else {
            None
        };
        if let Some(class) = class {
            pos += usize::from(cpt == ' ');
            while class(s.flags(pos)) {
                pos += 1;
            }
            s.add(pos, out);
            continue;
        }
        if s.whitespace(&mut pos, out) {
            continue;
        }
        pos += 1;
        s.add(pos, out);
    }
}

/// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn split_llama3(chars: &[char], fl: &[Flags], ini: usize, end: usize, out: &mut Vec<usize>) {
    let mut s = Scan {
        chars,
        fl,
        ini,
        end,
        prev_end: ini,
    };
    let lower = |c: char| {
        let mut l = c.to_lowercase();
        match (l.next(), l.next()) {
            (Some(x), None) => x,
            _ => c,
        }
    };
    let mut pos = ini;
    while pos < end {
        let cpt = chars[pos];
        let f = fl[pos];
        if cpt == '\'' && pos + 1 < end {
            let next = lower(chars[pos + 1]);
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += s.add(pos + 2, out);
                continue;
            }
            if pos + 2 < end {
                let nn = lower(chars[pos + 2]);
                if matches!((next, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += s.add(pos + 3, out);
                    continue;
                }
            }
        }
        if !(cpt == '\r' || cpt == '\n' || f.number) && (f.letter || s.flags(pos + 1).letter) {
            pos += 1;
            while s.flags(pos).letter {
                pos += 1;
            }
            s.add(pos, out);
            continue;
        }
        if f.number {
            let mut start = pos;
            while s.flags(pos).number {
                pos += 1;
                if pos - start >= 3 {
                    s.add(pos, out);
                    start = pos;
                }
            }
            s.add(pos, out);
            continue;
        }
        let f2 = if cpt == ' ' { s.flags(pos + 1) } else { f };
        // llama.cpp tests that `cpt` (always present) has flags here, not f2
        if is_other(Flags {
            present: true,
            ..f2
        }) {
            pos += usize::from(cpt == ' ');
            while is_other(s.flags(pos)) {
                pos += 1;
            }
            while matches!(s.cpt(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            s.add(pos, out);
            continue;
        }
        let mut n = 0;
        let mut last_rn = None;
        while s.flags(pos + n).whitespace {
            if matches!(chars[pos + n], '\r' | '\n') {
                last_rn = Some(pos + n + 1);
            }
            n += 1;
        }
        if let Some(p) = last_rn {
            pos = p;
            s.add(pos, out);
            continue;
        }
        if s.whitespace(&mut pos, out) {
            continue;
        }
        pos += 1;
        s.add(pos, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(&PreType::from_name(pre).unwrap()).unwrap();
        p.split(text)
    }

    #[test]
    fn pre_tokenizer_keys_group_names_that_encode_alike() {
        let key = |n| pre_tokenizer_key(n).unwrap();
        assert_eq!(key("llama-bpe"), key("falcon3"));
        assert_eq!(key("qwen2"), key("stablelm2")); // differ only in the space clean-up
        assert_ne!(key("llama-bpe"), key("dbrx")); // same pattern, merges not skipped
        assert_ne!(key("gpt-2"), key("smollm"));
        assert_eq!(pre_tokenizer_key("no-such-pre"), None);
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words("gpt-2", "Hello world's  end 123"),
            ["Hello", "Ġworld", "'s", "Ġ", "Ġend", "Ġ123"]
        );
    }

    #[test]
    fn smollm_splits_digits() {
        assert_eq!(words("smollm", "a 1234"), ["a", "Ġ", "1", "2", "3", "4"]);
    }

    #[test]
    fn long_runs_split_in_linear_time() {
        let text = " ".repeat(100_000) + "x" + &"\n".repeat(50_000);
        for pre in ["qwen2", "qwen35", "tekken", "default", "llama3", "gpt-2"] {
            let t = std::time::Instant::now();
            let w = words(pre, &text);
            assert_eq!(w.concat().chars().count(), text.len(), "{pre}");
            assert!(t.elapsed().as_secs_f64() < 2.0, "{pre}: {:?}", t.elapsed());
        }
    }

    #[test]
    fn qwen35_keeps_combining_marks_in_words() {
        // Devanagari "namaste": a virama and a vowel sign (both \p{M}) inside the word
        let namaste = "\u{928}\u{92e}\u{938}\u{94d}\u{924}\u{947}";
        assert_eq!(words("qwen2", namaste).len(), 3);
        assert_eq!(words("qwen35", namaste).len(), 1);
        // a mark after a space or a digit: prefix + run, and a lone run after the digit
        assert_eq!(words("qwen35", "1\u{301} \u{301}x!").len(), 4);
        assert_ne!(pre_tokenizer_key("qwen35"), pre_tokenizer_key("qwen2"));
    }

    #[test]
    fn llama3_words() {
        assert_eq!(
            words("llama3", "Hello 12345 it's\n\n ok"),
            ["Hello", "Ġ", "123", "45", "Ġit", "'s", "ĊĊ", "Ġok"]
        );
    }
}
