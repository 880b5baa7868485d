//! Every kernel this crate emits, by name, so CI can assemble them all and the GPU check
//! can load them all from one module; and run-time dispatch over the weight types.

use smelt_ptx::{GridDep, Kernel, Module, PtxError, Target};

use crate::formats::{
    self, GpuFormat, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::gemv::Config;
use crate::{act, gemv, GgmlType, KernelError};

/// Weight types with a GEMV here.
pub const GEMV_TYPES: [GgmlType; 12] = [
    GgmlType::Q4_K,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q8_0,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// Shared memory of the SM configuration the kernels run in: `smelt_cuda` gives every
/// kernel this preferred carveout (of each SM's unified L1 and shared memory). An SM
/// changes its split only when it is idle, so the blocks of two kernels that prefer
/// different splits never share one; with programmatic dependent launch the next
/// kernel's blocks wait on SMs beside the running kernel's, and the attention (24 KB of
/// staged keys) launched at a GEMV's entry could not (H200, 2026-11-26: 533.6 tok/s with
/// one 32 KB carveout for every kernel, 518.4 with the driver's choice per kernel).
pub const CARVEOUT_BYTES: usize = 32 * 1024;

/// Most static shared memory a kernel declares: [`CARVEOUT_BYTES`] less the 1 KB the
/// hardware keeps per block (`tests/ptxas.rs` checks every kernel).
pub const MAX_SHARED_BYTES: usize = CARVEOUT_BYTES - 1024;

/// Dynamic shared memory the largest launch of kernel `name` takes, in bytes (0: none;
/// the narrow GEMMs' rings are over the 48 KB a kernel may take without telling the
/// driver first).
pub fn max_dynamic_shared_bytes(name: &str) -> u32 {
    let narrow = crate::gemm::narrow::TYPES
        .iter()
        .any(|(_, per)| per.iter().flatten().any(|n| *n == name));
    if narrow {
        crate::gemm::narrow::MAX_DYNAMIC_BYTES
    } else {
        0
    }
}

/// The name of the activation quantize kernel.
pub const QUANTIZE: &str = "quantize_q8_1";

/// Calls `$body` with `$F` bound to the GPU format of `$ty`, else evaluates `$none`.
macro_rules! with_format {
    ($ty:expr, $F:ident => $body:expr, _ => $none:expr) => {
        match $ty {
            GgmlType::Q4_K => {
                type $F = Q4K;
                $body
            }
            GgmlType::Q8_0 => {
                type $F = Q8_0;
                $body
            }
            GgmlType::Q2_K => {
                type $F = Q2K;
                $body
            }
            GgmlType::Q3_K => {
                type $F = Q3K;
                $body
            }
            GgmlType::IQ4_NL => {
                type $F = IQ4NL;
                $body
            }
            GgmlType::IQ4_XS => {
                type $F = IQ4XS;
                $body
            }
            GgmlType::Q5_K => {
                type $F = Q5K;
                $body
            }
            GgmlType::Q6_K => {
                type $F = Q6K;
                $body
            }
            GgmlType::Q4_0 => {
                type $F = Q4_0;
                $body
            }
            GgmlType::Q4_1 => {
                type $F = Q4_1;
                $body
            }
            GgmlType::Q5_0 => {
                type $F = Q5_0;
                $body
            }
            GgmlType::Q5_1 => {
                type $F = Q5_1;
                $body
            }
            _ => $none,
        }
    };
}

fn unsupported(ty: GgmlType) -> KernelError {
    KernelError::Quant(smelt_quant::QuantError::Unsupported { ty, op: "GPU GEMV" })
}

/// The GEMV kernel's name for `ty` and `ntok` tokens (the default configuration).
pub fn gemv_name(ty: GgmlType, ntok: usize) -> Result<String, KernelError> {
    gemv_config_name(ty, Config::new(ntok))
}

/// The GEMV kernel's name for `ty` in configuration `cfg`.
pub fn gemv_config_name(ty: GgmlType, cfg: Config) -> Result<String, KernelError> {
    with_format!(ty, F => Ok(cfg.name::<F>()), _ => Err(unsupported(ty)))
}

/// Variants the GPU check times against the defaults, to choose defaults by measurement:
/// rows per warp, load pinning and L1 allocation of the weights, for 1, 2, 4 and 8 tokens.
pub fn tuning_configs() -> Vec<Config> {
    let mut v = one_token_layouts();
    v.remove(0);
    // Many tokens: activations streamed one token at a time (one token ahead), with two
    // or four rows sharing them.
    for ntok in [2, 4, 8] {
        for rows_per_warp in [2, 4] {
            v.push(Config {
                rows_per_warp,
                act_ahead: 1,
                ..Config::new(ntok)
            });
        }
    }
    for ntok in [1, 2, 4, 8] {
        for rows_per_warp in [1, 2] {
            for pin_loads in [false, true] {
                for no_l1 in [false, true] {
                    // Measured on an H200 (2026-11-22): skipping L1 for the weights and
                    // unpinned loads only lost; the many-token variants keep neither.
                    if ntok > 1 && (!pin_loads || no_l1) {
                        continue;
                    }
                    let c = Config {
                        ntok,
                        rows_per_warp,
                        pin_loads,
                        no_l1,
                        ..Config::new(ntok)
                    };
                    if c != Config::new(ntok) && !v.contains(&c) {
                        v.push(c);
                    }
                }
            }
        }
    }
    v
}

/// The one-token GEMV layouts a card's choice is measured among (`gpu_ops -o gemv_tune`),
/// the default first: one, two or four rows a warp, and two rows shared by two or four
/// warps (`Config::split`, for the short rows whose two or four steps are all latency).
/// (Two steps of tiles in flight a warp, and eight-warp blocks, were measured beside them
/// on an H200 and lost or tied: bench/RESULTS.md 2026-11-28.)
pub fn one_token_layouts() -> Vec<Config> {
    let base = Config::new(1);
    let mut v: Vec<Config> = [2, 1, 4]
        .into_iter()
        .map(|rows_per_warp| base.with_rows(rows_per_warp))
        .collect();
    v.extend([2, 4].map(|split| Config { split, ..base }));
    v
}

/// Every configuration the catalog emits: the defaults for 1..=8 tokens and the variants.
pub fn configs() -> Vec<Config> {
    let mut v: Vec<Config> = (1..=gemv::MAX_TOKENS).map(Config::new).collect();
    for c in tuning_configs() {
        if !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// The fused single-token GEMVs (the two halves of a residual add + RMS norm between two
/// GEMVs, `gemv::Fuse`; the Q|K|V GEMV with rope and the KV append, on a split norm's
/// tiles or on plain ones; the split norm's consumer with four rows a warp as well, for
/// the wide matrices `SMELT_CUDA_GEMV_R4_ROWS` gives four), emitted for every type beside
/// [`configs`].
pub fn fused_configs() -> [Config; 5] {
    [
        Config::residual_norm(),
        Config::rms_input(),
        Config::rms_input().with_rows(4),
        Config::rms_input().with_rope_kv(),
        Config::new(1).with_rope_kv(),
    ]
}

/// The grouped mixture-of-experts GEMV's name for `ty` (`moe::gemv_id_kernel`).
pub fn moe_gemv_name(ty: GgmlType, tile_tokens: usize, lanes: u32) -> Result<String, KernelError> {
    with_format!(ty, F => Ok(crate::moe::gemv_id_name::<F>(tile_tokens, lanes)), _ => Err(unsupported(ty)))
}

/// Bytes of a row of `k` weights of `ty` in the GPU layout.
pub fn row_bytes(ty: GgmlType, k: usize) -> Result<usize, KernelError> {
    with_format!(ty, F => F::row_bytes(k), _ => Err(unsupported(ty)))
}

/// Repacks `rows` rows of ggml bytes of `ty` into the GPU layout.
pub fn repack(ty: GgmlType, ggml: &[u8], rows: usize, k: usize) -> Result<Vec<u8>, KernelError> {
    with_format!(ty, F => formats::repack::<F>(ggml, rows, k), _ => Err(unsupported(ty)))
}

/// A kernel's name and the function that emits it.
pub type Entry = (String, Box<dyn Fn(&Kernel)>);

/// Test helper: the kernels of `entries()` build for sm_80 and sm_90 (each target's
/// static limits, shared memory included), and each of `names` is an entry of the PTX.
#[cfg(test)]
pub(crate) fn assert_builds(entries: impl Fn() -> Vec<Entry>, names: &[&str]) {
    for target in [Target::Sm80, Target::Sm90] {
        let mut m = Module::new(target);
        for (name, build) in entries() {
            m.kernel(&name, |k| build(k)).unwrap();
        }
        let ptx = m.to_ptx();
        for n in names {
            assert!(ptx.contains(&format!(".entry {n}(")), "{n} for {target:?}");
        }
    }
}

/// Every kernel: its name and the function that emits it.
pub fn all() -> Vec<Entry> {
    let mut v: Vec<Entry> = vec![(QUANTIZE.to_string(), Box::new(act::quantize_kernel))];
    v.extend(crate::ops::catalog());
    v.extend(crate::fused::catalog());
    v.extend(crate::quantize::entries());
    v.extend(formats::gpu_repack::entries());
    v.extend(crate::gemm::catalog());
    v.extend(crate::gemm::f16::catalog());
    v.extend(crate::gemm::f16_small::catalog());
    v.extend(crate::gemm::narrow::catalog());
    v.extend(crate::gemm::grouped::catalog());
    v.extend(crate::gemm::members::catalog());
    v.extend(crate::moe::catalog());
    v.extend(crate::moe_fused::catalog());
    v.extend(crate::delta_net::catalog());
    v.extend(crate::allreduce::catalog());
    v.extend(crate::allreduce_norm::catalog());
    for ty in GEMV_TYPES {
        for (t, l) in crate::moe::gemv_id_variants() {
            with_format!(ty, F => {
                v.push((
                    crate::moe::gemv_id_name::<F>(t, l),
                    Box::new(move |k: &Kernel| crate::moe::gemv_id_kernel::<F>(k, t, l)),
                ));
            }, _ => {});
        }
    }
    let mut configs = self::configs();
    configs.extend(fused_configs());
    for ty in GEMV_TYPES {
        for &cfg in &configs {
            with_format!(ty, F => {
                v.push((cfg.name::<F>(), Box::new(move |k: &Kernel| gemv::kernel::<F>(k, cfg))));
            }, _ => {});
        }
    }
    v
}

/// The base of how the catalog's kernels take part in programmatic dependent launch (sm_90
/// and later; older targets get no `griddepcontrol`): every kernel waits for its
/// predecessor at entry, so the runtime may launch each as a programmatic dependent.
/// Launched without that attribute, the waits return at once, so the same module serves
/// both.
pub const GRID_DEP: GridDep = GridDep {
    wait: true,
    early_launch: false,
    early_work: false,
    launch_after_wait: false,
};

/// The default (other kernels, GEMVs): the GEMVs also let their successor launch at entry
/// (a small kernel, the attention, or the next GEMV behind the GLU), so it is placed and
/// waiting when the GEMV ends, and they load their first loop step's weights before their
/// own wait (`gemv::kernel`'s early work). Measured on an H200 (2026-11-26, Llama-3-8B-shape
/// Q4_K decode, graphs, tg128, one call, `bench/RESULTS.md`): 551.1 tok/s against 542.4
/// without the early loads; every kernel launching its successor at entry or after its
/// wait lost (510-530). The early loads lost 1% before every kernel had one shared-memory
/// carveout (`CARVEOUT_BYTES`): the GEMV blocks then waited on SMs they could not share.
pub const GRID_DEPS: (GridDep, GridDep) = (
    GRID_DEP,
    GridDep {
        early_launch: true,
        early_work: true,
        ..GRID_DEP
    },
);

/// Whether kernel `name` is a GEMV (its successors at decode are the small kernels).
pub fn is_gemv(name: &str) -> bool {
    name.starts_with("gemv_")
}

/// Name prefixes of the kernels besides the GEMVs that let their successor launch once
/// they have passed their own wait (`GridDep::launch_after_wait`), by default: see
/// [`module_with`]. The attention: the output projection's blocks are placed beside its
/// (one per SM) and load their first weights while it runs (H200, two calls: 553.7 vs
/// 549.7 and 556.5 vs 553.4 tok/s; the GLU doing the same for the down projection lost 3%).
/// The MoE kernels and the Q/K head norms and rope + KV append of Qwen3-style attention:
/// a MoE decode step is a chain of small kernels whose successors otherwise started 0.7-1.7
/// us after them (Qwen3-30B-A3B Q4_K tg128 on an H100, one call, the same greedy tokens:
/// 423.4 tok/s as before, 451.7 with these and the GLU's, 427.5 without the norms' and
/// rope's; `bench/RESULTS.md`, 2026-11-27 16:40 UTC).
pub const LAUNCH_AFTER_WAIT: &[&str] = &["attention_", "moe_", "rms_norm_pair", "rope_kv"];

/// Parts of the names of the GEMVs that do no work before their wait by default (the
/// others load their first step's weights there, [`GRID_DEPS`]): the residual-norm GEMVs,
/// whose 16-warp blocks launch behind the attention and the GLU (H200, 4 rounds of one
/// call: 560.9 tok/s vs 556.7 with their early loads, 537.3 with no GEMV's).
pub const NO_EARLY_WORK: &[&str] = &["_resnorm"];

/// One module holding every kernel, for `target`, with [`GRID_DEPS`],
/// [`LAUNCH_AFTER_WAIT`] and [`NO_EARLY_WORK`].
pub fn module(target: Target) -> Result<Module, PtxError> {
    module_with(
        target,
        GRID_DEPS.0,
        GRID_DEPS.1,
        LAUNCH_AFTER_WAIT,
        NO_EARLY_WORK,
        false,
    )
}

/// One module holding every kernel, for `target`: the GEMVs with `gemv`, the others with
/// `other` (to compare settings: which kernels let their successor launch early), except
/// that the kernels whose names start with one of `after_wait` let their successor launch
/// right after their own wait (when `other` waits at all), and the GEMVs whose names
/// contain one of `no_early_work` do no work before their wait; with `timeline`, every
/// kernel takes a timeline slot last and stamps its blocks' times (`smelt_ptx::timeline`).
pub fn module_with(
    target: Target,
    other: GridDep,
    gemv: GridDep,
    after_wait: &[&str],
    no_early_work: &[&str],
    timeline: bool,
) -> Result<Module, PtxError> {
    module_of(
        target,
        (other, gemv),
        (after_wait, no_early_work),
        timeline,
        &|_| true,
    )
}

/// [`module`] holding only the kernels whose names pass `keep`: the GPU op harness
/// (`examples/gpu_ops`) loads just the kernels of the ops it runs, since the driver's JIT
/// of the whole catalog takes over half a minute.
pub fn module_selected(target: Target, keep: &dyn Fn(&str) -> bool) -> Result<Module, PtxError> {
    module_of(
        target,
        GRID_DEPS,
        (LAUNCH_AFTER_WAIT, NO_EARLY_WORK),
        false,
        keep,
    )
}

fn module_of(
    target: Target,
    (other, gemv): (GridDep, GridDep),
    (after_wait, no_early_work): (&[&str], &[&str]),
    timeline: bool,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Module, PtxError> {
    let mut m = Module::new(target);
    m.set_timeline(timeline);
    let early = GridDep {
        early_launch: true,
        launch_after_wait: true,
        ..other
    };
    for (name, build) in all().into_iter().filter(|(n, _)| keep(n)) {
        m.set_grid_dep(if is_gemv(&name) {
            GridDep {
                early_work: gemv.early_work && !no_early_work.iter().any(|p| name.contains(p)),
                ..gemv
            }
        } else if after_wait.iter().any(|p| name.starts_with(p)) {
            early
        } else {
            other
        });
        m.kernel(&name, |k| build(k))?;
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_builds_for_every_target() {
        for target in [Target::Sm80, Target::Sm90] {
            let ptx = module(target).unwrap().to_ptx();
            for (name, _) in all() {
                assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
            }
        }
    }

    #[test]
    fn gemv_refuses_token_counts_out_of_range() {
        let mut m = Module::new(Target::Sm80);
        assert!(m
            .kernel("g", |k| gemv::kernel::<Q4K>(k, Config::new(9)))
            .is_err());
        assert!(m
            .kernel("g", |k| gemv::kernel::<Q4K>(k, Config::new(0)))
            .is_err());
    }

    #[test]
    fn unsupported_types_are_errors() {
        assert!(gemv_name(GgmlType::Q8_K, 1).is_err());
        assert!(row_bytes(GgmlType::F32, 256).is_err());
    }
}
