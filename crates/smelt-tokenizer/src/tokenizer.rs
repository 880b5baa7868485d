//! The public tokenizer: llama.cpp's `llama_tokenize`, `llama_token_to_piece` and
//! `llama_detokenize` over a vocabulary read from GGUF metadata.

use smelt_gguf::Metadata;

use crate::pretokenize::PreTokenizer;
use crate::special::{Fragment, SpecialMatcher};
use crate::unicode::char_to_byte;
use crate::vocab::{attr, Vocab, VocabKind};
use crate::{bpe, spm, TokenizerError};

/// A GGUF model's tokenizer, giving the same token ids as llama.cpp.
pub struct Tokenizer {
    vocab: Vocab,
    pre: Option<PreTokenizer>,
    special: SpecialMatcher,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("n_vocab", &self.vocab.texts.len())
            .field("bos", &self.vocab.bos)
            .field("eos", &self.vocab.eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_gguf(meta)?;
        let pre = vocab.pre.as_ref().map(PreTokenizer::new).transpose()?;
        let special = SpecialMatcher::new(&vocab);
        Ok(Tokenizer {
            vocab,
            pre,
            special,
        })
    }

    /// llama.cpp's `llama_tokenize(text, add_special, parse_special)`: `add_special` adds BOS/EOS
    /// as the GGUF's add_bos_token/add_eos_token say; `parse_special` turns the text of control
    /// tokens into their ids (user-defined tokens are always matched).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_parts(text, add_special, parse_special, &[])
    }

    /// [`encode`](Self::encode) with special tokens parsed, except inside the `plain` byte
    /// ranges, where the text of control tokens stays text (a chat message's content, as
    /// [`ChatTemplate::render_marked`](crate::ChatTemplate::render_marked) gives the ranges).
    /// With no ranges it is `encode(text, add_special, true)`.
    pub fn encode_with_plain(
        &self,
        text: &str,
        add_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        self.encode_parts(text, add_special, true, plain)
    }

    /// Whether `text` holds the text of a control or unknown token (what `encode` with
    /// `parse_special` would turn into that token).
    pub fn has_special_text(&self, text: &str) -> bool {
        self.special.partition(&self.vocab, text, true, &[]).iter().any(|f| {
            matches!(f, Fragment::Token(id) if self.vocab.attr(*id) & (attr::CONTROL | attr::UNKNOWN) != 0)
        })
    }

    fn encode_parts(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.bos);
        }
        let frags = self.special.partition(v, text, parse_special, plain);
        match v.kind {
            VocabKind::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for c in text[s..e].chars() {
                                buf.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm::tokenize(v, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            VocabKind::Bpe => {
                let mut key = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            if let Some(pre) = &self.pre {
                                for word in pre.split(&text[s..e]) {
                                    bpe::tokenize_word(v, &word, &mut key, &mut out);
                                }
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        out
    }

    /// The text of `ids` as llama.cpp's `llama_detokenize(ids, false, false)` gives it
    /// (control tokens render empty), lossy where the bytes are not UTF-8.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }

    /// llama.cpp's `llama_detokenize`: `remove_special` drops a leading BOS / trailing EOS the
    /// tokenizer would add; `unparse_special` renders control tokens as their text. Applies the
    /// vocabulary's leading-space removal and space clean-up.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let mut ids = ids;
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos && ids.first().is_some_and(|&t| Some(t) == v.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && v.add_eos && ids.last().is_some_and(|&t| Some(t) == v.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = self.piece(id, unparse_special);
            let skip = usize::from(remove_space && piece.first() == Some(&b' '));
            text.extend_from_slice(&piece[skip..]);
            remove_space = false;
        }
        if v.clean_spaces {
            clean_spaces(&mut text);
        }
        text
    }

    /// The bytes llama.cpp's `llama_token_to_piece(id, special = true)` gives: one token's
    /// text with control tokens rendered (an id out of range gives nothing).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.piece(id, true)
    }

    /// `llama_token_to_piece(id, special)`: with `special` false, control and unknown tokens
    /// render empty.
    pub fn piece(&self, id: u32, special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let Some(text) = v.texts.get(id as usize) else {
            return Vec::new();
        };
        let a = v.attr(id);
        let attr_special = attr::UNKNOWN | attr::CONTROL;
        if !special && a & attr_special != 0 {
            return Vec::new();
        }
        if a & (attr_special | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match v.kind {
                VocabKind::Spm => text.replace('\u{2581}', " ").into_bytes(),
                VocabKind::Bpe => decode_byte_alphabet(text),
            };
        }
        if a & attr::BYTE != 0 {
            return text
                .get(3..5)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map(|b| vec![b])
                .unwrap_or_default();
        }
        Vec::new()
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.texts.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }
    /// End of turn (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`...), from metadata or by text.
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }
    pub fn unk(&self) -> Option<u32> {
        self.vocab.unk
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    pub fn kind(&self) -> crate::VocabKind {
        self.vocab.kind
    }
    /// End of generation: EOS, EOT and the other tokens llama.cpp stops on.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }
    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.vocab.eog.iter().copied().collect();
        ids.sort_unstable();
        ids
    }
    /// Control tokens (BOS, `<|im_start|>`...): text a user cannot type without parse_special.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }
    /// The token's stored text (SentencePiece `▁` and GPT-2 byte alphabet kept as they are).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }
    /// The id of a token's stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }
}

/// GPT-2 byte-alphabet text back to bytes; characters outside the alphabet are written as
/// llama.cpp does (`[UNK_BYTE_0x..<text>]`).
fn decode_byte_alphabet(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// `clean_up_tokenization_spaces`, llama.cpp's three passes: no space before `?!.,`, none
/// around a lone apostrophe, none before `'s 'm 're 've`.
fn clean_spaces(text: &mut Vec<u8>) {
    let src = std::mem::take(text);
    let mut out = Vec::with_capacity(src.len());
    if let Some(&first) = src.first() {
        out.push(first);
    }
    for i in 1..src.len() {
        let x = src[i];
        if src[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }

    let src = std::mem::take(&mut out);
    if let Some(&first) = src.first() {
        out.push(first);
    }
    let n = src.len();
    let mut dropped = None;
    let mut i = 1;
    while i < n {
        let x = src[i];
        let prev = if dropped == Some(i - 1) {
            0
        } else {
            src[i - 1]
        };
        if x == b'\'' && i + 1 < n && prev == b' ' && src[i + 1] == b' ' {
            out.pop();
            dropped = Some(i + 1);
            i += 1;
        }
        out.push(x);
        i += 1;
    }

    let src = std::mem::take(&mut out);
    if let Some(&first) = src.first() {
        out.push(first);
    }
    let n = src.len();
    for i in 1..n {
        let x = src[i];
        if src[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = src[i + 1];
            let contraction = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => i + 2 < n && matches!((x1, src[i + 2]), (b'r', b'e') | (b'v', b'e')),
            };
            if contraction {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::clean_spaces;

    #[test]
    fn clean_spaces_passes() {
        let mut t = b"Hello , world ! it 's a ' b ' c they 're".to_vec();
        clean_spaces(&mut t);
        assert_eq!(t, b"Hello, world! it's a'b'c they're".to_vec());
    }
}
