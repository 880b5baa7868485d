//! CI's check of the runtime's own kernels (the benchmark fill) without a GPU: generated
//! and assembled with ptxas for sm_80 and sm_90 like every kernel of `smelt-kernels`.
//! ptxas comes from `SMELT_PTXAS`, else `scripts/ptxas.sh`; neither working is a failure.

use std::path::Path;

use smelt_ptx::ptxas::Ptxas;
use smelt_ptx::Target;

#[test]
fn runtime_kernels_assemble_for_sm80_and_sm90() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ptxas.sh");
    let ptxas = Ptxas::locate(&script).unwrap_or_else(|e| panic!("{e}"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smelt-cuda");
    for target in [Target::Sm80, Target::Sm90] {
        let ptx = smelt_cuda::runtime_module(target).unwrap().to_ptx();
        if let Err(e) = ptxas.assemble(&dir.join(target.to_string()), target, "runtime", &ptx) {
            panic!("{target}: {e}");
        }
    }
}
