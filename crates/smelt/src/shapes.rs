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
    /// Llama 3.1-style rope scaling, written as the `rope_freqs.weight` tensor.
    pub rope_llama3: Option<Llama3Rope>,
    /// Standard deviation of the random matrices and biases. Real shapes use 0.02 (sane
    /// activations for speed runs); the tiny test shapes use more, so that logits are
    /// peaked and greedy parity tests compare architectures rather than rounding.
    pub weight_std: f32,
    /// Norm weights are 1 plus N(0, norm_std): 0 for real shapes; the tiny ones jitter them
    /// so a norm weight applied to the wrong tensor shows in the output.
    pub norm_std: f32,
    /// A routed mixture of experts in place of every dense FFN (`n_ff` then only goes to
    /// the metadata, as in the published files).
    pub moe: Option<MoeShape>,
    /// Gated DeltaNet layers with gated attention every few (Qwen3.5/3.6).
    pub hybrid: Option<HybridShape>,
}

/// The linear-attention side of a hybrid (`{arch}.ssm.*`, `full_attention_interval`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HybridShape {
    /// Every this-many-th layer is attention, the others Gated DeltaNet.
    pub full_attention_interval: u64,
    pub conv_kernel: u64,
    /// Size of each delta-net head.
    pub head_dim: u64,
    pub n_k_heads: u64,
    pub n_v_heads: u64,
    /// Rotated dimensions of each attention head (partial rope) and their M-RoPE sections
    /// (Qwen3.5; Qwen3-Next has plain NeoX rope).
    pub n_rot: u64,
    pub rope_sections: Option<[i32; 4]>,
}

impl HybridShape {
    pub fn is_recurrent(&self, il: u64) -> bool {
        (il + 1) % self.full_attention_interval != 0
    }
}

/// The experts of a MoE model (`{arch}.expert_*` metadata and the `*_exps` tensors).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeShape {
    pub n_expert: u64,
    pub n_expert_used: u64,
    /// Hidden size of one expert.
    pub n_ff_exp: u64,
    /// Hidden size of the always-on shared expert (0: none).
    pub n_ff_shared: u64,
}

/// Llama 3.1's `rope_scaling` (`rope_type: llama3`): long wavelengths are divided by
/// `factor`, short ones kept, the band between interpolated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_context: f32,
}

impl Llama3Rope {
    /// Llama 3.1 8B/70B/405B and 3.2's values.
    pub const LLAMA_3_1: Llama3Rope = Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context: 8192.0,
    };

    /// One factor per rotated pair, as llama.cpp's converter computes `rope_freqs.weight`
    /// (`LlamaModel.generate_extra_tensors`): llama.cpp divides each pair's angle by it.
    pub fn factors(&self, freq_base: f32, n_rot: u64) -> Vec<f32> {
        let base = f64::from(freq_base);
        let (factor, low, high, ctx) = (
            f64::from(self.factor),
            f64::from(self.low_freq_factor),
            f64::from(self.high_freq_factor),
            f64::from(self.original_context),
        );
        let (low_wavelen, high_wavelen) = (ctx / low, ctx / high);
        (0..n_rot / 2)
            .map(|i| {
                let freq = 1.0 / base.powf((2 * i) as f64 / n_rot as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let f = if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor
                } else {
                    let smooth = (ctx / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                };
                f as f32
            })
            .collect()
    }
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
        rope_llama3: None,
        weight_std: 0.02,
        norm_std: 0.0,
        moe: None,
        hybrid: None,
    }
}

/// Test shapes: two layers, 256 wide, each with its architecture's distinguishing parts,
/// weights large enough that greedy decoding is decided by wide logit margins.
const fn tiny(name: &'static str, n_head: u64, n_head_kv: u64) -> ModelShape {
    ModelShape {
        weight_std: 0.08,
        norm_std: 0.2,
        n_ctx_train: 4096,
        ..llama(name, 2, 256, 512, n_head, n_head_kv)
    }
}

/// The tiny hybrid MoE shapes (Qwen3-Next, Qwen3.5-MoE): delta, delta, attention; 16
/// experts of 256 (4 per token) and a shared one; they differ in their rope sections.
const fn tiny_hybrid_moe(
    name: &'static str,
    arch: &'static str,
    rope_sections: Option<[i32; 4]>,
) -> ModelShape {
    ModelShape {
        arch,
        n_layer: 3,
        head_dim: 128,
        rope_freq_base: 10_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        moe: Some(MoeShape {
            n_expert: 16,
            n_expert_used: 4,
            n_ff_exp: 256,
            n_ff_shared: 256,
        }),
        hybrid: Some(HybridShape {
            full_attention_interval: 3,
            conv_kernel: 4,
            head_dim: 64,
            n_k_heads: 2,
            n_v_heads: 4,
            n_rot: 32,
            rope_sections,
        }),
        ..tiny(name, 4, 2)
    }
}

pub const SHAPES: [ModelShape; 20] = [
    // Llama 3.0: no rope scaling (3.1 added it).
    llama("llama3-8b", 32, 4096, 14336, 32, 8),
    // Llama 3.1 70B (about 40 GB at Q4_K): the size that needs two 80 GB GPUs
    // (tensor parallelism, issue 19).
    ModelShape {
        rope_llama3: Some(Llama3Rope::LLAMA_3_1),
        n_ctx_train: 131072,
        ..llama("llama3-70b", 80, 8192, 28672, 64, 8)
    },
    // Llama 3.2 1B: rope scaling factor 32.
    ModelShape {
        rope_llama3: Some(Llama3Rope {
            factor: 32.0,
            ..Llama3Rope::LLAMA_3_1
        }),
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
    // Qwen3-14B (config.json): 40 layers, 40 query / 8 KV heads of 128, untied output; the
    // largest bf16 shape whose file and a quantized copy fit a 64 GB disk (load benchmarks).
    ModelShape {
        arch: "qwen3",
        head_dim: 128,
        n_vocab: 151936,
        n_ctx_train: 40960,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        ..llama("qwen3-14b", 40, 5120, 17408, 40, 8)
    },
    // Qwen3-30B-A3B (config.json): 48 layers, heads of 128, 128 experts of 768, 8 per token.
    ModelShape {
        arch: "qwen3moe",
        head_dim: 128,
        n_vocab: 151936,
        n_ctx_train: 40960,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        moe: Some(MoeShape {
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
            n_ff_shared: 0,
        }),
        ..llama("qwen3-30b-a3b", 48, 2048, 6144, 32, 4)
    },
    // Qwen3.6-27B (and Qwen3.5-27B; model card and config.json): 64 layers, 16 x (3 Gated
    // DeltaNet + 1 gated attention), delta-net heads of 128 (48 value over 16 key heads),
    // attention 24 query / 4 KV heads of 256 with 64 rotated dimensions.
    ModelShape {
        arch: "qwen35",
        head_dim: 256,
        n_vocab: 248320,
        n_ctx_train: 262144,
        rope_freq_base: 10_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        hybrid: Some(HybridShape {
            full_attention_interval: 4,
            conv_kernel: 4,
            head_dim: 128,
            n_k_heads: 16,
            n_v_heads: 48,
            n_rot: 64,
            rope_sections: Some([11, 11, 10, 0]),
        }),
        ..llama("qwen3.6-27b", 64, 5120, 17408, 24, 4)
    },
    // Qwen3-Next-80B-A3B (config.json): 48 layers, 12 x (3 Gated DeltaNet + 1 gated
    // attention), delta-net heads of 128 (32 value over 16 key heads), attention 16 query /
    // 2 KV heads of 256 with 64 rotated dimensions, 512 experts of 512 (10 per token) and a
    // shared expert of 512.
    ModelShape {
        arch: "qwen3next",
        head_dim: 256,
        n_vocab: 151936,
        n_ctx_train: 262144,
        rope_freq_base: 10_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        moe: Some(MoeShape {
            n_expert: 512,
            n_expert_used: 10,
            n_ff_exp: 512,
            n_ff_shared: 512,
        }),
        hybrid: Some(HybridShape {
            full_attention_interval: 4,
            conv_kernel: 4,
            head_dim: 128,
            n_k_heads: 16,
            n_v_heads: 32,
            n_rot: 64,
            rope_sections: None,
        }),
        ..llama("qwen3-next-80b-a3b", 48, 2048, 5120, 16, 2)
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
    // Llama 3.1 rope scaling with an original context of 64 rather than 8192, so that the
    // scaled and interpolated pairs turn by visible angles within a short test prompt.
    ModelShape {
        rope_llama3: Some(Llama3Rope {
            original_context: 64.0,
            ..Llama3Rope::LLAMA_3_1
        }),
        ..tiny("llama3-tiny", 8, 2)
    },
    // Mistral 7B v0.1/v0.3 are GGUF `llama` models: grouped-query attention (4 query heads
    // per KV head) and rope base 1e6. llama.cpp applies no sliding window to them.
    ModelShape {
        rope_freq_base: 1_000_000.0,
        ..tiny("mistral-tiny", 8, 2)
    },
    ModelShape {
        arch: "qwen2",
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: true,
        qkv_bias: true,
        ..tiny("qwen2-tiny", 4, 2)
    },
    // Heads of 128 under a 256-wide embedding: queries 512 wide, as Qwen3 decouples them.
    ModelShape {
        arch: "qwen3",
        head_dim: 128,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        ..tiny("qwen3-tiny", 4, 2)
    },
    // Qwen3-MoE: Qwen3's attention, 16 experts of 256 (K-quant rows), 4 per token.
    ModelShape {
        arch: "qwen3moe",
        head_dim: 128,
        rope_freq_base: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        moe: Some(MoeShape {
            n_expert: 16,
            n_expert_used: 4,
            n_ff_exp: 256,
            n_ff_shared: 0,
        }),
        ..tiny("qwen3moe-tiny", 4, 2)
    },
    // Mixtral: Llama's attention (heads of 64, four per KV head) with 8 experts of 256,
    // 2 per token (GGUF `llama` with `expert_count`).
    ModelShape {
        rope_freq_base: 1_000_000.0,
        moe: Some(MoeShape {
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            n_ff_shared: 0,
        }),
        ..tiny("mixtral-tiny", 4, 1)
    },
    // Qwen3.5 hybrid: delta, delta, attention; 4 value heads of 64 over 2 key heads.
    ModelShape {
        arch: "qwen35",
        n_layer: 3,
        head_dim: 128,
        rope_freq_base: 10_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        hybrid: Some(HybridShape {
            full_attention_interval: 3,
            conv_kernel: 4,
            head_dim: 64,
            n_k_heads: 2,
            n_v_heads: 4,
            n_rot: 32,
            rope_sections: Some([6, 5, 5, 0]),
        }),
        ..tiny("qwen35-tiny", 4, 2)
    },
    // Qwen3-Next: delta, delta, attention; 16 experts of 256 (4 per token) and a shared one.
    tiny_hybrid_moe("qwen3next-tiny", "qwen3next", None),
    // Qwen3.5-MoE: Qwen3.5's layers (sectioned rope, tiled value heads) with 16 experts of
    // 256 (4 per token) and a gated shared expert.
    tiny_hybrid_moe("qwen35moe-tiny", "qwen35moe", Some([6, 5, 5, 0])),
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
        let mut out = Vec::new();
        if self.rope_llama3.is_some() {
            out.push(("rope_freqs.weight".to_string(), vec![self.head_dim / 2]));
        }
        out.push(("token_embd.weight".to_string(), vec![e, v]));
        out.push(("output_norm.weight".to_string(), vec![e]));
        if !self.tied_embeddings {
            out.push(("output.weight".to_string(), vec![e, v]));
        }
        for i in 0..self.n_layer {
            let mut push = |n: &str, s: Vec<u64>| out.push((format!("blk.{i}.{n}"), s));
            if let Some(h) = &self.hybrid {
                push("attn_norm.weight", vec![e]);
                push("post_attention_norm.weight", vec![e]);
                if h.is_recurrent(i) {
                    let (kd, vd) = (h.n_k_heads * h.head_dim, h.n_v_heads * h.head_dim);
                    push("attn_qkv.weight", vec![e, 2 * kd + vd]);
                    push("attn_gate.weight", vec![e, vd]);
                    push("ssm_conv1d.weight", vec![h.conv_kernel, 2 * kd + vd]);
                    push("ssm_dt.bias", vec![h.n_v_heads]);
                    push("ssm_a", vec![h.n_v_heads]);
                    if self.arch == "qwen3next" {
                        push("ssm_ba.weight", vec![e, 2 * h.n_v_heads]);
                    } else {
                        push("ssm_beta.weight", vec![e, h.n_v_heads]);
                        push("ssm_alpha.weight", vec![e, h.n_v_heads]);
                    }
                    push("ssm_norm.weight", vec![h.head_dim]);
                    push("ssm_out.weight", vec![vd, e]);
                } else {
                    push("attn_q.weight", vec![e, 2 * q]);
                    push("attn_k.weight", vec![e, kv]);
                    push("attn_v.weight", vec![e, kv]);
                    push("attn_output.weight", vec![q, e]);
                    push("attn_q_norm.weight", vec![self.head_dim]);
                    push("attn_k_norm.weight", vec![self.head_dim]);
                }
                match self.moe {
                    Some(m) => {
                        let (ne, fe, fs) = (m.n_expert, m.n_ff_exp, m.n_ff_shared);
                        push("ffn_gate_inp.weight", vec![e, ne]);
                        push("ffn_gate_exps.weight", vec![e, fe, ne]);
                        push("ffn_up_exps.weight", vec![e, fe, ne]);
                        push("ffn_down_exps.weight", vec![fe, e, ne]);
                        if fs > 0 {
                            push("ffn_gate_inp_shexp.weight", vec![e]);
                            push("ffn_gate_shexp.weight", vec![e, fs]);
                            push("ffn_up_shexp.weight", vec![e, fs]);
                            push("ffn_down_shexp.weight", vec![fs, e]);
                        }
                    }
                    None => {
                        push("ffn_gate.weight", vec![e, f]);
                        push("ffn_up.weight", vec![e, f]);
                        push("ffn_down.weight", vec![f, e]);
                    }
                }
                continue;
            }
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
            match self.moe {
                Some(m) => {
                    let (ne, fe) = (m.n_expert, m.n_ff_exp);
                    push("ffn_gate_inp.weight", vec![e, ne]);
                    push("ffn_gate_exps.weight", vec![e, fe, ne]);
                    push("ffn_up_exps.weight", vec![e, fe, ne]);
                    push("ffn_down_exps.weight", vec![fe, e, ne]);
                }
                None => {
                    push("ffn_gate.weight", vec![e, f]);
                    push("ffn_up.weight", vec![e, f]);
                    push("ffn_down.weight", vec![f, e]);
                }
            }
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
            (billions("llama3-70b") - 70.55).abs() < 0.05,
            "llama3-70b: {}",
            billions("llama3-70b")
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
            (billions("qwen3-14b") - 14.77).abs() < 0.05,
            "{}",
            billions("qwen3-14b")
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
        // Qwen3.6-27B's text model: 26.9B (the checkpoint's 27.8B adds the vision encoder
        // and the multi-token-prediction layer).
        assert!(
            (billions("qwen3.6-27b") - 26.9).abs() < 0.1,
            "{}",
            billions("qwen3.6-27b")
        );
        // Qwen3-Next-80B-A3B: 80B in all.
        assert!(
            (billions("qwen3-next-80b-a3b") - 79.7).abs() < 0.5,
            "{}",
            billions("qwen3-next-80b-a3b")
        );
        // Qwen3-30B-A3B: 30.5B in all.
        assert!(
            (billions("qwen3-30b-a3b") - 30.5).abs() < 0.1,
            "{}",
            billions("qwen3-30b-a3b")
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

    #[test]
    fn llama3_rope_factors_follow_the_converter() {
        // Llama 3.1 8B (base 500000, 128-wide heads): the first 29 pairs keep their angle,
        // pairs 35 on are divided by 8, and the band between is interpolated.
        let f = Llama3Rope::LLAMA_3_1.factors(500000.0, 128);
        assert_eq!(f.len(), 64);
        assert!(f[..29].iter().all(|&x| x == 1.0), "{f:?}");
        assert!(f[35..].iter().all(|&x| x == 8.0), "{f:?}");
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0), "{f:?}");
        // The tiny test shape scales pairs a short prompt already turns.
        let t = find("llama3-tiny").expect("shape exists");
        let r = t.rope_llama3.expect("rope scaling");
        let f = r.factors(t.rope_freq_base, t.head_dim);
        assert_eq!(f.len(), 16);
        assert_eq!(&f[..2], &[1.0, 1.0]);
        assert!(f[2] > 1.0 && f[2] < 8.0, "{f:?}");
        assert!(f[3..].iter().all(|&x| x == 8.0), "{f:?}");
    }

    #[test]
    fn tiny_shapes_keep_their_architecture_parts() {
        let has = |shape: &str, tensor: &str| {
            find(shape)
                .expect("shape exists")
                .tensors()
                .iter()
                .any(|(n, _)| n == tensor)
        };
        assert!(has("llama3-tiny", "rope_freqs.weight"));
        assert!(has("qwen2-tiny", "blk.1.attn_v.bias"));
        assert!(has("qwen3-tiny", "blk.1.attn_k_norm.weight"));
        assert!(!has("mistral-tiny", "rope_freqs.weight"));
        assert!(has("mixtral-tiny", "blk.1.ffn_gate_exps.weight"));
        assert!(!has("mixtral-tiny", "blk.1.attn_q_norm.weight"));
        let m = find("mistral-tiny").expect("shape exists");
        assert_eq!(m.n_head / m.n_head_kv, 4, "grouped-query attention");
    }
}
