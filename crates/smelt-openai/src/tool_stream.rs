//! Streamed tool calls, piece by piece as OpenAI streams them: a call's `id`, `type` and
//! `function.name` as soon as its name is complete, then its `function.arguments` in pieces
//! as the model writes them. The text held since the call began is re-read after every
//! token by a small partial-JSON scanner that knows where each format puts its call objects.
//!
//! Arguments are sent with the whitespace outside JSON strings removed, which is prefix-
//! stable (what was sent stays a prefix of the final text), and [`crate::tools::parse`]
//! gives the same text for a finished answer, so a stream's pieces add up to what a
//! non-streamed request answers.

use crate::tools::ToolFormat;

/// What the scanner has seen of one call object so far.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PartialCall {
    /// The `name`, once its string is complete.
    pub name: Option<String>,
    /// The arguments so far (whitespace outside strings removed), once their value has
    /// started; only object values are streamed in pieces (others come whole at the end).
    pub arguments: Option<String>,
    /// The arguments' value is complete.
    pub arguments_done: bool,
    /// The whole call object is complete.
    pub done: bool,
}

/// Drops whitespace outside JSON strings (`in_str`/`esc` carry the state across pieces).
pub fn minify_into(out: &mut String, text: &str, in_str: &mut bool, esc: &mut bool) {
    for c in text.chars() {
        if *in_str {
            out.push(c);
            if *esc {
                *esc = false;
            } else if c == '\\' {
                *esc = true;
            } else if c == '"' {
                *in_str = false;
            }
        } else if !c.is_whitespace() {
            out.push(c);
            if c == '"' {
                *in_str = true;
            }
        }
    }
}

/// `text` (JSON) with the whitespace outside strings removed.
pub fn minify(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    minify_into(&mut out, text, &mut false, &mut false);
    out
}

/// Scans one JSON object starting at `text[0] == '{'`: its name and arguments so far, and
/// how many bytes it spans once complete.
fn scan_object(text: &str) -> (PartialCall, Option<usize>) {
    let mut call = PartialCall::default();
    let b = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    // At depth 1: the last key read, and where the current value starts.
    let mut key: Option<String> = None;
    let mut value_start: Option<usize> = None;
    let mut expect_key = true;
    while i < b.len() {
        let c = b[i];
        match c {
            b'"' => {
                // A whole string, or the rest of the text when it is not closed yet.
                let start = i;
                let mut j = i + 1;
                let mut closed = false;
                while j < b.len() {
                    match b[j] {
                        b'\\' => j += 2,
                        b'"' => {
                            closed = true;
                            break;
                        }
                        _ => j += 1,
                    }
                }
                if !closed {
                    break;
                }
                if depth == 1 {
                    let s: Option<String> = serde_json::from_str(&text[start..=j]).ok();
                    if expect_key {
                        key = s;
                    } else if key.as_deref() == Some("name") && value_start == Some(start) {
                        call.name = s;
                    }
                }
                i = j + 1;
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    expect_key = true;
                }
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 1 {
                    end_value(text, &key, value_start, i + 1, &mut call);
                    value_start = None;
                }
                if depth == 0 {
                    if value_start.is_some() {
                        end_value(text, &key, value_start, i, &mut call);
                    }
                    call.done = true;
                    return (call, Some(i + 1));
                }
            }
            b':' if depth == 1 => {
                expect_key = false;
                let mut j = i + 1;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                value_start = Some(j);
                i = j;
                continue;
            }
            b',' if depth == 1 => {
                if value_start.is_some() {
                    end_value(text, &key, value_start, i, &mut call);
                }
                value_start = None;
                expect_key = true;
            }
            _ => {}
        }
        i += 1;
    }
    // Not complete: an object value of the arguments streams what it has so far.
    if let (Some(k), Some(s)) = (&key, value_start) {
        if is_args(k) && text.as_bytes().get(s) == Some(&b'{') && call.arguments.is_none() {
            call.arguments = Some(minify(&text[s..]));
        }
    }
    (call, None)
}

fn is_args(key: &str) -> bool {
    key == "arguments" || key == "parameters"
}

/// A depth-1 value of `key` ended at `end` (exclusive).
fn end_value(
    text: &str,
    key: &Option<String>,
    start: Option<usize>,
    end: usize,
    call: &mut PartialCall,
) {
    let (Some(k), Some(s)) = (key, start) else {
        return;
    };
    if is_args(k) && s <= end {
        call.arguments = Some(arguments_text(text[s..end].trim()));
        call.arguments_done = true;
    }
}

/// A finished arguments value as OpenAI's `arguments` string: a JSON string's own text,
/// anything else as JSON without the whitespace outside strings.
pub fn arguments_text(raw: &str) -> String {
    if raw.starts_with('"') {
        if let Ok(s) = serde_json::from_str::<String>(raw) {
            return s;
        }
    }
    minify(raw)
}

/// Where each call object of `format` begins in `text` (the held text since the call
/// marker), in order.
fn object_starts(format: ToolFormat, text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    match format {
        ToolFormat::Hermes => {
            let mut from = 0;
            while let Some(at) = text[from..].find("<tool_call>") {
                let after = from + at + "<tool_call>".len();
                let ws = text[after..].len() - text[after..].trim_start().len();
                if text[after + ws..].starts_with('{') {
                    starts.push(after + ws);
                }
                from = after;
            }
        }
        ToolFormat::Mistral | ToolFormat::Llama3 => {
            let body_from = match format {
                ToolFormat::Mistral => match text.find("[TOOL_CALLS]") {
                    Some(at) => at + "[TOOL_CALLS]".len(),
                    None => return starts,
                },
                _ => 0,
            };
            // Top-level objects, one after another (`[`, `,`, `;` and tags between them).
            let mut i = body_from;
            while let Some(at) = text[i..].find('{') {
                let s = i + at;
                starts.push(s);
                match scan_object(&text[s..]).1 {
                    Some(len) => i = s + len,
                    None => break,
                }
            }
        }
    }
    starts
}

/// Every call object in `text` so far, complete or not.
pub fn scan(format: ToolFormat, text: &str) -> Vec<PartialCall> {
    object_starts(format, text)
        .into_iter()
        .map(|s| scan_object(&text[s..]).0)
        .collect()
}

/// The complete call objects at the start of `text` and where the first unfinished one
/// begins (`text.len()` when none is): what an answer cut off by `max_tokens` in the middle
/// of a call keeps of its calls. Stops at the first object that is not a complete call.
pub fn complete_calls(format: ToolFormat, text: &str) -> (Vec<(String, String)>, usize) {
    let mut calls = Vec::new();
    for s in object_starts(format, text) {
        match scan_object(&text[s..]) {
            (
                PartialCall {
                    name: Some(name),
                    arguments: Some(arguments),
                    arguments_done: true,
                    done: true,
                },
                Some(_),
            ) => calls.push((name, arguments)),
            _ => return (calls, s),
        }
    }
    (calls, text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_answer_keeps_its_complete_calls() {
        let text = "{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"param";
        let (calls, rest) = complete_calls(ToolFormat::Llama3, text);
        assert_eq!(calls, vec![("f".to_string(), "{\"a\":1}".to_string())]);
        assert_eq!(&text[rest..], "{\"name\": \"g\", \"param");
        let whole = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}]";
        assert_eq!(complete_calls(ToolFormat::Mistral, whole).1, whole.len());
        assert_eq!(complete_calls(ToolFormat::Llama3, "{\"x\": 1}").0, vec![]);
    }

    #[test]
    fn minify_keeps_strings() {
        assert_eq!(
            minify("{ \"a b\" : [1, 2],\n \"c\": \"x \\\" y\" }"),
            "{\"a b\":[1,2],\"c\":\"x \\\" y\"}"
        );
    }

    /// Every prefix of each format's text scans to calls whose arguments are prefixes of
    /// the finished ones, and the finished scan equals `tools::parse`.
    #[test]
    fn prefixes_stream_monotonically_and_end_as_parse_does() {
        let cases = [
            (
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, \\\"FR\\\"\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>{\"arguments\": {}, \"name\": \"g\"}</tool_call>",
            ),
            (
                ToolFormat::Llama3,
                "{\"name\": \"f\", \"parameters\": {\"x\": {\"y\": \"}\"}}}; {\"name\": \"g\", \"parameters\": {\"z\": 1.5}}",
            ),
            (
                ToolFormat::Mistral,
                "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"q\": \"a b\"}}, {\"name\": \"g\", \"arguments\": \"{\\\"k\\\": 2}\"}]",
            ),
        ];
        for (format, text) in cases {
            let (_, want) = crate::tools::parse(format, text);
            let end = scan(format, text);
            assert_eq!(end.len(), want.len(), "{text}");
            for (e, w) in end.iter().zip(&want) {
                assert!(e.done && e.arguments_done, "{text}: {e:?}");
                assert_eq!(e.name.as_deref(), Some(w.name.as_str()));
                assert_eq!(e.arguments.as_deref(), Some(w.arguments.as_str()), "{text}");
            }
            for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
                for (k, p) in scan(format, &text[..cut]).iter().enumerate() {
                    if let Some(n) = &p.name {
                        assert_eq!(n, &want[k].name, "{cut}");
                    }
                    if let Some(a) = &p.arguments {
                        assert!(
                            want[k].arguments.starts_with(a.as_str()),
                            "{format:?} cut {cut}: {a:?} is not a prefix of {:?}",
                            want[k].arguments
                        );
                    }
                }
            }
        }
    }
}
