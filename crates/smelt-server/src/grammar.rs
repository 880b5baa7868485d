//! Constrained decoding: `response_format` (JSON object, JSON schema, regex, Lark grammar)
//! and forced tool calls become llguidance grammars, whose token masks the scheduler applies
//! to each step's logits, so the output always parses.
//!
//! Each model gets one [`Grammars`]: llguidance's token trie built from smelt's own
//! tokenizer (its bytes per token, special tokens marked as llguidance expects, smelt's
//! tokenization for the text a grammar forces), the parser factory built once on first use,
//! and compiled grammars cached by their JSON text (a small LRU), so a request with a schema
//! seen before only clones a ready parser.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use smelt_tokenizer::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::ApiError;
pub use smelt_openai::grammar::{response_format, with_layout};

/// Compiled grammars kept per model.
const CACHE_SIZE: usize = 64;

/// llguidance's view of smelt's tokenizer.
struct SmeltTokEnv {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for SmeltTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Grammar text is plain text: special-token names in it stay text.
        self.tok.encode(&String::from_utf8_lossy(s), false, false)
    }
}

/// The token that ends a constrained answer: end-of-turn where the model has one (chat
/// models stop on it), else end-of-sequence.
fn end_token(tok: &Tokenizer) -> Option<u32> {
    tok.eot().or(tok.eos())
}

/// Builds llguidance's token trie: every token's bytes, with control tokens marked by
/// 0xFF + their text so grammars never produce them as text.
fn tok_env(tok: &Arc<Tokenizer>) -> Result<TokEnv, String> {
    let n = tok.n_vocab();
    let eos = end_token(tok).ok_or("the model has no end-of-sequence token")?;
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            if tok.is_control(id) || tok.is_eog(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
                w
            } else {
                tok.token_bytes(id)
            }
        })
        .collect();
    let mut info = TokRxInfo::new(n as u32, eos);
    info.tok_bos = tok.bos();
    info.tok_end_of_turn = tok.eot();
    let trie = TokTrie::from(&info, &words);
    Ok(Arc::new(SmeltTokEnv {
        trie,
        tok: Arc::clone(tok),
    }))
}

/// One model's grammar compiler and cache.
pub struct Grammars {
    tok: Arc<Tokenizer>,
    factory: OnceLock<Result<ParserFactory, String>>,
    cache: Mutex<VecDeque<(String, Matcher)>>,
}

impl Grammars {
    pub fn new(tok: Arc<Tokenizer>) -> Grammars {
        Grammars {
            tok,
            factory: OnceLock::new(),
            cache: Mutex::new(VecDeque::new()),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, ApiError> {
        self.factory
            .get_or_init(|| {
                let env = tok_env(&self.tok)?;
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                Ok(f)
            })
            .as_ref()
            .map_err(|e| ApiError::internal(format!("constrained decoding is unavailable: {e}")))
    }

    /// A fresh matcher for `grammar`, compiled once per distinct grammar. `param` names the
    /// request field a bad grammar is blamed on.
    pub fn matcher(&self, grammar: TopLevelGrammar, param: &str) -> Result<Matcher, ApiError> {
        let key = serde_json::to_string(&grammar).unwrap_or_default();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
                let hit = cache.remove(i).expect("position is in range");
                let m = hit.1.deep_clone();
                cache.push_front(hit);
                return Ok(m);
            }
        }
        let factory = self.factory()?;
        let parser = factory.create_parser(grammar).map_err(|e| {
            ApiError::invalid_param(param, format!("the grammar does not compile: {e}"))
        })?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(ApiError::invalid_param(
                param,
                format!("the grammar does not compile: {e}"),
            ));
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.push_front((key, m.deep_clone()));
        cache.truncate(CACHE_SIZE);
        Ok(m)
    }

    /// Grammars compiled and kept.
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
