//! Arbitrary text through the real tokenizers (SmolLM2's GPT-2 BPE, Gemma 3's SentencePiece)
//! and through their chat templates (the model's own Jinja and llama.cpp's built-in formats).
//! Besides never panicking or hanging:
//! - every id is in the vocabulary;
//! - text marked plain tokenizes as with special-token parsing off (no control token);
//! - a chat prompt's message content, tokenized with the ranges `render_marked` gives, holds
//!   no control token: a user cannot forge a turn.
//!
//! The models come from `scripts/fetch-models.sh` (`$SMELT_MODELS` or the checkout's
//! `.models/`); a missing one stops the run with a message that says so.

#![no_main]

#[path = "common/alloc_limit.rs"]
mod alloc_limit;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use smelt_gguf::Gguf;
use smelt_tokenizer::{BuiltinTemplate, ChatMessage, ChatTemplate, Tokenizer};

struct Model {
    tok: Tokenizer,
    templates: Vec<ChatTemplate>,
}

fn models() -> &'static [Model] {
    static MODELS: OnceLock<Vec<Model>> = OnceLock::new();
    MODELS.get_or_init(|| {
        let dir = std::env::var_os("SMELT_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.models")));
        [
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "gemma-3-270m-q4_k_m.gguf",
        ]
        .iter()
        .map(|f| {
            let path = dir.join(f);
            let g = Gguf::open(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (run scripts/fetch-models.sh all)", path.display())
            });
            let tok = Tokenizer::from_gguf(g.metadata()).expect("tokenizer");
            let mut templates =
                vec![ChatTemplate::from_gguf(g.metadata(), &tok).expect("template")];
            for b in [
                BuiltinTemplate::ChatMl,
                BuiltinTemplate::Llama3,
                BuiltinTemplate::Gemma,
            ] {
                templates.push(ChatTemplate::builtin(b, &tok));
            }
            Model { tok, templates }
        })
        .collect()
    })
}

fn controls(tok: &Tokenizer, ids: &[u32]) -> usize {
    ids.iter().filter(|&&i| tok.is_control(i)).count()
}

/// The control tokens of template `k`'s prompt for `blank` (every content "" or "x"), or None
/// where the template refuses it. It depends only on the model, the template, the roles and
/// which contents are empty, so it is worked out once per such shape and kept for the
/// process (at most 2 x 4 x 8 x 4 x 2^8 entries): rendering and encoding it again for every
/// input was about a third of the target's time.
fn blank_controls(model: usize, k: usize, blank: &[ChatMessage]) -> Option<usize> {
    type Key = (usize, usize, Vec<(String, bool)>);
    thread_local! {
        static MEMO: RefCell<HashMap<Key, Option<usize>>> = RefCell::new(HashMap::new());
    }
    let key: Key = (
        model,
        k,
        blank
            .iter()
            .map(|m| (m.role.clone(), m.content.is_empty()))
            .collect(),
    );
    if let Some(hit) = MEMO.with(|m| m.borrow().get(&key).copied()) {
        return hit;
    }
    let m = &models()[model];
    let want = match m.templates[k].render_marked(blank, true) {
        Ok(Some((p2, s2))) => Some(controls(&m.tok, &m.tok.encode_with_plain(&p2, true, &s2))),
        _ => None,
    };
    MEMO.with(|m| m.borrow_mut().insert(key, want));
    want
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let which = (head & 1) as usize;
    let m = &models()[which];
    let tok = &m.tok;
    let text = String::from_utf8_lossy(rest);
    let n = tok.n_vocab();

    let ids = tok.encode(&text, head & 2 != 0, head & 4 != 0);
    assert!(ids.iter().all(|&i| (i as usize) < n));
    let _ = tok.detokenize(&ids, head & 8 != 0, head & 16 != 0);
    let plain = tok.encode_with_plain(&text, false, &[0..text.len()]);
    assert_eq!(plain, tok.encode(&text, false, false));

    // Messages: the text cut at U+0001, roles in turn.
    let roles = ["system", "user", "assistant", "user"];
    let msgs: Vec<ChatMessage> = text
        .split('\u{1}')
        .take(8)
        .enumerate()
        .map(|(i, c)| ChatMessage::new(roles[(i + (head as usize >> 5)) % 4], c))
        .collect();
    let blank: Vec<ChatMessage> = msgs
        .iter()
        .map(|m| ChatMessage::new(m.role.clone(), if m.content.is_empty() { "" } else { "x" }))
        .collect();
    for (k, t) in m.templates.iter().enumerate() {
        let Ok(marked) = t.render_marked(&msgs, true) else {
            continue; // the template refused these messages (raise_exception)
        };
        let Some((prompt, spans)) = marked else {
            assert!(k == 0, "a built-in format keeps content whole");
            continue;
        };
        assert_eq!(
            prompt,
            t.render(&msgs, true).expect("renders as marked did")
        );
        for r in &spans {
            assert!(r.start < r.end && r.end <= prompt.len());
            assert!(prompt.is_char_boundary(r.start) && prompt.is_char_boundary(r.end));
        }
        let ids = tok.encode_with_plain(&prompt, true, &spans);
        assert!(ids.iter().all(|&i| (i as usize) < n));
        // The control tokens are the template's own: as many as with every content a
        // harmless "x".
        if let Some(want) = blank_controls(which, k, &blank) {
            assert_eq!(controls(tok, &ids), want, "{prompt:?}");
        }
    }
});
