//! `tokenizer.json` (+ `tokenizer_config.json`, `config.json`) to the `tokenizer.*` keys
//! convert_hf_to_gguf.py writes for a GPT-2 style byte-level BPE: the vocabulary with token
//! types, the merges, the special token ids and add-flags, the chat template, and the
//! pre-tokenizer name chosen the way convert chooses it (a hash of how the tokenizer
//! encodes a fixed text, looked up in convert's table of known models).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde_json::{Map, Value as Json};
use sha2::{Digest, Sha256};
use smelt_gguf::{Array, Metadata, Value};

use crate::LoadError;

/// llama.cpp's token types (`llama_token_type`).
const NORMAL: i32 = 1;
const UNUSED: i32 = 5;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

fn err(why: impl Into<String>) -> LoadError {
    LoadError::Tokenizer { why: why.into() }
}

fn read_json(path: &Path) -> Result<Option<Map<String, Json>>, LoadError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::io(path, e))?;
    match serde_json::from_str(&text) {
        Ok(Json::Object(m)) => Ok(Some(m)),
        Ok(_) => Err(LoadError::bad_file(path, "not a JSON object")),
        Err(e) => Err(LoadError::bad_file(path, format!("not JSON: {e}"))),
    }
}

/// What the vocabulary conversion needs to know about the model.
pub struct VocabInput<'a> {
    pub dir: &'a Path,
    /// `vocab_size` of config.json, when present (the vocabulary is padded to it).
    pub vocab_size: Option<u64>,
    /// The GGUF architecture (`llama` gets the Llama-only rules of convert).
    pub arch: &'a str,
    /// config.json, for `*_token_id` fallbacks.
    pub config: &'a Map<String, Json>,
}

/// Writes the tokenizer keys into `md`: from `tokenizer.model` (SentencePiece) when the
/// folder has one, as convert tries it first; else from `tokenizer.json` (byte-level BPE).
pub fn convert(input: &VocabInput<'_>, md: &mut Metadata) -> Result<(), LoadError> {
    let tok_path = input.dir.join("tokenizer.json");
    let tok = read_json(&tok_path)?;
    let tc = read_json(&input.dir.join("tokenizer_config.json"))?;
    let spm_path = input.dir.join("tokenizer.model");
    let is_spm = spm_path.is_file();
    if is_spm {
        let n_vocab = super::spm::convert(&spm_path, input, tc.as_ref(), md)?;
        let added: Vec<&Map<String, Json>> = added_tokens(tok.as_ref());
        special_vocab(tok.as_ref(), tc.as_ref(), &added, input, n_vocab, md)?;
    } else {
        let Some(tok) = tok else {
            return Err(LoadError::Missing {
                path: tok_path,
                what: "tokenizer.json (byte-level BPE) or tokenizer.model (SentencePiece)",
            });
        };
        convert_bpe(input, md, &tok, tc.as_ref())?;
    }
    if input.arch == "llama" {
        if let Some(b) = tc
            .as_ref()
            .and_then(|c| c.get("add_prefix_space"))
            .and_then(|b| b.as_bool())
        {
            md.insert("tokenizer.ggml.add_space_prefix", Value::Bool(b));
        }
        // convert: "granite small models" (every 49152-token Llama vocabulary) add no BOS.
        let n_vocab = md
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .unwrap_or(0);
        if n_vocab == 49152 {
            md.insert("tokenizer.ggml.add_bos_token", Value::Bool(false));
        }
    }
    if !is_spm {
        let pre = detect_pre(md)?;
        md.insert("tokenizer.ggml.pre", Value::String(pre));
    }
    Ok(())
}

/// The `added_tokens` entries of tokenizer.json (none without the file).
fn added_tokens(tok: Option<&Map<String, Json>>) -> Vec<&Map<String, Json>> {
    tok.and_then(|t| t.get("added_tokens"))
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|t| t.as_object()).collect())
        .unwrap_or_default()
}

/// convert's `_set_vocab_gpt2` for a tokenizer.json.
fn convert_bpe(
    input: &VocabInput<'_>,
    md: &mut Metadata,
    tok: &Map<String, Json>,
    tc: Option<&Map<String, Json>>,
) -> Result<(), LoadError> {
    let model = tok
        .get("model")
        .and_then(|m| m.as_object())
        .ok_or_else(|| err("tokenizer.json has no \"model\""))?;
    let kind = model.get("type").and_then(|t| t.as_str()).unwrap_or("");
    if kind != "BPE" {
        return Err(err(format!(
            "tokenizer.json model type {kind:?}: only byte-level BPE tokenizers are supported"
        )));
    }
    if model.get("byte_fallback").and_then(|b| b.as_bool()) == Some(true)
        || !mentions_byte_level(tok)
    {
        return Err(err(
            "tokenizer.json is a SentencePiece-style BPE (byte fallback, no ByteLevel step) and \
             the folder has no tokenizer.model: convert would need transformers' slow path \
             here, which smelt does not implement",
        ));
    }

    // id -> token text, from the model vocabulary and the added tokens.
    let vocab = model
        .get("vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| err("tokenizer.json has no model.vocab"))?;
    let mut by_id: BTreeMap<u64, String> = BTreeMap::new();
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| err(format!("vocab entry {text:?} has id {id}")))?;
        by_id.insert(id, text.clone());
    }
    let mut added: HashMap<u64, bool> = HashMap::new();
    let added_tokens = added_tokens(Some(tok));
    for t in &added_tokens {
        let (Some(id), Some(content)) = (
            t.get("id").and_then(|i| i.as_u64()),
            t.get("content").and_then(|c| c.as_str()),
        ) else {
            return Err(err("an added token lacks its id or content"));
        };
        by_id.insert(id, content.to_string());
        added.insert(
            id,
            t.get("special").and_then(|s| s.as_bool()).unwrap_or(false),
        );
    }
    let max_id = by_id.keys().next_back().copied().unwrap_or(0);
    let n_vocab = input.vocab_size.unwrap_or(by_id.len() as u64);
    if max_id >= n_vocab {
        return Err(err(format!(
            "token id {max_id} is not below vocab_size {n_vocab} of config.json"
        )));
    }
    let mut tokens = Vec::with_capacity(n_vocab as usize);
    let mut types = Vec::with_capacity(n_vocab as usize);
    for i in 0..n_vocab {
        match by_id.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            Some(text) => match added.get(&i) {
                Some(&special) if special || looks_special(text) => {
                    tokens.push(text.clone());
                    types.push(CONTROL);
                }
                Some(_) => {
                    tokens.push(text.replace('\u{2581}', " "));
                    types.push(USER_DEFINED);
                }
                None => {
                    tokens.push(text.clone());
                    types.push(NORMAL);
                }
            },
        }
    }

    let merges = merges(model)?;
    md.insert("tokenizer.ggml.model", Value::from("gpt2"));
    md.insert("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    md.insert("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    md.insert("tokenizer.ggml.merges", Value::Array(Array::String(merges)));
    special_vocab(Some(tok), tc, &added_tokens, input, n_vocab, md)
}

fn mentions_byte_level(tok: &Map<String, Json>) -> bool {
    ["pre_tokenizer", "decoder"].iter().any(|k| {
        tok.get(*k)
            .map(|v| v.to_string().contains("\"ByteLevel\""))
            .unwrap_or(false)
    })
}

/// convert's `does_token_look_special`.
pub(crate) fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// Merges as `"a b"` strings; the pair form of newer files has its spaces moved to U+0120's
/// plane (`chr(ord(' ') + 256)`) as gguf-py does.
fn merges(model: &Map<String, Json>) -> Result<Vec<String>, LoadError> {
    let Some(list) = model.get("merges").and_then(|m| m.as_array()) else {
        return Err(err("tokenizer.json has no model.merges"));
    };
    list.iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) if pair.len() == 2 => {
                let part = |v: &Json| -> Result<String, LoadError> {
                    let s = v.as_str().ok_or_else(|| err(format!("bad merge {m}")))?;
                    Ok(s.chars()
                        .map(|c| if c == ' ' { '\u{120}' } else { c })
                        .collect())
                };
                Ok(format!("{} {}", part(&pair[0])?, part(&pair[1])?))
            }
            other => Err(err(format!("unknown merge format {other}"))),
        })
        .collect()
}

/// gguf-py's `SpecialVocab` for byte-level BPE folders: special token ids from
/// tokenizer_config.json (looked up among the added tokens), then config.json; add-BOS/EOS
/// from the post-processor, then tokenizer_config.json; the chat template.
fn special_vocab(
    tok: Option<&Map<String, Json>>,
    tc: Option<&Map<String, Json>>,
    added_tokens: &[&Map<String, Json>],
    input: &VocabInput<'_>,
    n_vocab: u64,
    md: &mut Metadata,
) -> Result<(), LoadError> {
    let content = |v: Option<&Json>| -> Option<String> {
        match v? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        }
    };
    let tcv = |k: &str| tc.and_then(|c| c.get(k));
    let special_bos = content(tcv("bos_token"));
    let special_eos = content(tcv("eos_token"));
    let mut add: BTreeMap<&str, bool> = BTreeMap::new();
    if let Some(pp) = tok
        .and_then(|t| t.get("post_processor"))
        .and_then(|p| p.as_object())
    {
        let procs: Vec<&Map<String, Json>> = match pp.get("processors").and_then(|p| p.as_array()) {
            Some(list) => list.iter().filter_map(|p| p.as_object()).collect(),
            None => vec![pp],
        };
        for p in procs {
            match p.get("type").and_then(|t| t.as_str()) {
                Some("ByteLevel") => {
                    add.entry("bos").or_insert(false);
                    add.entry("eos").or_insert(false);
                }
                Some("TemplateProcessing") => {
                    let single = p.get("single").and_then(|s| s.as_array());
                    let sp = |e: Option<&Json>| -> Option<String> {
                        e?.get("SpecialToken")?
                            .get("id")?
                            .as_str()
                            .map(str::to_string)
                    };
                    if let Some(single) = single.filter(|s| s.len() > 1) {
                        if let Some(first) = sp(single.first()) {
                            add.insert(
                                "bos",
                                Some(&first) == special_bos.as_ref() || special_bos.is_none(),
                            );
                        }
                        if let Some(last) = sp(single.last()) {
                            add.insert(
                                "eos",
                                Some(&last) == special_eos.as_ref() || special_eos.is_none(),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
    }
    const TYPES: [(&str, &str); 7] = [
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("sep", "seperator_token_id"),
        ("pad", "padding_token_id"),
        ("cls", "cls_token_id"),
        ("mask", "mask_token_id"),
    ];
    let mut ids: BTreeMap<&str, u64> = BTreeMap::new();
    for (typ, _) in TYPES {
        if let Some(b) = tcv(&format!("add_{typ}_token")).and_then(|b| b.as_bool()) {
            add.entry(typ).or_insert(b);
        }
        if let Some(c) = content(tcv(&format!("{typ}_token"))) {
            let id = added_tokens
                .iter()
                .find(|t| t.get("content").and_then(|x| x.as_str()) == Some(c.as_str()))
                .and_then(|t| t.get("id"))
                .and_then(|i| i.as_u64());
            if let Some(id) = id.filter(|&i| i < n_vocab) {
                ids.entry(typ).or_insert(id);
            }
        }
    }
    for (typ, _) in TYPES {
        let key = format!("{typ}_token_id");
        let v = input
            .config
            .get(&key)
            .or_else(|| input.config.get("text_config").and_then(|t| t.get(&key)));
        if let Some(id) = v.and_then(|v| v.as_u64()).filter(|&i| i < n_vocab) {
            ids.entry(typ).or_insert(id);
        }
    }
    for (typ, key) in TYPES {
        if let Some(&id) = ids.get(typ) {
            md.insert(format!("tokenizer.ggml.{key}"), Value::U32(id as u32));
        }
    }
    for (typ, b) in add {
        if matches!(typ, "bos" | "eos" | "sep") {
            md.insert(format!("tokenizer.ggml.add_{typ}_token"), Value::Bool(b));
        }
    }
    let template = match tcv("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        _ => {
            let jinja = input.dir.join("chat_template.jinja");
            if jinja.is_file() {
                Some(std::fs::read_to_string(&jinja).map_err(|e| LoadError::io(&jinja, e))?)
            } else {
                None
            }
        }
    };
    if let Some(t) = template {
        md.insert("tokenizer.chat_template", Value::String(t));
    }
    Ok(())
}

/// convert_hf_to_gguf.py's `chktxt`: the text whose token ids identify a pre-tokenizer.
const CHKTXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\u{1f680} (normal) \u{1f636}\u{200d}\u{1f32b}\u{fe0f} (multiple emojis concatenated) \u{2705} \u{1f999}\u{1f999} 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 \u{1780}\u{17b6}\u{1793}\u{17cb}\u{178f}\u{17c2}\u{1796}\u{17b7}\u{179f}\u{17c1}\u{179f}\u{17a2}\u{17b6}\u{1785}\u{1f601} ?\u{6211}\u{60f3}\u{5728}apple\u{5de5}\u{4f5c}1314151\u{5929}\u{ff5e} ------======= \u{43d}\u{435}\u{449}\u{43e} \u{43d}\u{430} \u{411}\u{44a}\u{43b}\u{433}\u{430}\u{440}\u{441}\u{43a}\u{438} ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

/// convert's table (hash of the ids of [`CHKTXT`] -> pre-tokenizer name), for the names
/// smelt's tokenizer implements, in convert's order (a later entry wins on equal hashes).
const KNOWN: &[(&str, &str)] = &[
    (
        "b6e8e1518dc4305be2fe39c313ed643381c4da5db34a98f6a04c093f8afbe99b",
        "chatglm-bpe",
    ),
    (
        "81d72c7348a9f0ebe86f23298d37debe0a5e71149e29bd283904c02262b27516",
        "chatglm-bpe",
    ),
    (
        "a1336059768a55c99a734006ffb02203cd450fed003e9a71886c88acf24fdbc2",
        "glm4",
    ),
    (
        "9ca2dd618e8afaf09731a7cf6e2105b373ba6a1821559f258b272fe83e6eb902",
        "glm4",
    ),
    (
        "cdf5f35325780597efd76153d4d1c16778f766173908894c04afc20108536267",
        "glm4",
    ),
    (
        "1431a23e583c97432bc230bff598d103ddb5a1f89960c8f1d1051aaa944d0b35",
        "minerva-7b",
    ),
    (
        "7e57df22b1fe23a7b1e1c7f3dc4e3f96d43a4eb0836d0c6bdc3436d7b2f1c664",
        "hunyuan",
    ),
    (
        "bba3b3366b646dbdded5dbc42d59598b849371afc42f7beafa914afaa5b70aa6",
        "hunyuan-dense",
    ),
    (
        "a6b57017d60e6edb4d88ecc2845188e0eb333a70357e45dcc9b53964a73bbae6",
        "falcon-h1",
    ),
    (
        "60476e1243776c4fb1b993dbd7a5f15ac22f83c80afdf425fa5ae01c8d44ef86",
        "falcon-h1",
    ),
    (
        "3eda48b4c4dc7de733d1a8b3e3b4a85243dbbf704da2ee9d42c6beced8897896",
        "falcon-h1",
    ),
    (
        "48f8e02c0359c0bbdd82f26909171fac1c18a457bb47573ed1fe3bbb2c1cfd4b",
        "falcon-h1",
    ),
    (
        "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c",
        "qwen2",
    ),
    (
        "1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f",
        "qwen35",
    ),
    (
        "66b8d4e19ab16c3bfd89bce5d785fb7e0155e8648708a1f42077cb9fe002c273",
        "grok-2",
    ),
    (
        "b3d1dd861f1d4c5c0d2569ce36baf3f90fe8a102db3de50dd71ff860d91be3df",
        "jina-v2-de",
    ),
    (
        "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4",
        "gpt-2",
    ),
    (
        "9e454714343b69b99b71795c1d27a68c2a1d15dab111f4d353109f966af29da7",
        "lfm2",
    ),
    (
        "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5",
        "llama-bpe",
    ),
    (
        "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754",
        "deepseek-llm",
    ),
    (
        "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821",
        "deepseek-coder",
    ),
    (
        "8aeee3860c56296a157a1fe2fad249ec40aa59b1bb5709f4ade11c4e6fe652ed",
        "falcon",
    ),
    (
        "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e",
        "falcon3",
    ),
    (
        "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166",
        "mpt",
    ),
    (
        "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34",
        "starcoder",
    ),
    (
        "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454",
        "gpt-2",
    ),
    (
        "32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3",
        "stablelm2",
    ),
    (
        "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff",
        "refact",
    ),
    (
        "9c2227e4dd922002fb81bde4fc02b0483ca4f12911410dee2255e4987644e3f8",
        "command-r",
    ),
    (
        "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea",
        "qwen2",
    ),
    (
        "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166",
        "olmo",
    ),
    (
        "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e",
        "dbrx",
    ),
    (
        "27949a2493fc4a9f53f5b9b029c82689cfbe5d3a1929bb25e043089e28466de6",
        "jina-v2-de",
    ),
    (
        "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d",
        "smaug-bpe",
    ),
    (
        "c7ea5862a53e4272c035c8238367063e2b270d51faa48c0f09e9d5b54746c360",
        "poro-chat",
    ),
    (
        "7fc505bd3104ca1083b150b17d088b59534ede9bde81f0dd2090967d7fe52cee",
        "viking",
    ),
    (
        "b53802fb28e26d645c3a310b34bfe07da813026ec7c7716883404d5e0f8b1901",
        "jais",
    ),
    (
        "7b3e7548e4308f52a76e8229e4e6cc831195d0d1df43aed21ac6c93da05fec5f",
        "codeshell",
    ),
    (
        "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e",
        "tekken",
    ),
    (
        "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249",
        "smollm",
    ),
    (
        "3c30d3ad1d6b64202cd222813e7736c2db6e1bd6d67197090fc1211fbc612ae7",
        "bloom",
    ),
    (
        "bc01ce58980e1db43859146dc51b1758b3b88729b217a74792e9f8d43e479d21",
        "gpt3-finnish",
    ),
    (
        "4e2b24cc4770243d65a2c9ec19770a72f08cffc161adbb73fcbb6b7dd45a0aae",
        "exaone",
    ),
    (
        "d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1",
        "megrez",
    ),
    (
        "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5",
        "deepseek-v3",
    ),
    (
        "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5",
        "deepseek-r1-qwen",
    ),
    (
        "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e",
        "gpt-4o",
    ),
    (
        "96a5f08be6259352137b512d4157e333e21df7edd3fcd152990608735a65b224",
        "bailingmoe",
    ),
    (
        "d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406",
        "llama4",
    ),
    (
        "0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3",
        "pixtral",
    ),
    (
        "d5f1dd6f980fec569fb218a81a7658ac45fc56b38c5a0adeb1c232fbe04ef5ec",
        "seed-coder",
    ),
    (
        "b0a6b1c0bd5998ebd9df08611efde34a4ff03faed45ae09c43e6b31ebd4b94cf",
        "a.x-4.0",
    ),
    (
        "f6791d196f87ce6b56a7d234be618e0d58f8cda3549416635b2bebcd22cd95c4",
        "midm-2.0",
    ),
    (
        "169bf0296a13c4d9b7672313f749eb36501d931022de052aad6e36f2bf34dd51",
        "lfm2",
    ),
    (
        "2085e1638f6c377a0aa4ead21b27bb4cb941bf800df86ed391011769c1758dfb",
        "exaone4",
    ),
    (
        "a1e163ecab2e718a4c829d1148b6e86824ec36163bb71941c3dca9cd5ac25756",
        "mellum",
    ),
    (
        "9b1be57e70d20d9501b2b3186e792d81181ae36ada3903c26f9fea418cf87206",
        "bailingmoe2",
    ),
    (
        "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4",
        "qwen35",
    ),
];

/// Names tried first: the pre-tokenizers of the architectures a folder can hold.
const LIKELY: &[&str] = &[
    "llama-bpe",
    "qwen2",
    "qwen35",
    "smollm",
    "tekken",
    "gpt-2",
    "deepseek-r1-qwen",
];

/// Python's `str(list_of_ints)`, hashed as convert hashes it.
fn chkhsh(ids: &[u32]) -> String {
    let text = format!(
        "[{}]",
        ids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The name convert would write to `tokenizer.ggml.pre`: for each candidate, encode
/// [`CHKTXT`] with smelt's implementation of that pre-tokenizer (with and without the BOS
/// the HF tokenizer may add) and look the hash up in convert's table.
fn detect_pre(md: &Metadata) -> Result<String, LoadError> {
    let mut names: Vec<&str> = LIKELY.to_vec();
    for (_, n) in KNOWN {
        if !names.contains(n) {
            names.push(n);
        }
    }
    let bos = md.get_u64("tokenizer.ggml.bos_token_id").map(|b| b as u32);
    let mut probe = md.clone();
    let mut hashes = Vec::new();
    // Names that split and merge alike give the same ids, hence the same hashes: each such
    // group is encoded once (a refused folder tries every name, and each try builds a
    // tokenizer and encodes CHKTXT).
    let mut tried = HashSet::new();
    for name in names {
        if let Some(key) = smelt_tokenizer::pre_tokenizer_key(name) {
            if !tried.insert(key) {
                continue;
            }
        }
        probe.insert("tokenizer.ggml.pre", Value::from(name));
        let Ok(tok) = smelt_tokenizer::Tokenizer::from_gguf(&probe) else {
            continue;
        };
        let ids = tok.encode(CHKTXT, false, false);
        let mut variants = vec![chkhsh(&ids)];
        if let Some(b) = bos {
            let mut with = vec![b];
            with.extend_from_slice(&ids);
            variants.push(chkhsh(&with));
        }
        for h in variants {
            if let Some((_, found)) = KNOWN.iter().rev().find(|(k, _)| *k == h) {
                return Ok((*found).to_string());
            }
            hashes.push(h);
        }
    }
    Err(err(format!(
        "the BPE pre-tokenizer of tokenizer.json is not one convert_hf_to_gguf.py knows \
         (none of smelt's {} pre-tokenizers reproduces a known chkhsh)",
        hashes.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chkhsh_formats_ids_like_python() {
        // Python: hashlib.sha256(str([1, 2, 3]).encode()).hexdigest()
        assert_eq!(
            chkhsh(&[1, 2, 3]),
            "a36b1f2c3f84522dd1005145646617d7054c0851e97c72a039c0bdfac9fa07f3"
        );
        assert_eq!(chkhsh(&[]).len(), 64);
        assert_ne!(chkhsh(&[1, 2]), chkhsh(&[12]));
    }

    #[test]
    fn likely_names_are_pre_tokenizers_smelt_implements() {
        for name in LIKELY {
            assert!(smelt_tokenizer::pre_tokenizer_key(name).is_some(), "{name}");
        }
    }

    #[test]
    fn qwen35_hashes_are_known() {
        // convert_hf_to_gguf.py's two Qwen3.5 entries: Qwen3.5-9B and MiniCPM-V 4.6
        for h in [
            "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4",
            "1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f",
        ] {
            let found = KNOWN.iter().rev().find(|(k, _)| *k == h);
            assert_eq!(found.map(|(_, n)| *n), Some("qwen35"), "{h}");
        }
        assert!(smelt_tokenizer::pre_tokenizer_key("qwen35").is_some());
    }

    #[test]
    fn special_looking_tokens() {
        assert!(looks_special("<|im_start|>"));
        assert!(looks_special("<unused12>"));
        assert!(!looks_special("hello"));
    }
}
