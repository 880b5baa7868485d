//! Real model shapes `smelt synth` can build: the hyper-parameters of each published model
//! and the tensors its llama.cpp architecture expects.

/// One model's geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub name: &'static str,
    /// llama.cpp architecture name (`general.architecture`).
    pub arch: &'static str,
    pub n_layer: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    /// Width of one attention head (usually `n_embd / n_head`; Qwen3 decouples it).
    pub head_dim: u64,
    pub n_vocab: u64,
    pub n_ctx_train: u64,
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// The output projection reuses the token embeddings (no `output.weight`).
    pub tied_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms on each head's q and k (Qwen3).
    pub qk_norm: bool,
}

const fn llama(
    name: &'static str,
    n_layer: u64,
    n_embd: u64,
    n_ff: u64,
    n_head: u64,
    n_head_kv: u64,
) -> ModelShape {
    ModelShape {
        name,
        arch: "llama",
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        head_dim: n_embd / n_head,
        n_vocab: 128256,
        n_ctx_train: 8192,
        rope_freq_base: 500000.0,
        rms_eps: 1e-5,
        tied_embeddings: false,
        qkv_bias: false,
        qk_norm: false,
    }
}

pub const SHAPES: [ModelShape; 6] = [
    llama("llama3-8b", 32, 4096, 14336, 32, 8),
    ModelShape {
        n_ctx_train: 131072,
        tied_embeddings: true,
        ..llama("llama3-1b", 16, 2048, 8192, 32, 8)
    },
    ModelShape {
        arch: "qwen3",
        head_dim: 128,
        n_vocab: 151936,
        n_ctx_train: 40960,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        ..llama("qwen3-32b", 64, 5120, 25600, 64, 8)
    },
    ModelShape {
        arch: "qwen2",
        n_vocab: 151936,
        n_ctx_train: 32768,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: true,
        qkv_bias: true,
        ..llama("qwen2.5-0.5b", 24, 896, 4864, 14, 2)
    },
    ModelShape {
        n_vocab: 32768,
        n_ctx_train: 32768,
        rope_freq_base: 1_000_000.0,
        ..llama("mistral-7b", 32, 4096, 14336, 32, 8)
    },
    ModelShape {
        n_vocab: 32000,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        ..llama("llama2-7b", 32, 4096, 11008, 32, 32)
    },
];

pub fn find(name: &str) -> Option<&'static ModelShape> {
    SHAPES.iter().find(|s| s.name.eq_ignore_ascii_case(name))
}

pub fn names() -> String {
    SHAPES.map(|s| s.name).join(", ")
}

impl ModelShape {
    /// Every tensor, in the order llama.cpp's converters write them, with ggml shapes
    /// (row length first).
    pub fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (e, f, v) = (self.n_embd, self.n_ff, self.n_vocab);
        let q = self.n_head * self.head_dim;
        let kv = self.n_head_kv * self.head_dim;
        let mut out = vec![
            ("token_embd.weight".to_string(), vec![e, v]),
            ("output_norm.weight".to_string(), vec![e]),
        ];
        if !self.tied_embeddings {
            out.push(("output.weight".to_string(), vec![e, v]));
        }
        for i in 0..self.n_layer {
            let mut push = |n: &str, s: Vec<u64>| out.push((format!("blk.{i}.{n}"), s));
            push("attn_norm.weight", vec![e]);
            push("attn_q.weight", vec![e, q]);
            push("attn_k.weight", vec![e, kv]);
            push("attn_v.weight", vec![e, kv]);
            if self.qkv_bias {
                push("attn_q.bias", vec![q]);
                push("attn_k.bias", vec![kv]);
                push("attn_v.bias", vec![kv]);
            }
            if self.qk_norm {
                push("attn_q_norm.weight", vec![self.head_dim]);
                push("attn_k_norm.weight", vec![self.head_dim]);
            }
            push("attn_output.weight", vec![q, e]);
            push("ffn_norm.weight", vec![e]);
            push("ffn_gate.weight", vec![e, f]);
            push("ffn_up.weight", vec![e, f]);
            push("ffn_down.weight", vec![f, e]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_match_the_published_models() {
        let params = |s: &ModelShape| -> u64 {
            s.tensors()
                .iter()
                .map(|(_, d)| d.iter().product::<u64>())
                .sum()
        };
        let billions = |name| find(name).map(|s| params(s) as f64 / 1e9).unwrap_or(0.0);
        assert!(
            (billions("llama3-8b") - 8.03).abs() < 0.02,
            "{}",
            billions("llama3-8b")
        );
        assert!(
            (billions("llama3-1b") - 1.24).abs() < 0.02,
            "{}",
            billions("llama3-1b")
        );
        assert!(
            (billions("qwen3-32b") - 32.8).abs() < 0.1,
            "{}",
            billions("qwen3-32b")
        );
        assert!(
            (billions("qwen2.5-0.5b") - 0.494).abs() < 0.01,
            "{}",
            billions("qwen2.5-0.5b")
        );
        assert!(
            (billions("mistral-7b") - 7.25).abs() < 0.02,
            "{}",
            billions("mistral-7b")
        );
        assert!(
            (billions("llama2-7b") - 6.74).abs() < 0.02,
            "{}",
            billions("llama2-7b")
        );
    }

    #[test]
    fn qwen3_queries_are_wider_than_the_embedding() {
        let s = find("qwen3-32b").expect("shape exists");
        let t = s.tensors();
        let q = t
            .iter()
            .find(|(n, _)| n == "blk.0.attn_q.weight")
            .map(|(_, d)| d.clone());
        assert_eq!(q, Some(vec![5120, 8192]));
        assert!(t.iter().any(|(n, _)| n == "blk.63.attn_k_norm.weight"));
    }
}
