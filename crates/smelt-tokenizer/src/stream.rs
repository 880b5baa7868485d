//! Incremental detokenization for streaming output: token pieces are byte strings, and a
//! UTF-8 character can be split across tokens (byte-fallback and byte-level tokens), so text is
//! released only up to the last complete character.

use crate::Tokenizer;

/// Turns generated token ids into text chunks as they arrive.
///
/// Each id's piece is `llama_token_to_piece(id, special)`; concatenating every chunk, plus
/// [`DecodeStream::finish`], gives the lossy decoding of all the pieces together.
#[derive(Debug)]
pub struct DecodeStream<'a> {
    tok: &'a Tokenizer,
    special: bool,
    pending: Vec<u8>,
}

impl<'a> DecodeStream<'a> {
    /// `special`: render control tokens (`<|im_end|>`...) as their text instead of nothing.
    pub fn new(tok: &'a Tokenizer, special: bool) -> DecodeStream<'a> {
        DecodeStream {
            tok,
            special,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.pending
            .extend_from_slice(&self.tok.piece(id, self.special));
        let cut = complete_prefix(&self.pending);
        let rest = self.pending.split_off(cut);
        let done = std::mem::replace(&mut self.pending, rest);
        String::from_utf8_lossy(&done).into_owned()
    }

    /// The bytes still held back (an incomplete character), decoded lossily.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// The length of the longest prefix that does not end inside a character that more bytes
/// could still complete. Invalid bytes count as complete (they decode to U+FFFD).
fn complete_prefix(bytes: &[u8]) -> usize {
    // a character is at most 4 bytes: only the last 3 can be an unfinished one
    for back in 1..=bytes.len().min(3) {
        let i = bytes.len() - back;
        let b = bytes[i];
        if b & 0xC0 == 0x80 {
            continue; // continuation byte: look further back for the lead
        }
        let need = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 1,
        };
        return if need > back
            && std::str::from_utf8(&bytes[i..]).is_err_and(|e| e.error_len().is_none())
        {
            i
        } else {
            bytes.len()
        };
    }
    bytes.len()
}

#[cfg(test)]
mod tests {
    use super::complete_prefix;

    #[test]
    fn holds_back_only_unfinished_characters() {
        let euro = "€".as_bytes(); // E2 82 AC
        assert_eq!(complete_prefix(b"abc"), 3);
        assert_eq!(complete_prefix(&euro[..1]), 0);
        assert_eq!(complete_prefix(&[b'a', euro[0], euro[1]]), 1);
        assert_eq!(complete_prefix(euro), 3);
        assert_eq!(complete_prefix(&[0xFF]), 1);
        assert_eq!(complete_prefix(&[0xE2, 0x41]), 2); // broken, not unfinished
        let crab = "🦀".as_bytes();
        assert_eq!(complete_prefix(&crab[..3]), 0);
    }
}
