//! Timestamps of every block of every kernel, to see where a CUDA-graph step's time goes
//! with programmatic dependent launch on (profilers serialize the kernels, and so show
//! none of the overlap; a kernel left out changes its neighbours' placement).
//!
//! A module built with [`crate::Module::set_timeline`] gives every kernel one more
//! parameter, last: [`PARAM`], a pointer to the launch's slot of a timeline buffer (0:
//! record nothing). Each block's first thread records `%globaltimer` at entry and right
//! after `griddepcontrol.wait`, and the lowest active lane of each warp records it when
//! the warp ends; min and max reductions keep the first and last of each. To keep
//! same-address atomics cheap, each field has [`LANES`] words and a block uses the word
//! of its block index modulo [`LANES`]: the host takes the min or max over them.
//!
//! Buffer layout (u64 words): field `f` of slot `s` at word `(f * MAX_LAUNCHES + s) *
//! LANES + lane`. The min fields come first, so resetting is two fills: `MIN_FIELDS *
//! MAX_LAUNCHES * LANES` words of `u64::MAX`, then the rest zeros.

/// The parameter every kernel of a timeline module takes last.
pub const PARAM: &str = "smelt_timeline";

/// Words per field of a slot.
pub const LANES: usize = 32;

/// Launches one step can record; later launches pass 0 and record nothing.
pub const MAX_LAUNCHES: usize = 2048;

/// The recorded times of a launch, in buffer order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The first block's entry (min).
    FirstEntry = 0,
    /// The first block past its `griddepcontrol.wait` (min; the entry where it has none).
    FirstRelease = 1,
    /// The last block's entry (max).
    LastEntry = 2,
    /// The last block past its wait (max).
    LastRelease = 3,
    /// The last warp's end (max).
    LastExit = 4,
}

/// Fields reduced with min: they start at `u64::MAX`; the others at 0.
pub const MIN_FIELDS: usize = 2;

/// Fields per launch.
pub const FIELDS: usize = 5;

/// Words of the whole buffer.
pub const WORDS: usize = FIELDS * MAX_LAUNCHES * LANES;

/// Bytes between one slot's parameter and the next's.
pub const SLOT_BYTES: u64 = (LANES * 8) as u64;

/// Bytes between two fields of one slot.
const FIELD_BYTES: usize = MAX_LAUNCHES * LANES * 8;

/// `red.global.{op}.u64 [base + field], %smtl_t` where `pred` holds.
fn record(pred: &str, op: &str, field: Field) -> String {
    format!(
        "\t@{pred} red.global.{op}.u64 [%smtl_base+{}], %smtl_t;",
        field as usize * FIELD_BYTES
    )
}

/// Registers and the entry code: the slot's word for this block, whether this thread
/// records, and the entry times.
pub(crate) fn prologue() -> Vec<String> {
    let mut v: Vec<String> = [
        ".reg .u64 %smtl_base, %smtl_t, %smtl_off;",
        ".reg .u32 %smtl_r<6>;",
        ".reg .pred %smtl_on, %smtl_first, %smtl_last;",
        &format!("ld.param.u64 %smtl_base, [{PARAM}];"),
        "setp.ne.u64 %smtl_on, %smtl_base, 0;",
        "cvta.to.global.u64 %smtl_base, %smtl_base;",
        "mov.u32 %smtl_r0, %ctaid.x;",
        "mov.u32 %smtl_r1, %ctaid.y;",
        "add.u32 %smtl_r0, %smtl_r0, %smtl_r1;",
        "mov.u32 %smtl_r1, %ctaid.z;",
        "add.u32 %smtl_r0, %smtl_r0, %smtl_r1;",
        &format!("and.b32 %smtl_r0, %smtl_r0, {};", LANES - 1),
        "mul.wide.u32 %smtl_off, %smtl_r0, 8;",
        "add.u64 %smtl_base, %smtl_base, %smtl_off;",
        "mov.u32 %smtl_r1, %tid.x;",
        "mov.u32 %smtl_r2, %tid.y;",
        "or.b32 %smtl_r1, %smtl_r1, %smtl_r2;",
        "mov.u32 %smtl_r2, %tid.z;",
        "or.b32 %smtl_r1, %smtl_r1, %smtl_r2;",
        "setp.eq.and.u32 %smtl_first, %smtl_r1, 0, %smtl_on;",
        "mov.u64 %smtl_t, %globaltimer;",
    ]
    .iter()
    .map(|l| format!("\t{l}"))
    .collect();
    v.push(record("%smtl_first", "min", Field::FirstEntry));
    v.push(record("%smtl_first", "max", Field::LastEntry));
    v
}

/// After a `griddepcontrol.wait`: the release times.
pub(crate) fn after_wait() -> Vec<String> {
    vec![
        "\tmov.u64 %smtl_t, %globaltimer;".to_string(),
        record("%smtl_first", "min", Field::FirstRelease),
        record("%smtl_first", "max", Field::LastRelease),
    ]
}

/// Where every exit goes instead: the warp's end time, then `ret`.
pub(crate) fn epilogue() -> Vec<String> {
    let mut v: Vec<String> = [
        "$smtl_end:",
        "\tactivemask.b32 %smtl_r3;",
        "\tmov.u32 %smtl_r4, %laneid;",
        "\tbrev.b32 %smtl_r5, %smtl_r3;",
        "\tbfind.shiftamt.u32 %smtl_r5, %smtl_r5;",
        "\tsetp.eq.and.u32 %smtl_last, %smtl_r4, %smtl_r5, %smtl_on;",
        "\tmov.u64 %smtl_t, %globaltimer;",
    ]
    .iter()
    .map(|l| l.to_string())
    .collect();
    v.push(record("%smtl_last", "max", Field::LastExit));
    v
}

/// A body line that ends threads (`exit;`, guarded or not) as a branch to the epilogue.
pub(crate) fn redirect_exit(line: &str) -> Option<String> {
    let t = line.trim();
    let guard = t.strip_suffix("exit;")?.trim_end();
    if guard.is_empty() {
        Some("\tbra $smtl_end;".to_string())
    } else if guard.starts_with('@') && !guard.contains(' ') {
        Some(format!("\t{guard} bra $smtl_end;"))
    } else {
        None
    }
}

/// Whether a body line is a `griddepcontrol.wait`.
pub(crate) fn is_wait(line: &str) -> bool {
    line.trim() == "griddepcontrol.wait;"
}

/// The `(min, max)` over a field's [`LANES`] words for `slot` of a downloaded buffer
/// (`None` when nothing was recorded).
pub fn read(buf: &[u64], field: Field, slot: usize) -> Option<u64> {
    let at = (field as usize * MAX_LAUNCHES + slot) * LANES;
    let words = buf.get(at..at + LANES)?;
    if (field as usize) < MIN_FIELDS {
        words.iter().copied().min().filter(|&t| t != u64::MAX)
    } else {
        words.iter().copied().max().filter(|&t| t != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GridDep, Module, Target};

    #[test]
    fn an_instrumented_kernel_takes_its_slot_last_and_stamps_entry_release_and_exits() {
        let mut m = Module::new(Target::Sm90);
        m.set_grid_dep(GridDep::ALL).set_timeline(true);
        m.kernel("k", |k| {
            let n = k.param_u32("n");
            k.exit_if(k.eq(n, 0u32));
            k.grid_dep_wait();
            k.exit();
        })
        .unwrap();
        let ptx = m.to_ptx();
        let params = &ptx[ptx.find(".entry k(").unwrap()..ptx.find(')').unwrap()];
        assert!(
            params.trim_end().ends_with(&format!(".param .u64 {PARAM}")),
            "{params}"
        );
        assert!(!ptx
            .lines()
            .any(|l| l.trim().ends_with(" exit;") || l.trim() == "exit;"));
        let wait = ptx.find("griddepcontrol.wait;").unwrap();
        let release = ptx.find("red.global.min.u64 [%smtl_base+524288]").unwrap();
        assert!(wait < release, "{ptx}");
        assert_eq!(ptx.matches("%globaltimer").count(), 3, "{ptx}");
        assert!(ptx.contains("$smtl_end:"));
    }

    #[test]
    fn exits_become_branches_to_the_epilogue() {
        assert_eq!(
            redirect_exit("\texit;").as_deref(),
            Some("\tbra $smtl_end;")
        );
        assert_eq!(
            redirect_exit("\t@%p3 exit;").as_deref(),
            Some("\t@%p3 bra $smtl_end;")
        );
        assert_eq!(
            redirect_exit("\t@!%p3 exit;").as_deref(),
            Some("\t@!%p3 bra $smtl_end;")
        );
        assert_eq!(redirect_exit("\tadd.u32 %r1, %r2, 1;"), None);
    }

    #[test]
    fn reading_takes_min_or_max_over_the_lanes_and_ignores_the_reset_values() {
        let mut buf = vec![0u64; WORDS];
        buf[..MIN_FIELDS * MAX_LAUNCHES * LANES].fill(u64::MAX);
        assert_eq!(read(&buf, Field::FirstEntry, 3), None);
        assert_eq!(read(&buf, Field::LastExit, 3), None);
        let first = (Field::FirstEntry as usize * MAX_LAUNCHES + 3) * LANES;
        buf[first + 5] = 100;
        buf[first + 9] = 90;
        let last = (Field::LastExit as usize * MAX_LAUNCHES + 3) * LANES;
        buf[last] = 400;
        buf[last + 31] = 500;
        assert_eq!(read(&buf, Field::FirstEntry, 3), Some(90));
        assert_eq!(read(&buf, Field::LastExit, 3), Some(500));
    }
}
