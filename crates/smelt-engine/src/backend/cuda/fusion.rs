//! Which matmuls of a group run as one kernel: the planner of the fused op
//! [`crate::backend::Backend::matmul_group`], kept apart from the launches so that its
//! rules are plain functions of the group, tested on the CPU.
//!
//! A group is a list of matrices that multiply the same input, named by the model (a
//! layer's Q, K and V; gate and up; a delta-net layer's projection pairs) and loaded by
//! `load_weight_group`, which puts each member's rows right after the previous member's in
//! weight memory. At one token, consecutive members of the same weight type and width then
//! run as one single-token GEMV over all their rows (one launch instead of three, and more
//! rows in flight), writing one output buffer that the members' outputs are views of. At
//! many tokens the same runs ([`gemm_runs`]) may be one GEMM launch whose split reduce
//! writes each member's own output (`gemm::members`).
//!
//! Before this planner, the backend joined any two single-token GEMVs whose weights and
//! outputs happened to be adjacent in memory, so a fusion depended on load and allocation
//! order (a weight chunk or scratch chunk boundary between Q and K silently split it). Now
//! the model names what may fuse; the weights' adjacency is the loader's promise, checked
//! here only so that a broken promise runs unfused (correct) rather than wrong; and the
//! outputs are placed by the op ([`outputs_follow`]), never by the caller's allocation order.

use std::ops::Range;

use smelt_gguf::GgmlType;

/// What the planner knows of one member of a group: a matrix in the GEMV's row layout
/// (`None`: anything else, which runs alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Address of its first row in weight memory.
    pub ptr: u64,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
}

impl Member {
    /// Whether one GEMV launch can multiply `next`'s rows after `self`'s: same format and
    /// row layout, and `next`'s rows start where `self`'s end.
    fn continued_by(&self, next: &Member) -> bool {
        self.ty == next.ty
            && self.cols == next.cols
            && self.row_bytes == next.row_bytes
            && self.ptr + (self.rows * self.row_bytes) as u64 == next.ptr
    }
}

/// The runs of a group of `ntok`-token matmuls: ranges of member indices, in order, each
/// one kernel. Members fuse only at one token (the GEMV; many tokens run each member on
/// the GEMM, whose activation tiles are shared anyway) and only where [`Member`]s continue
/// one another; everything else is a run of its own.
pub fn runs(members: &[Option<Member>], ntok: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let joins = ntok == 1
            && i > 0
            && matches!((&members[i - 1], m), (Some(a), Some(b)) if a.continued_by(b))
            && out.last().is_some_and(|r| r.end == i);
        match out.last_mut() {
            Some(r) if joins => r.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// The runs of a group of matmuls of many tokens that one GEMM launch may multiply (at
/// most `max` members a run, `gemm::members::MAX_MEMBERS`): consecutive members that
/// continue one another, as at one token. The backend multiplies such a run's rows in one
/// launch when the GEMM it picks for all of them splits K (`gemm::members`: the split
/// reduce writes each member's output apart); else member by member.
pub fn gemm_runs(members: &[Option<Member>], max: usize) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let joins = i > 0
            && matches!((&members[i - 1], m), (Some(a), Some(b)) if a.continued_by(b))
            && out.last().is_some_and(|r| r.end == i && r.len() < max);
        match out.last_mut() {
            Some(r) if joins => r.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// Whether outputs `(address, capacity in floats)` already lie one after the other with
/// room for `widths[i]` floats each (one token): then a run writes them as they are, else
/// the op gives them one new buffer, cut in order.
pub fn outputs_follow(outs: &[(u64, usize)], widths: &[usize]) -> bool {
    outs.len() == widths.len()
        && outs.iter().zip(widths).all(|(&(_, cap), &w)| cap >= w)
        && outs
            .windows(2)
            .zip(widths)
            .all(|(o, &w)| o[0].0 + (w * 4) as u64 == o[1].0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members of `rows` rows each of type `ty`, 2048 wide, placed one after the other
    /// from `base` (as `load_weight_group` places a group).
    fn group(base: u64, parts: &[(GgmlType, usize)]) -> Vec<Option<Member>> {
        let mut p = base;
        parts
            .iter()
            .map(|&(ty, rows)| {
                let row_bytes = 1152;
                let m = Member {
                    ptr: p,
                    ty,
                    rows,
                    cols: 2048,
                    row_bytes,
                };
                p += (rows * row_bytes) as u64;
                Some(m)
            })
            .collect()
    }

    #[test]
    fn a_single_token_group_of_one_format_is_one_run() {
        let qkv = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 256),
            ],
        );
        assert_eq!(runs(&qkv, 1), vec![0..3]);
        let gate_up = group(7 << 20, &[(GgmlType::Q8_0, 8192), (GgmlType::Q8_0, 8192)]);
        assert_eq!(runs(&gate_up, 1), vec![0..2]);
    }

    #[test]
    fn many_tokens_run_each_member_alone() {
        let qkv = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 256),
            ],
        );
        for ntok in [2, 8, 512] {
            assert_eq!(runs(&qkv, ntok), vec![0..1, 1..2, 2..3]);
        }
        assert_eq!(runs(&qkv, 0), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn many_token_gemm_runs_join_continued_members_up_to_the_cap() {
        let qkv = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 256),
            ],
        );
        assert_eq!(gemm_runs(&qkv, 3), vec![0..3]);
        assert_eq!(gemm_runs(&qkv, 2), vec![0..2, 2..3]);
        assert_eq!(gemm_runs(&qkv, 1), vec![0..1, 1..2, 2..3]);
        // Q4_K_M's V in Q6_K: Q|K together, V alone; a gap in weight memory splits too.
        let mut mixed = qkv.clone();
        if let Some(v) = mixed[2].as_mut() {
            v.ty = GgmlType::Q6_K;
        }
        assert_eq!(gemm_runs(&mixed, 3), vec![0..2, 2..3]);
        let mut gap = qkv.clone();
        for m in gap[1..].iter_mut().flatten() {
            m.ptr += 4096;
        }
        assert_eq!(gemm_runs(&gap, 3), vec![0..1, 1..3]);
        let gate_up = group(7 << 20, &[(GgmlType::Q8_0, 8192), (GgmlType::Q8_0, 8192)]);
        assert_eq!(gemm_runs(&gate_up, 3), vec![0..2]);
        assert_eq!(gemm_runs(&[None, gate_up[0]], 3), vec![0..1, 1..2]);
        assert!(gemm_runs(&[], 3).is_empty());
    }

    #[test]
    fn a_change_of_format_splits_the_run() {
        // Q4_K_M files keep V in Q6_K: Q|K run together, V alone.
        let mut qkv = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q6_K, 256),
            ],
        );
        assert_eq!(runs(&qkv, 1), vec![0..2, 2..3]);
        // A member of another width (never in a real group) is alone too.
        if let Some(m) = qkv[1].as_mut() {
            m.cols = 1024;
        }
        assert_eq!(runs(&qkv, 1), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn weights_not_placed_together_run_alone() {
        // The loader's promise broken (or matrices never loaded as a group): no fusion,
        // whatever the order the weights happen to lie in.
        let mut qkv = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 256),
            ],
        );
        if let Some(m) = qkv[2].as_mut() {
            m.ptr += 256;
        }
        assert_eq!(runs(&qkv, 1), vec![0..2, 2..3]);
        let mut swapped = qkv.clone();
        swapped.swap(0, 1);
        assert_eq!(runs(&swapped, 1), vec![0..1, 1..2, 2..3]);
        // Something other than a matrix in the GEMV layout breaks a run.
        let mut mixed = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 256),
            ],
        );
        mixed[1] = None;
        assert_eq!(runs(&mixed, 1), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn the_plan_does_not_depend_on_where_the_outputs_are() {
        // Unlike the old adjacency rule, the runs are decided from the weights alone;
        // outputs that do not follow one another are given a buffer that does.
        let qkv = group(
            1 << 30,
            &[
                (GgmlType::Q4_K, 2048),
                (GgmlType::Q4_K, 256),
                (GgmlType::Q4_K, 256),
            ],
        );
        let widths = [2048, 256, 256];
        assert_eq!(runs(&qkv, 1), vec![0..3]);
        let base = 1u64 << 40;
        let in_order = [(base, 2048), (base + 8192, 256), (base + 9216, 256)];
        assert!(outputs_follow(&in_order, &widths));
        // K allocated before Q, a gap after Q, an output too small, a scratch chunk
        // boundary: each needs the new buffer.
        let k_first = [(base + 1024, 2048), (base, 256), (base + 9216, 256)];
        let gap = [(base, 2048), (base + 8448, 256), (base + 9472, 256)];
        let small = [(base, 2048), (base + 8192, 128), (base + 9216, 256)];
        let chunked = [
            (base, 2048),
            (base + (16 << 20), 256),
            (base + (16 << 20) + 1024, 256),
        ];
        for outs in [k_first, gap, small, chunked] {
            assert!(!outputs_follow(&outs, &widths), "{outs:?}");
        }
        assert!(!outputs_follow(&in_order[..2], &widths));
    }
}
