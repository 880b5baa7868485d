//! Every setting of the CUDA backend, read once when it opens, in one documented place.
//!
//! Most of them are measurement switches (a fusion off, a crossover moved) that the
//! benchmark scripts under `bench/gpu/` flip to time one change against another in a
//! single device call; the defaults are what those measurements chose (`bench/RESULTS.md`).
//! The one a user sets, `batch_invariant`, arrives through `EngineOptions`.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `SMELT_CUDA_BATCH_INVARIANT=1` | `batch_invariant` | off |
//! | **fusions** | `fuse` ([`FuseOptions`]) | |
//! | `SMELT_CUDA_FUSED=0` | every fusion below off (`quantize` included) | on |
//! | `SMELT_CUDA_SPLIT_NORM=0` | `fuse.split_norm` | on |
//! | `SMELT_CUDA_FUSE_F16_ROWS=0` | `fuse.f16_rows` | on |
//! | `SMELT_CUDA_GROUP_GEMM=0` | `fuse.group_gemm` | on |
//! | `SMELT_CUDA_ATTN_COMBINE=0` | `fuse.attn_combine` | on |
//! | `SMELT_CUDA_ROPE_KV=0` | `fuse.rope_kv` | on |
//! | `SMELT_CUDA_GEMV_ROPE=0` | `fuse.gemv_rope_kv` | on |
//! | `SMELT_CUDA_ROPE_KV_ROWS=0` | `fuse.rope_kv_rows` | on |
//! | `SMELT_CUDA_ATTN_F16_ROWS=0` | `fuse.attn_f16_rows` | on |
//! | `SMELT_CUDA_GLU_REDUCE=0` | `fuse.glu_reduce` | on |
//! | `SMELT_CUDA_MOE_FUSE=0` | `fuse.moe` | on |
//! | `SMELT_CUDA_HEAD_NORMS=0` | `fuse.head_norms` | on |
//! | `SMELT_CUDA_HEAD_NORMS_ROPE=0` | `fuse.head_norms_rope` | on |
//! | `SMELT_CUDA_SPLIT_FIXUP=1` | `fuse.split_fixup` | off (slower: bench/RESULTS.md 2026-11-27 14:00 UTC) |
//! | **matmul kernel choice** | `matmul` ([`MatmulOptions`]) | |
//! | `SMELT_CUDA_GEMV_R1_ROWS`, `_R4_ROWS` | `matmul.gemv_rows` | off |
//! | `SMELT_CUDA_GEMM_MIN` | `matmul.gemm_min_tokens` | `gemm::MIN_TOKENS` |
//! | `SMELT_CUDA_GEMM_F16_MIN` | `matmul.gemm_f16_min_tokens` | the measured rule (`gemm::f16::preferred`) |
//! | `SMELT_CUDA_GEMM_NARROW_MIN` | `matmul.gemm_narrow_min_tokens` | `gemm::narrow::min_tokens` per type (Q4_K and Q8_0 8, Q6_K 16) |
//! | `SMELT_CUDA_GEMM_NARROW_MAX` (0: off) | `matmul.gemm_narrow_max_tokens` | `gemm::narrow::MAX_TOKENS` (64, measured) |
//! | `SMELT_CUDA_GEMM_NARROW_SPLITS` | `matmul.narrow_max_splits` | none (`gemm::narrow::splits`'s wave-fill rule; a cap of 4 measured the same, 2 -18%) |
//! | `SMELT_CUDA_GEMM_NARROW_WIDTH` (8, 16, 32 or 64) | `matmul.narrow_max_width` | `gemm::narrow::DEFAULT_MAX_WIDTH` |
//! | `SMELT_CUDA_GEMM_NARROW_ROWS` (32, 16, or 16p: 16 with a two-tile ring) | `matmul.narrow_layout` | `gemm::narrow::default_layout_for` (per type and token width) |
//! | `SMELT_CUDA_GEMM_SMALL_MAX` (0: off) | `matmul.gemm_small_max_tokens` | `gemm::f16_small::MAX_TOKENS` (64, measured) |
//! | `SMELT_CUDA_MOE_GEMM_MIN` | `matmul.moe_gemm_min_per_expert` | `gemm::grouped::MIN_PER_EXPERT` (measured) |
//! | `SMELT_CUDA_MOE_LANES` (32, 16 or 8) | `matmul.moe_gemv_lanes` | `moe::row_lanes` (the fewest lanes a row's tiles fill) |
//! | **attention** | `attention` ([`AttentionOptions`]) | |
//! | `SMELT_CUDA_FLASH_SEQS` | `attention.flash_decode_seqs` | [`super::FLASH_DECODE_SEQS`] |
//! | `SMELT_CUDA_SPLITS` | `attention.splits` | one block per SM |
//! | `SMELT_CUDA_ATTN_STAGE` | `attention.stage` | 32 |
//! | `SMELT_CUDA_DELTA_CHUNK_MIN` (0: always) | `attention.delta_chunk_min_tokens` | [`super::DELTA_CHUNK_MIN_TOKENS`] (never when batch-invariant) |
//! | **launches and loading** | `launch` ([`LaunchOptions`]) | |
//! | `SMELT_CUDA_GRAPHS=0` | `launch.graphs` | on (off while profiling) |
//! | `SMELT_CUDA_ARGMAX_SPLIT=0` | `launch.split_argmax` | on |
//! | `SMELT_CUDA_UPLOAD=plain` | `launch.plain_upload` | off |
//! | `SMELT_CUDA_LAYER_SCRATCH=0` | `launch.layer_scratch` | on (layers reuse scratch: `arena::StepScratch`) |
//! | `SMELT_CUDA_PDL`, `_PDL_AFTER`, `_EARLY_SKIP`, `_CARVEOUT`, `_TIMELINE`, `_LOAD_LOG` | `launch.gpu` ([`smelt_cuda::GpuOptions`], its table) | the catalog's |
//! | **measurement and debugging** | `debug` ([`DebugOptions`]) | |
//! | `SMELT_CUDA_PROFILE=1` / `all` | `debug.profile` | off |
//! | `SMELT_CUDA_DIGEST=1` | `debug.digest` | off |
//! | `SMELT_CUDA_WEIGHT_DIGEST=1` | `debug.weight_digest` | off |
//! | `SMELT_CUDA_SKIP` | `debug.skip` | none |
//! | **tensor parallelism** | `tp` ([`TpOptions`]) | |
//! | `SMELT_TP_PEER=0` | `tp.peer_all_reduce` | on (exact and faster than NCCL on 2 and 4 H100s) |
//! | `SMELT_TP_PEER_MAX` (bytes; 0: NCCL only) | `tp.peer_all_reduce_max` | `allreduce::default_max_bytes` |
//! | `SMELT_TP_SKIP_ALLREDUCE=1` | `tp.skip_all_reduce` | off |
//! | `SMELT_TP_VOCAB=0` | `tp.vocab_parallel` | on (more than one rank, an untied head) |
//! | `SMELT_TP_FUSE=1` | `tp.fuse_norm` | off (measured slower; at most 4 rows) |
//!
//! Nothing else under `backend::cuda`, `smelt-cuda` or `smelt-kernels` reads a `SMELT_CUDA_*`
//! variable: code that needs one takes it from these structs.

use smelt_cuda::GpuOptions;
use smelt_kernels::gemm;

/// Which steps `SMELT_CUDA_PROFILE` times kernel by kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Off,
    /// Decode steps (one token per sequence).
    Decode,
    /// Every step, prompt chunks too.
    All,
}

/// The CUDA backend's settings, grouped by job (see the module doc for the variables).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Results independent of the batch (`EngineOptions::batch_invariant`): every matmul on
    /// the GEMM split by shape alone, every attention on the prompt kernel (it also sets
    /// the matmul choices below).
    pub batch_invariant: bool,
    pub fuse: FuseOptions,
    pub matmul: MatmulOptions,
    pub attention: AttentionOptions,
    pub launch: LaunchOptions,
    pub debug: DebugOptions,
    pub tp: TpOptions,
}

/// Which kernels take over their neighbours' work (each on by default; off to measure it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseOptions {
    /// Whole-row norms, the GLU and the attention's combine write the q8_1 tiles of their
    /// output too.
    pub quantize: bool,
    /// With `quantize`, the norms and the GLU of a step whose matmuls take the narrow GEMM
    /// (`matmul_choice::fused_sink`) write its f16 rows instead of q8_1 tiles.
    pub f16_rows: bool,
    /// A group's members (Q|K|V, gate|up) of many tokens run as one narrow GEMM launch
    /// whose split reduce writes each member apart (`gemm::members`).
    pub group_gemm: bool,
    /// A decode row's residual add and RMS norm run inside the GEMVs around them.
    pub split_norm: bool,
    /// The attention's last block per group combines the splits and writes q8_1 tiles.
    pub attn_combine: bool,
    /// A decode row's rope of Q|K and its KV append run as one kernel.
    pub rope_kv: bool,
    /// With `rope_kv`, the Q|K|V GEMV does them in its epilogue.
    pub gemv_rope_kv: bool,
    /// A step of many rows ropes Q and K and appends K and V in one kernel
    /// (`ops::rope::rope_kv_rows_kernel`) instead of three.
    pub rope_kv_rows: bool,
    /// With `f16_rows`, the attention (its combine, reduce or prompt kernel) writes the
    /// output projection's f16 rows too.
    pub attn_f16_rows: bool,
    /// With `group_gemm` and `f16_rows`, a gate|up group whose launch splits K applies the
    /// GLU in its split reduce (`gemm::members::reduce_glu_kernel`): no GLU launch (same
    /// bits; +0.2-1.2% at 8-32 sequences, `bench/gpu/prompt_f16.sh`, 2026-11-28).
    pub glu_reduce: bool,
    /// A decode row's MoE router (FFN norm, router matmul, top-k) and its combine with the
    /// residual add and the next norm run as one kernel each (`smelt_kernels::moe_fused`).
    pub moe: bool,
    /// A decode row's Q and K head norms run as one kernel.
    pub head_norms: bool,
    /// The Q and K head norms inside the rope + KV append's launch
    /// (`ops::rope::rope_kv_rows_norm_kernel`), where that launch runs.
    pub head_norms_rope: bool,
    /// A split-K GEMM's last block of each output tile sums the splits
    /// (`smelt_kernels::gemm::fixup`) instead of a reduce launch after it. Off unless
    /// asked for: the last block's reads of every split cost more than the launch they
    /// save (H100, 32-sequence Llama-3-8B Q4_K decode 5,600 tok/s without, 4,945 with).
    pub split_fixup: bool,
}

/// Which kernel multiplies a matrix, by token count and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulOptions {
    /// Single-token GEMVs of at most `.0` rows run one row per warp, of at least `.1` four
    /// (the split norm's consumers too, which have no one-row form).
    pub gemv_rows: (usize, usize),
    /// Matmuls of at least this many tokens run on the tensor-core GEMM.
    pub gemm_min_tokens: usize,
    /// Of those, which run on the f16 GEMM where the weight type has one
    /// (`gemm::f16::TYPES`): with `None` the shapes `gemm::f16::preferred` measured faster,
    /// with `Some(n)` every matmul of at least `n` tokens (`usize::MAX`: none, as in
    /// batch-invariant mode, where one kernel must serve every batch).
    pub gemm_f16_min_tokens: Option<usize>,
    /// Matmuls of at least this many tokens (even under `gemm_min_tokens`) run on the
    /// narrow GEMM where the weight type has one (`gemm::narrow::TYPES`) and they are at
    /// most `gemm_narrow_max_tokens`; `None`: the type's measured default
    /// (`gemm::narrow::min_tokens`).
    pub gemm_narrow_min_tokens: Option<usize>,
    /// Matmuls of at most this many tokens (and at least `gemm_narrow_min_tokens`) run on
    /// the narrow GEMM where the weight type has one; 0 in batch-invariant mode.
    pub gemm_narrow_max_tokens: usize,
    /// At most this many K splits for the narrow GEMM (`None`: its wave-fill rule,
    /// `gemm::narrow::splits`, alone), to measure fewer, longer blocks against the
    /// split reduces.
    pub narrow_max_splits: Option<usize>,
    /// The narrow GEMM's widest block (tokens; `gemm::narrow::WIDTHS`): more tokens are
    /// more blocks.
    pub narrow_max_width: u32,
    /// The narrow GEMM's warp layout for every token width (`Some`: 32 or 16 rows a warp,
    /// or 16 with a two-tile ring), else `gemm::narrow::default_layout_for`'s.
    pub narrow_layout: Option<gemm::narrow::Layout>,
    /// Matmuls of at most this many tokens (and at least `gemm_min_tokens`) run on the f16
    /// GEMM in batch-wide blocks (`gemm::f16_small`) where the weight type has one; 0 in
    /// batch-invariant mode.
    pub gemm_small_max_tokens: usize,
    /// Expert matmuls run on the grouped GEMM (`gemm::grouped`, where the weight type has
    /// one) when their step has at least this many (token, expert) slots an expert on
    /// average, else on the grouped GEMV (default `gemm::grouped::MIN_PER_EXPERT`, measured
    /// with `bench/gpu/moe.sh`; `usize::MAX`: never, as in batch-invariant mode; 0: always,
    /// for the GPU checks).
    pub moe_gemm_min_per_expert: usize,
    /// Lanes a row of the grouped GEMV takes at least (`Some(32)`: a whole warp, as before
    /// the lane groups); `None`: `moe::row_lanes`, the fewest its tiles fill.
    pub moe_gemv_lanes: Option<u32>,
}

/// How attention is split over the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionOptions {
    /// Steps of at least this many sequences run every attention row on the prompt kernel.
    pub flash_decode_seqs: usize,
    /// Fixed key splits of the decode attention (tuning only).
    pub splits: Option<usize>,
    /// Most KV blocks of its split an attention block stages in shared memory.
    pub stage: u32,
    /// Delta-net layers (linear attention) run a step whose longest sequence has at least
    /// this many tokens in chunks (`delta_chunk`), shorter ones token by token;
    /// `usize::MAX`: never (batch-invariant mode: which form a sequence takes must not
    /// depend on the others in its step).
    pub delta_chunk_min_tokens: usize,
}

/// How work reaches the device: graphs, launch shapes, weight uploads, the kernel module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Decode steps captured and replayed as CUDA graphs (off while profiling).
    pub graphs: bool,
    /// The greedy argmax splits each row over many blocks.
    pub split_argmax: bool,
    /// Weights repacked on one thread and copied synchronously, one at a time: the serial
    /// path the pipelined upload replaced, to measure it and to check both give the same
    /// model.
    pub plain_upload: bool,
    /// A layer's temporaries are handed out again two layers on (`arena::StepScratch`);
    /// off: a step keeps every layer's until it ends (the memory it took before).
    pub layer_scratch: bool,
    /// The device's kernel module and launch dependencies (`Gpu::open_with`).
    pub gpu: GpuOptions,
}

/// Measurement and debugging switches (all off by default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugOptions {
    pub profile: Profile,
    /// Hash every host copy, printed at drop (launch settings must not change a bit).
    pub digest: bool,
    /// Print a hash of the weights in device memory after a load (a file's and `--isq`'s
    /// must match).
    pub weight_digest: bool,
    /// Kernel-name prefixes not launched (timing ablations; outputs are wrong).
    pub skip: Vec<String>,
}

/// Tensor parallelism's all-reduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpOptions {
    /// Small all-reduces run on the one-shot peer-memory kernel
    /// (`smelt_kernels::allreduce`) instead of NCCL (which takes the rest, and everything
    /// where peer access is missing). On by default since `PEER_ONLY=1 bash bench/gpu/tp.sh`
    /// (4x H100, 2026-11-27): sums exact on 2 and 4 GPUs, single-stream decode TP=2 514 tok/s
    /// against NCCL's 466, TP=4 631 against 512. `SMELT_TP_PEER=0`: NCCL for every size.
    pub peer_all_reduce: bool,
    /// With `peer_all_reduce`, the largest message (bytes) it takes, larger ones going to
    /// NCCL; `None` is the table `smelt_kernels::allreduce::default_max_bytes` (by group
    /// size), `Some(0)` NCCL only.
    pub peer_all_reduce_max: Option<usize>,
    /// Every all-reduce left out (each rank keeps its partial sums, so outputs are wrong):
    /// a timing ablation that shows a step's time without communication.
    pub skip_all_reduce: bool,
    /// The output head split by vocabulary rows between the ranks (each computes its
    /// slice's logits; the slices are gathered through the all-reduce), where the model has
    /// a head of its own (tied embeddings stay replicated). `SMELT_TP_VOCAB=0`: every rank
    /// holds the whole head (to compare).
    pub vocab_parallel: bool,
    /// Where the peer all-reduce takes a decode row, it runs fused with the residual add,
    /// the next RMS norm and the q8_1 quantize (`smelt_kernels::allreduce_norm`): one
    /// launch instead of two, the same floats, for up to 4 rows. Off: its GPU run (`DEC=1
    /// bash bench/gpu/tp.sh`, 2026-11-27) measured it slower than the two launches, and
    /// wrong at 32 rows; `SMELT_TP_FUSE=1` turns it on.
    pub fuse_norm: bool,
}

impl CudaOptions {
    /// The largest all-reduce (bytes) the peer kernel takes in a group of `n_ranks` (0:
    /// NCCL for every size).
    pub fn peer_max_bytes(&self, n_ranks: usize) -> usize {
        if !self.tp.peer_all_reduce {
            return 0;
        }
        self.tp
            .peer_all_reduce_max
            .unwrap_or_else(|| smelt_kernels::allreduce::default_max_bytes(n_ranks))
    }
}

impl CudaOptions {
    /// The settings from the process environment, with `batch_invariant` asked for by the
    /// caller (or by `SMELT_CUDA_BATCH_INVARIANT=1`).
    pub fn from_env(batch_invariant: bool) -> Self {
        Self::from_vars(|name| std::env::var(name).ok(), batch_invariant)
    }

    /// The settings from `var` (a variable's value, if set).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>, batch_invariant: bool) -> Self {
        let on = |name: &str| var(name).is_none_or(|v| v != "0");
        let set = |name: &str| var(name).is_some_and(|v| v == "1");
        let num = |name: &str| var(name).and_then(|v| v.trim().parse::<usize>().ok());
        let fused = on("SMELT_CUDA_FUSED");
        let batch_invariant = batch_invariant || set("SMELT_CUDA_BATCH_INVARIANT");
        let profile = match var("SMELT_CUDA_PROFILE").as_deref() {
            Some("1") => Profile::Decode,
            Some("all") => Profile::All,
            _ => Profile::Off,
        };
        Self {
            batch_invariant,
            fuse: FuseOptions {
                quantize: fused,
                f16_rows: fused && on("SMELT_CUDA_FUSE_F16_ROWS"),
                group_gemm: fused && on("SMELT_CUDA_GROUP_GEMM"),
                split_norm: fused && on("SMELT_CUDA_SPLIT_NORM"),
                attn_combine: fused && on("SMELT_CUDA_ATTN_COMBINE"),
                rope_kv: fused && on("SMELT_CUDA_ROPE_KV"),
                gemv_rope_kv: on("SMELT_CUDA_GEMV_ROPE"),
                rope_kv_rows: fused && on("SMELT_CUDA_ROPE_KV_ROWS"),
                attn_f16_rows: fused && on("SMELT_CUDA_ATTN_F16_ROWS"),
                glu_reduce: fused && on("SMELT_CUDA_GLU_REDUCE"),
                moe: fused && on("SMELT_CUDA_MOE_FUSE"),
                head_norms: fused && on("SMELT_CUDA_HEAD_NORMS"),
                head_norms_rope: fused && on("SMELT_CUDA_HEAD_NORMS_ROPE"),
                split_fixup: fused && set("SMELT_CUDA_SPLIT_FIXUP"),
            },
            matmul: MatmulOptions {
                gemv_rows: (
                    num("SMELT_CUDA_GEMV_R1_ROWS").unwrap_or(0),
                    num("SMELT_CUDA_GEMV_R4_ROWS").unwrap_or(usize::MAX),
                ),
                gemm_min_tokens: if batch_invariant {
                    1
                } else {
                    num("SMELT_CUDA_GEMM_MIN").unwrap_or(gemm::MIN_TOKENS)
                },
                gemm_f16_min_tokens: if batch_invariant {
                    Some(usize::MAX)
                } else {
                    num("SMELT_CUDA_GEMM_F16_MIN")
                },
                gemm_narrow_min_tokens: num("SMELT_CUDA_GEMM_NARROW_MIN"),
                gemm_narrow_max_tokens: if batch_invariant {
                    0
                } else {
                    num("SMELT_CUDA_GEMM_NARROW_MAX").unwrap_or(gemm::narrow::MAX_TOKENS)
                },
                narrow_max_splits: num("SMELT_CUDA_GEMM_NARROW_SPLITS").filter(|&n| n > 0),
                narrow_max_width: match num("SMELT_CUDA_GEMM_NARROW_WIDTH") {
                    Some(w) if gemm::narrow::WIDTHS.contains(&(w as u32)) => w as u32,
                    _ => gemm::narrow::DEFAULT_MAX_WIDTH,
                },
                narrow_layout: var("SMELT_CUDA_GEMM_NARROW_ROWS")
                    .and_then(|v| gemm::narrow::Layout::parse(&v)),
                gemm_small_max_tokens: if batch_invariant {
                    0
                } else {
                    num("SMELT_CUDA_GEMM_SMALL_MAX").unwrap_or(gemm::f16_small::MAX_TOKENS)
                },
                moe_gemm_min_per_expert: if batch_invariant {
                    usize::MAX
                } else {
                    num("SMELT_CUDA_MOE_GEMM_MIN").unwrap_or(gemm::grouped::MIN_PER_EXPERT)
                },
                moe_gemv_lanes: num("SMELT_CUDA_MOE_LANES")
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|l| smelt_kernels::moe::ROW_LANES.contains(l)),
            },
            attention: AttentionOptions {
                flash_decode_seqs: num("SMELT_CUDA_FLASH_SEQS").unwrap_or(super::FLASH_DECODE_SEQS),
                splits: num("SMELT_CUDA_SPLITS").filter(|&n| n > 0),
                stage: num("SMELT_CUDA_ATTN_STAGE").map_or(32, |n| n.min(32) as u32),
                delta_chunk_min_tokens: if batch_invariant {
                    usize::MAX
                } else {
                    num("SMELT_CUDA_DELTA_CHUNK_MIN").unwrap_or(super::DELTA_CHUNK_MIN_TOKENS)
                },
            },
            launch: LaunchOptions {
                graphs: on("SMELT_CUDA_GRAPHS") && profile == Profile::Off,
                split_argmax: on("SMELT_CUDA_ARGMAX_SPLIT"),
                plain_upload: var("SMELT_CUDA_UPLOAD").is_some_and(|v| v == "plain"),
                layer_scratch: on("SMELT_CUDA_LAYER_SCRATCH"),
                gpu: GpuOptions::from_vars(&var),
            },
            debug: DebugOptions {
                profile,
                digest: set("SMELT_CUDA_DIGEST"),
                weight_digest: set("SMELT_CUDA_WEIGHT_DIGEST"),
                skip: var("SMELT_CUDA_SKIP")
                    .unwrap_or_default()
                    .split([',', '+'])
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from)
                    .collect(),
            },
            tp: TpOptions {
                peer_all_reduce: on("SMELT_TP_PEER"),
                peer_all_reduce_max: num("SMELT_TP_PEER_MAX"),
                skip_all_reduce: set("SMELT_TP_SKIP_ALLREDUCE"),
                vocab_parallel: on("SMELT_TP_VOCAB"),
                fuse_norm: set("SMELT_TP_FUSE"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)], invariant: bool) -> CudaOptions {
        let vars: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CudaOptions::from_vars(|n| vars.get(n).cloned(), invariant)
    }

    #[test]
    fn defaults_are_the_measured_choices() {
        let o = with(&[], false);
        let f = &o.fuse;
        assert!(f.quantize && f.split_norm && f.attn_combine && f.rope_kv && f.gemv_rope_kv);
        assert!(
            f.rope_kv_rows
                && !with(&[("SMELT_CUDA_ROPE_KV_ROWS", "0")], false)
                    .fuse
                    .rope_kv_rows
        );
        assert!(f.moe && f.head_norms);
        assert!(o.launch.split_argmax && o.launch.graphs && !o.launch.plain_upload);
        assert!(!o.debug.digest && !o.debug.weight_digest);
        assert_eq!(o.launch.gpu, GpuOptions::default());
        assert_eq!(o.matmul.gemm_min_tokens, gemm::MIN_TOKENS);
        assert_eq!(o.matmul.gemm_f16_min_tokens, None);
        assert_eq!(o.matmul.gemm_narrow_max_tokens, gemm::narrow::MAX_TOKENS);
        assert_eq!(o.matmul.gemm_narrow_min_tokens, None);
        assert_eq!(o.matmul.narrow_max_splits, None);
        let capped = with(&[("SMELT_CUDA_GEMM_NARROW_SPLITS", "2")], false);
        assert_eq!(capped.matmul.narrow_max_splits, Some(2));
        assert_eq!(o.matmul.gemm_small_max_tokens, gemm::f16_small::MAX_TOKENS);
        assert_eq!(
            o.matmul.moe_gemm_min_per_expert,
            gemm::grouped::MIN_PER_EXPERT
        );
        assert_eq!(
            o.attention.flash_decode_seqs,
            super::super::FLASH_DECODE_SEQS
        );
        assert_eq!(o.attention.stage, 32);
        assert_eq!(
            o.attention.delta_chunk_min_tokens,
            super::super::DELTA_CHUNK_MIN_TOKENS
        );
        assert_eq!(o.debug.profile, Profile::Off);
        assert_eq!(o.matmul.gemv_rows, (0, usize::MAX));
        assert!(o.debug.skip.is_empty() && o.attention.splits.is_none() && !o.batch_invariant);
        // The peer all-reduce is on (checked on 2 and 4 H100s); the fused one waits for
        // its GPU run.
        assert!(o.tp.peer_all_reduce && o.tp.peer_all_reduce_max.is_none());
        assert!(!o.tp.skip_all_reduce);
        assert!(!o.tp.fuse_norm);
        assert!(with(&[("SMELT_TP_FUSE", "1")], false).tp.fuse_norm);
        assert_eq!(o.peer_max_bytes(2), 1 << 20);
        assert_eq!(o.peer_max_bytes(4), 512 << 10);
        assert_eq!(o.peer_max_bytes(1), 0);
        assert_eq!(with(&[("SMELT_TP_PEER", "0")], false).peer_max_bytes(2), 0);
        let sized = with(&[("SMELT_TP_PEER_MAX", "65536")], false);
        assert_eq!(sized.peer_max_bytes(2), 65536);
        let off = with(&[("SMELT_TP_PEER", "1"), ("SMELT_TP_PEER_MAX", "0")], false);
        assert_eq!(off.peer_max_bytes(2), 0);
    }

    #[test]
    fn fused_off_turns_every_fusion_off() {
        let o = with(&[("SMELT_CUDA_FUSED", "0")], false);
        let f = &o.fuse;
        assert!(
            !f.quantize
                && !f.split_norm
                && !f.attn_combine
                && !f.rope_kv
                && !f.rope_kv_rows
                && !f.attn_f16_rows
                && !f.moe
                && !f.head_norms
                && !f.split_fixup
        );
        assert!(!with(&[("SMELT_CUDA_MOE_FUSE", "0")], false).fuse.moe);
        let o = with(&[("SMELT_CUDA_SPLIT_FIXUP", "1")], false);
        assert!(o.fuse.split_norm && o.fuse.split_fixup);
        assert!(!with(&[], false).fuse.split_fixup);
        assert!(
            !with(&[("SMELT_CUDA_SPLIT_FIXUP", "0")], false)
                .fuse
                .split_fixup
        );
        let o = with(&[("SMELT_CUDA_SPLIT_NORM", "0")], false);
        assert!(o.fuse.quantize && !o.fuse.split_norm);
    }

    #[test]
    fn batch_invariance_puts_every_matmul_on_the_gemm() {
        for o in [
            with(&[("SMELT_CUDA_GEMM_MIN", "64")], true),
            with(&[("SMELT_CUDA_BATCH_INVARIANT", "1")], false),
        ] {
            assert!(o.batch_invariant);
            assert_eq!(o.matmul.gemm_min_tokens, 1);
            assert_eq!(o.matmul.gemm_f16_min_tokens, Some(usize::MAX));
            assert_eq!(o.matmul.gemm_narrow_max_tokens, 0);
            assert_eq!(o.matmul.gemm_small_max_tokens, 0);
            assert_eq!(o.matmul.moe_gemm_min_per_expert, usize::MAX);
            assert_eq!(o.attention.delta_chunk_min_tokens, usize::MAX);
        }
        let o = with(&[("SMELT_CUDA_GEMM_NARROW_MAX", "64")], false);
        assert_eq!(o.matmul.gemm_narrow_max_tokens, 64);
        assert_eq!(o.matmul.narrow_layout, None);
        let o = with(&[("SMELT_CUDA_GEMM_NARROW_ROWS", "16")], false);
        assert_eq!(o.matmul.narrow_layout, Some(gemm::narrow::Layout::Rows16));
        let o = with(&[("SMELT_CUDA_GEMM_SMALL_MAX", "64")], false);
        assert_eq!(o.matmul.gemm_small_max_tokens, 64);
        assert_eq!(
            with(&[("SMELT_CUDA_MOE_GEMM_MIN", "0")], false)
                .matmul
                .moe_gemm_min_per_expert,
            0
        );
        let rule = gemm::grouped::MIN_PER_EXPERT.to_string();
        assert_eq!(
            with(&[("SMELT_CUDA_MOE_GEMM_MIN", &rule)], false)
                .matmul
                .moe_gemm_min_per_expert,
            gemm::grouped::MIN_PER_EXPERT
        );
        assert_eq!(
            with(&[("SMELT_CUDA_GEMM_MIN", "64")], false)
                .matmul
                .gemm_min_tokens,
            64
        );
    }

    #[test]
    fn profiling_turns_graphs_off_and_lists_parse() {
        let o = with(
            &[
                ("SMELT_CUDA_PROFILE", "all"),
                ("SMELT_CUDA_SKIP", "gemv_+ attention ,"),
            ],
            false,
        );
        assert_eq!(o.debug.profile, Profile::All);
        assert!(!o.launch.graphs);
        assert_eq!(o.debug.skip, ["gemv_", "attention"]);
        assert_eq!(
            with(&[("SMELT_CUDA_SPLITS", "0")], false).attention.splits,
            None
        );
        assert_eq!(
            with(&[("SMELT_CUDA_ATTN_STAGE", "99")], false)
                .attention
                .stage,
            32
        );
        // The device's settings come from the same variables.
        let g = with(
            &[
                ("SMELT_CUDA_PDL", "0"),
                ("SMELT_CUDA_CARVEOUT", "driver"),
                ("SMELT_CUDA_TIMELINE", "1"),
                ("SMELT_CUDA_UPLOAD", "plain"),
                ("SMELT_TP_SKIP_ALLREDUCE", "1"),
            ],
            false,
        );
        assert_eq!(g.launch.gpu.pdl.as_deref(), Some("0"));
        assert_eq!(g.launch.gpu.carveout.as_deref(), Some("driver"));
        assert!(g.launch.gpu.timeline && g.launch.plain_upload && g.tp.skip_all_reduce);
    }
}
