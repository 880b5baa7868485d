//! Sentence embeddings from a decoder model, as llama.cpp makes them: each input runs as a
//! sequence of its own, the final norm's rows (`t_embd`) are pooled (mean, first or last
//! token, by the GGUF's `{arch}.pooling_type` or the caller's choice) and L2-normalized.
//! `/v1/embeddings` is built on [`Engine::embed`].

use smelt_gguf::Gguf;

use crate::backend::cuda::runner::StepOut;
use crate::engine::Out;
use crate::{Engine, EngineError, Logits, SeqId, SeqInput};

/// How the rows of one input become its embedding (llama.cpp's `llama_pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's row.
    Mean,
    /// The first token's row (BERT's `[CLS]`).
    Cls,
    /// The last token's row (decoder embedding models such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// `mean`, `cls` or `last`.
    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// What the GGUF says about pooling (`{arch}.pooling_type`, llama.cpp's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilePooling {
    /// No key, or `none` (0): per-token output; llama.cpp's server refuses OpenAI embeddings
    /// for it, smelt pools by the mean unless told otherwise.
    Unset,
    Pool(Pooling),
    /// `rank` (4): a reranker whose output is a score, not an embedding.
    Rank,
    /// A number llama.cpp does not define.
    Unknown(i64),
}

/// Reads `{arch}.pooling_type`.
pub fn file_pooling(gguf: &Gguf) -> FilePooling {
    let m = gguf.metadata();
    let Some(arch) = m.get_str("general.architecture") else {
        return FilePooling::Unset;
    };
    let key = format!("{arch}.pooling_type");
    let v = m
        .get_i64(&key)
        .or_else(|| m.get_u64(&key).and_then(|v| i64::try_from(v).ok()));
    match v {
        None | Some(-1) | Some(0) => FilePooling::Unset,
        Some(1) => FilePooling::Pool(Pooling::Mean),
        Some(2) => FilePooling::Pool(Pooling::Cls),
        Some(3) => FilePooling::Pool(Pooling::Last),
        Some(4) => FilePooling::Rank,
        Some(n) => FilePooling::Unknown(n),
    }
}

/// Scales `v` to unit L2 length as llama.cpp's `common_embd_normalize(.., 2)` does (the sum
/// of squares in f64); a zero vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// One input on its way through [`Engine::embed`].
struct Pending {
    seq: SeqId,
    fed: usize,
    /// Sum of the rows so far (mean), or the chosen row.
    acc: Vec<f32>,
}

impl Engine {
    /// Embeds each of `inputs` (token ids, BOS already added as the model wants): one fresh
    /// sequence per input, run in steps of at most `step_tokens` tokens (several short inputs
    /// share a step while the free KV blocks hold them all), pooled by `pooling`; not
    /// normalized. Every sequence is freed before it returns, on success or not. An empty
    /// input is refused; one that needs more KV blocks than are free is refused at once
    /// ([`EngineError::OutOfKvBlocks`], before any compute), so a caller can retry it once
    /// running sequences have freed theirs.
    pub fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        pooling: Pooling,
        step_tokens: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        if let Some(i) = inputs.iter().position(Vec::is_empty) {
            return Err(EngineError::BadOptions(format!("input {i} has no tokens")));
        }
        let n_embd = self.info().n_embd;
        let bs = self.block_size().max(1);
        let free = self.free_blocks();
        if let Some(need) = inputs.iter().map(|t| t.len().div_ceil(bs)).max() {
            if need > free {
                return Err(EngineError::OutOfKvBlocks { need, free });
            }
        }
        let mut pending: Vec<Pending> = Vec::with_capacity(inputs.len());
        let result = (|| {
            for _ in inputs {
                let seq = self.new_sequence();
                pending.push(Pending {
                    seq,
                    fed: 0,
                    acc: vec![0.0; n_embd],
                });
            }
            let budget = step_tokens.max(1);
            let mut next = 0; // first input not fully fed
            while next < inputs.len() {
                // Fill one step: the rest of the current input, then the next ones' starts.
                let mut batch = Vec::new();
                let mut owners = Vec::new();
                let mut room = budget;
                let mut blocks = self.free_blocks();
                let mut i = next;
                while i < inputs.len() && room > 0 {
                    let p = &pending[i];
                    let toks = &inputs[i][p.fed..];
                    let take = toks.len().min(room);
                    // The blocks this slice adds; the first input always fits (checked above:
                    // it holds no other input's blocks).
                    let grow = (p.fed + take).div_ceil(bs) - p.fed.div_ceil(bs);
                    if grow > blocks && i > next {
                        break;
                    }
                    blocks = blocks.saturating_sub(grow);
                    room -= take;
                    batch.push(SeqInput {
                        seq: p.seq,
                        tokens: toks[..take].to_vec(),
                        // The rows come back from a hidden step for `All` (every row).
                        logits: Logits::All,
                    });
                    owners.push((i, p.fed, take));
                    i += 1;
                }
                let flat = match self.step(&batch, Out::Hidden)? {
                    StepOut::Logits(h) => h,
                    StepOut::Tokens(_) => {
                        return Err(EngineError::BadOptions("a hidden step gave tokens".into()))
                    }
                };
                let mut rows = flat.chunks(n_embd.max(1));
                for &(i, start, take) in &owners {
                    let len = inputs[i].len();
                    let p = &mut pending[i];
                    for (j, row) in rows.by_ref().take(take).enumerate() {
                        let pos = start + j;
                        match pooling {
                            Pooling::Mean => p.acc.iter_mut().zip(row).for_each(|(a, &r)| *a += r),
                            Pooling::Cls if pos == 0 => p.acc.copy_from_slice(row),
                            Pooling::Last if pos + 1 == len => p.acc.copy_from_slice(row),
                            _ => {}
                        }
                    }
                    p.fed += take;
                    if p.fed == len {
                        self.free_sequence(p.seq);
                        next = next.max(i + 1);
                    }
                }
            }
            Ok(())
        })();
        // Sequences fed in full were freed as they finished; an early return leaves others.
        for (p, toks) in pending.iter().zip(inputs) {
            if p.fed < toks.len() {
                self.free_sequence(p.seq);
            }
        }
        result?;
        Ok(pending
            .into_iter()
            .zip(inputs)
            .map(|(mut p, toks)| {
                if pooling == Pooling::Mean {
                    let inv = 1.0 / toks.len() as f32;
                    p.acc.iter_mut().for_each(|a| *a *= inv);
                }
                p.acc
            })
            .collect())
    }
}
