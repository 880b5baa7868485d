//! `tokenizer.model` (a SentencePiece `ModelProto`) to the `tokenizer.*` keys of convert's
//! `_set_vocab_sentencepiece`: pieces, scores and types, overridden by `added_tokens.json`
//! and tokenizer_config.json's `added_tokens_decoder`, padded to config.json's `vocab_size`.
//!
//! Only the pieces are read from the protobuf (field 1 of ModelProto; piece, score and type
//! of each), with a reader small enough to check by eye.

use std::path::Path;

use serde_json::{Map, Value as Json};
use smelt_gguf::{Array, Metadata, Value};

use super::vocab::{looks_special, VocabInput};
use crate::LoadError;

/// SentencePiece's piece types, which are also llama.cpp's token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

struct Piece {
    text: String,
    score: f32,
    ty: i32,
}

/// A protobuf wire-format reader over one message's bytes.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.pos)?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    /// The next field: (number, wire type, payload for length-delimited / fixed fields, value
    /// for varints).
    fn field(&mut self) -> Option<(u64, u8, &'a [u8], u64)> {
        let key = self.varint()?;
        let (num, wt) = (key >> 3, (key & 7) as u8);
        match wt {
            0 => Some((num, wt, &[], self.varint()?)),
            1 => Some((num, wt, self.take(8)?, 0)),
            2 => {
                let n = usize::try_from(self.varint()?).ok()?;
                Some((num, wt, self.take(n)?, 0))
            }
            5 => Some((num, wt, self.take(4)?, 0)),
            _ => None,
        }
    }

    fn done(&self) -> bool {
        self.pos >= self.b.len()
    }
}

fn pieces(bytes: &[u8]) -> Option<Vec<Piece>> {
    let mut r = Reader { b: bytes, pos: 0 };
    let mut out = Vec::new();
    while !r.done() {
        let (num, wt, payload, _) = r.field()?;
        if num != 1 || wt != 2 {
            continue;
        }
        let mut p = Reader { b: payload, pos: 0 };
        let mut piece = Piece {
            text: String::new(),
            score: 0.0,
            ty: NORMAL,
        };
        while !p.done() {
            match p.field()? {
                (1, 2, s, _) => piece.text = String::from_utf8(s.to_vec()).ok()?,
                (2, 5, f, _) => piece.score = f32::from_le_bytes(f.try_into().ok()?),
                (3, 0, _, v) => piece.ty = i32::try_from(v).ok()?,
                _ => {}
            }
        }
        out.push(piece);
    }
    Some(out)
}

/// Writes tokens, scores, types, model `llama` and pre `default`; returns the vocabulary size.
pub fn convert(
    path: &Path,
    input: &VocabInput<'_>,
    tc: Option<&Map<String, Json>>,
    md: &mut Metadata,
) -> Result<u64, LoadError> {
    let bytes = std::fs::read(path).map_err(|e| LoadError::io(path, e))?;
    let pieces = pieces(&bytes)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| LoadError::bad_file(path, "not a SentencePiece model (ModelProto)"))?;
    let n = input.vocab_size.map(|v| v as usize).unwrap_or(pieces.len());
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; n];
    let mut types = vec![UNUSED; n];
    for (i, p) in pieces.iter().enumerate().take(n) {
        tokens[i] = p.text.clone();
        scores[i] = p.score;
        // SentencePieceProcessor's IsUnknown/IsControl/IsUnused/IsByte; anything else
        // (user-defined pieces included) is NORMAL in convert.
        types[i] = match p.ty {
            UNKNOWN | CONTROL | UNUSED | BYTE => p.ty,
            _ => NORMAL,
        };
    }
    let added_path = input.dir.join("added_tokens.json");
    if added_path.is_file() {
        let text =
            std::fs::read_to_string(&added_path).map_err(|e| LoadError::io(&added_path, e))?;
        let json: Map<String, Json> = serde_json::from_str(&text)
            .map_err(|e| LoadError::bad_file(&added_path, format!("not a JSON object: {e}")))?;
        for (text, id) in json {
            let Some(id) = id.as_u64().map(|i| i as usize).filter(|&i| i < n) else {
                continue;
            };
            tokens[id] = text;
            scores[id] = -1000.0;
            types[id] = USER_DEFINED;
        }
    }
    if let Some(dec) = tc
        .and_then(|c| c.get("added_tokens_decoder"))
        .and_then(|d| d.as_object())
    {
        for (id, data) in dec {
            let (Ok(id), Some(content)) = (
                id.parse::<usize>(),
                data.get("content").and_then(|c| c.as_str()),
            ) else {
                continue;
            };
            if id >= n {
                continue;
            }
            let special = data.get("special").and_then(|s| s.as_bool()) == Some(true);
            if special || looks_special(content) {
                tokens[id] = content.to_string();
                types[id] = CONTROL;
            } else {
                tokens[id] = content.replace('\u{2581}', " ");
                types[id] = USER_DEFINED;
            }
            scores[id] = -1000.0;
        }
    }
    md.insert("tokenizer.ggml.model", Value::from("llama"));
    md.insert("tokenizer.ggml.pre", Value::from("default"));
    md.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    md.insert("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
    md.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    Ok(n as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn piece(text: &str, score: f32, ty: Option<u64>) -> Vec<u8> {
        let mut p = vec![0x0a];
        varint(text.len() as u64, &mut p);
        p.extend_from_slice(text.as_bytes());
        p.push(0x15);
        p.extend_from_slice(&score.to_le_bytes());
        if let Some(t) = ty {
            p.push(0x18);
            varint(t, &mut p);
        }
        let mut out = vec![0x0a];
        varint(p.len() as u64, &mut out);
        out.extend_from_slice(&p);
        out
    }

    #[test]
    fn reads_pieces_and_skips_other_fields() {
        let mut m = piece("<unk>", 0.0, Some(2));
        m.extend(piece("\u{2581}the", -3.5, None));
        // A trainer_spec (field 2) with a varint inside: skipped.
        m.extend([0x12, 0x02, 0x08, 0x01]);
        m.extend(piece("<0x0A>", 0.0, Some(6)));
        let p = pieces(&m).expect("parses");
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].text.as_str(), p[0].ty), ("<unk>", UNKNOWN));
        assert_eq!(
            (p[1].text.as_str(), p[1].score, p[1].ty),
            ("\u{2581}the", -3.5, NORMAL)
        );
        assert_eq!(p[2].ty, BYTE);
        assert!(
            pieces(&m[..m.len() - 1]).is_none(),
            "a truncated file is refused"
        );
    }
}
