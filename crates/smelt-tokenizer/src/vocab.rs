//! The vocabulary as llama.cpp's `llama_vocab::load` builds it from GGUF metadata: token
//! texts, scores and attributes, special token ids and the tokenizer flags.

use std::collections::{HashMap, HashSet};

use smelt_gguf::{Array, Metadata};

use crate::pretokenize::PreType;
use crate::TokenizerError;

/// Token attributes (llama.cpp's `llama_token_attr` bits).
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    /// Whitespace before the token's text is swallowed by it in special-token partitioning.
    pub const LSTRIP: u16 = 1 << 7;
    /// Whitespace after the token's text is swallowed by it.
    pub const RSTRIP: u16 = 1 << 8;
}

/// Which algorithm turns text into tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// `tokenizer.ggml.model = "llama"`: SentencePiece BPE over scores, with byte fallback.
    Spm,
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE over ranked merges.
    Bpe,
}

pub(crate) struct Vocab {
    pub kind: VocabKind,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    pub ids: HashMap<String, u32>,
    /// BPE merges keyed `"left right"` (the GGUF's merge string), valued by rank.
    pub merges: HashMap<String, u32>,
    pub pre: Option<PreType>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    pub eog: HashSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order
    /// `tokenizer_st_partition` looks for them in raw text.
    pub special: Vec<u32>,
}

fn strings<'a>(meta: &'a Metadata, key: &str) -> Result<Option<&'a [String]>, TokenizerError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .and_then(Array::as_strings)
            .map(Some)
            .ok_or_else(|| TokenizerError::BadField(key.to_string(), "an array of strings")),
    }
}

/// Ids whose text marks end of generation (llama.cpp's list, matched by text).
const EOG_TEXTS: &[&str] = &[
    "</s>",
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];
/// FIM tokens llama.cpp detects by text; the pad, repo and file-separator ones end generation.
type FimGroup = (&'static str, &'static [&'static str], bool);
const FIM_TEXTS: &[FimGroup] = &[
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<PRE>",
            "▁<PRE>",
        ],
        false,
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<SUF>",
            "▁<SUF>",
        ],
        false,
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<MID>",
            "▁<MID>",
        ],
        false,
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"],
        true,
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
        true,
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"], true),
];

impl Vocab {
    pub(crate) fn from_gguf(meta: &Metadata) -> Result<Vocab, TokenizerError> {
        let model = meta
            .get_str("tokenizer.ggml.model")
            .ok_or(TokenizerError::Missing("tokenizer.ggml.model"))?;
        let texts = strings(meta, "tokenizer.ggml.tokens")?
            .ok_or(TokenizerError::Missing("tokenizer.ggml.tokens"))?;
        let n = texts.len();

        let (kind, mut bos, mut eos, mut unk) = match model {
            "llama" => (VocabKind::Spm, Some(1), Some(2), Some(0)),
            "gpt2" => (VocabKind::Bpe, Some(11), Some(11), None),
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };

        let mut merges = HashMap::new();
        let mut pre = None;
        let (mut add_space_prefix, mut add_bos, mut add_eos, clean_spaces, ignore_merges);
        match kind {
            VocabKind::Bpe => {
                let list = strings(meta, "tokenizer.ggml.merges")?
                    .ok_or(TokenizerError::Missing("tokenizer.ggml.merges"))?;
                merges.reserve(list.len());
                for (rank, m) in list.iter().enumerate() {
                    // llama.cpp splits at the first space after the first byte
                    if m.bytes().skip(1).any(|b| b == b' ') {
                        merges.entry(m.clone()).or_insert(rank as u32);
                    }
                }
                let p = PreType::from_name(meta.get_str("tokenizer.ggml.pre").unwrap_or(""))?;
                add_space_prefix = false;
                add_bos = p.add_bos;
                add_eos = false;
                clean_spaces = p.clean_spaces;
                ignore_merges = p.ignore_merges;
                pre = Some(p);
            }
            VocabKind::Spm => {
                add_space_prefix = true;
                add_bos = true;
                add_eos = false;
                clean_spaces = false;
                ignore_merges = false;
            }
        }
        if let Some(v) = meta.get_bool("tokenizer.ggml.add_space_prefix") {
            add_space_prefix = v;
        }

        let scores: Vec<f32> = match meta.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
            None => vec![0.0; n],
            Some(Array::F32(s)) if s.len() >= n => s[..n].to_vec(),
            Some(Array::I32(s)) if s.len() >= n => s[..n].iter().map(|&x| x as f32).collect(),
            Some(_) => {
                return Err(TokenizerError::BadField(
                    "tokenizer.ggml.scores".into(),
                    "f32 or i32 per token",
                ))
            }
        };
        let mut attrs: Vec<u16> = match meta
            .get("tokenizer.ggml.token_type")
            .and_then(|v| v.as_array())
        {
            None => vec![attr::NORMAL; n],
            Some(Array::I32(t)) if t.len() >= n => t[..n]
                .iter()
                .map(|&ty| match ty {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => 0,
                })
                .collect(),
            Some(_) => {
                return Err(TokenizerError::BadField(
                    "tokenizer.ggml.token_type".into(),
                    "i32 per token",
                ))
            }
        };

        let mut texts: Vec<String> = texts.to_vec();
        let mut ids = HashMap::with_capacity(n);
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
            if let Some(first) = ids.insert(t.clone(), i as u32) {
                // llama.cpp refuses such a vocabulary too (an assertion in 0.3.36)
                return Err(TokenizerError::DuplicateToken(t.clone(), first, i as u32));
            }
        }

        let special_id = |key: &str, default: Option<u32>| -> Option<u32> {
            let default = default.filter(|&d| (d as usize) < n);
            match meta.get_u64(key) {
                Some(v) if (v as usize) < n => Some(v as u32),
                _ => default,
            }
        };
        bos = special_id("tokenizer.ggml.bos_token_id", bos);
        eos = special_id("tokenizer.ggml.eos_token_id", eos);
        unk = special_id("tokenizer.ggml.unknown_token_id", unk);
        let mut eot = special_id("tokenizer.ggml.eot_token_id", None);
        let eom = special_id("tokenizer.ggml.eom_token_id", None);
        if let Some(v) = meta.get_bool("tokenizer.ggml.add_bos_token") {
            add_bos = v;
        }
        if let Some(v) = meta.get_bool("tokenizer.ggml.add_eos_token") {
            add_eos = v;
        }
        if add_bos && bos.is_none() {
            return Err(TokenizerError::Missing("tokenizer.ggml.bos_token_id"));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::Missing("tokenizer.ggml.eos_token_id"));
        }

        let mut eog = HashSet::new();
        let id_of = |t: &str| ids.get(t).copied();
        // llama.cpp takes the first candidate in hash-map order; the lowest id is a stable
        // choice that agrees with it on the models tested
        if eot.is_none() {
            eot = EOT_TEXTS.iter().filter_map(|t| id_of(t)).min();
        }
        for &(key, texts, ends) in FIM_TEXTS {
            let id = match special_id(key, None) {
                Some(id) => Some(id),
                None => texts.iter().filter_map(|t| id_of(t)).min().inspect(|&id| {
                    attrs[id as usize] |= attr::CONTROL;
                }),
            };
            if let (Some(id), true) = (id, ends) {
                eog.insert(id);
            }
        }
        for t in EOG_TEXTS {
            if let Some(id) = id_of(t) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for id in [eot, eom].into_iter().flatten() {
            attrs[id as usize] |= attr::CONTROL;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        for (a, t) in attrs.iter_mut().zip(&texts) {
            if *a & attr::CONTROL != 0 && t.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = id_of(t) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }

        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

        // llama.cpp's per-model attributes, chosen by model name: Phi-3's special tokens eat
        // the whitespace that follows them (its HF tokenizer's rstrip)
        let name = meta.get_str("general.name").unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &special {
                attrs[id as usize] |= attr::RSTRIP;
            }
            let mut set = |t: &str, on: bool| {
                if let Some(id) = ids.get(t) {
                    let a = &mut attrs[*id as usize];
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            };
            set("</s>", true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(t, false);
            }
        }

        Ok(Vocab {
            kind,
            texts,
            scores,
            attrs,
            ids,
            merges,
            pre,
            bos,
            eos,
            eot,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            eog,
            special,
        })
    }

    pub(crate) fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    pub(crate) fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// SPM's byte-fallback token for one byte: `<0xXX>`, or the byte itself as a token.
    pub(crate) fn byte_token(&self, b: u8) -> Option<u32> {
        self.id(&format!("<0x{b:02X}>"))
            .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| self.id(s)))
    }
}

#[cfg(test)]
mod tests {
    use smelt_gguf::{Array, Metadata, Value};

    use super::Vocab;
    use crate::TokenizerError;

    fn spm(tokens: &[&str]) -> Metadata {
        let mut m = Metadata::new();
        m.insert("tokenizer.ggml.model", Value::from("llama"));
        let t = tokens.iter().map(|s| s.to_string()).collect();
        m.insert("tokenizer.ggml.tokens", Value::Array(Array::String(t)));
        m
    }

    #[test]
    fn bad_metadata_is_an_error() {
        let err = |m: &Metadata| {
            Vocab::from_gguf(m)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(&Metadata::new()).contains("tokenizer.ggml.model"));
        let mut m = spm(&["<unk>", "<s>", "</s>", "a"]);
        m.insert("tokenizer.ggml.model", Value::from("t5"));
        assert!(matches!(
            Vocab::from_gguf(&m),
            Err(TokenizerError::UnknownModel(_))
        ));
        let mut m = spm(&["<unk>", "<s>", "</s>", "a"]);
        m.insert(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0; 2])),
        );
        assert!(err(&m).contains("tokenizer.ggml.scores"));
        let mut m = spm(&["<unk>", "<s>", "</s>", "a"]);
        m.insert(
            "tokenizer.ggml.token_type",
            Value::Array(Array::String(vec![])),
        );
        assert!(err(&m).contains("tokenizer.ggml.token_type"));
        let mut m = spm(&["<unk>", "<s>", "</s>", "a"]);
        m.insert("tokenizer.ggml.model", Value::from("gpt2"));
        assert!(err(&m).contains("tokenizer.ggml.merges"));
        m.insert(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["a a".into()])),
        );
        m.insert("tokenizer.ggml.pre", Value::from("no-such-pre"));
        assert!(matches!(
            Vocab::from_gguf(&m),
            Err(TokenizerError::UnknownPreTokenizer(_))
        ));
        m.insert("tokenizer.ggml.tokens", Value::U32(3));
        assert!(err(&m).contains("tokenizer.ggml.tokens"));
        let m = spm(&["<unk>", "<s>", "a", "</s>", "a"]);
        assert!(
            matches!(Vocab::from_gguf(&m), Err(TokenizerError::DuplicateToken(t, 2, 4)) if t == "a")
        );
    }

    #[test]
    fn special_ids_out_of_range_fall_back() {
        let mut m = spm(&["<unk>", "<s>"]);
        m.insert("tokenizer.ggml.bos_token_id", Value::U32(99));
        m.insert("tokenizer.ggml.add_bos_token", Value::Bool(false));
        let v = Vocab::from_gguf(&m).expect("vocab");
        // the SPM default BOS is 1; EOS's default 2 is past the end, so there is none
        assert_eq!((v.bos, v.eos), (Some(1), None));
        m.insert("tokenizer.ggml.add_eos_token", Value::Bool(true));
        assert!(
            Vocab::from_gguf(&m).is_err(),
            "add_eos without an EOS token"
        );
    }
}
