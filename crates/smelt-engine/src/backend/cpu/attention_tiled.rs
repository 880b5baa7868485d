//! The tiled prompt order of [`super::attention::CpuKv::attend`]: [`ROWS`] consecutive query
//! rows of one head of a batch (tinyBLAS order, AVX2 + FMA + F16C) scored in one pass over
//! the keys and weighted in one pass over the values, each key and value widened once for
//! all the rows; every row's sums are the one-row order's ([`super::attention_row`]).

#[cfg(target_arch = "x86_64")]
use super::attention::{Scratch, View};
#[cfg(target_arch = "x86_64")]
use super::attention_row::{combine_lanes, dot_key_f16c, reduce8, softmax_round};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `dot8_keys_f16c` ([`super::attention_row`]) in tinyBLAS's order for `R` query rows at
/// once (`q` holds them one after another): each key widened once and multiplied into every
/// row's two accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)] // `i` picks both the key and its slot in every row
unsafe fn dot8_keys_rows<const R: usize>(w: &View<'_>, j: usize, q: &[f32]) -> [__m256; R] {
    let hd = w.hd;
    debug_assert!(q.len() >= R * hd && hd.is_multiple_of(16));
    let qp = q.as_ptr();
    let mut t3 = [[_mm256_setzero_ps(); 8]; R];
    for i in 0..8 {
        let kp = w.key(j + i).as_ptr();
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for c in (0..hd).step_by(16) {
            let a0 = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c).cast()));
            let a1 = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c + 8).cast()));
            for r in 0..R {
                lo[r] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(qp.add(r * hd + c)), lo[r]);
                hi[r] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(qp.add(r * hd + c + 8)), hi[r]);
            }
        }
        for r in 0..R {
            t3[r][i] = _mm256_add_ps(hi[r], lo[r]);
        }
    }
    std::array::from_fn(|r| reduce8(&t3[r]))
}

/// Rows per prefill task: consecutive query rows of one head share every key they see.
pub(super) const ROWS: usize = 4;

/// [`one_head`] for [`ROWS`] consecutive query rows of one head of a batch of two or more
/// tokens (tinyBLAS order, `hd` a multiple of 16): the scores of all rows from one pass over
/// the keys (each widened once), then each row's softmax and p·V as `one_head` does them.
/// `rows[r]` is row r's `(lo, pos)` (increasing), `q` the rows' f16-rounded queries.
///
/// [`one_head`]: super::attention_row::one_head
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_head_fast(
    w: &View<'_>,
    rows: [(usize, usize); ROWS],
    q: &[f32],
    scale: f32,
    sc: &mut Scratch,
    outs: [&mut [f32]; ROWS],
) {
    let hd = w.hd;
    let first = rows[0].0 - w.base;
    let last = rows[ROWS - 1].1 - w.base;
    let full = (last + 1).div_ceil(64) * 64 + 8;
    for s in sc.rows.iter_mut() {
        s.clear();
        s.resize(full, f32::NEG_INFINITY);
    }
    let sc8 = _mm256_set1_ps(scale);
    let mut j = first;
    while j + 8 <= last + 1 {
        let d = dot8_keys_rows::<ROWS>(w, j, q);
        for (s, d) in sc.rows.iter_mut().zip(d) {
            _mm256_storeu_ps(s.as_mut_ptr().add(j), _mm256_mul_ps(d, sc8));
        }
        j += 8;
    }
    for j in j..=last {
        for (r, s) in sc.rows.iter_mut().enumerate() {
            s[j] = dot_key_f16c(w.key(j), &q[r * hd..(r + 1) * hd], true) * scale;
        }
    }
    let len_max = (last + 1).div_ceil(64) * 64;
    for (r, s) in sc.rows.iter_mut().enumerate() {
        let (f, l) = (rows[r].0 - w.base, rows[r].1 - w.base);
        s[..f].fill(f32::NEG_INFINITY);
        let len = (l + 1).div_ceil(64) * 64;
        s[l + 1..].fill(f32::NEG_INFINITY);
        let max = s[f..=l].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        softmax_round::<true>(&mut s[..len], max);
        // Positions past this row's chunks weigh nothing.
        s[len..].fill(0.0);
        s.truncate(len_max);
    }
    sc.acc.clear();
    sc.acc.resize(ROWS * 16 * hd, 0.0);
    lane_sums_rows(w, &sc.rows, &mut sc.acc);
    for (r, o) in outs.into_iter().enumerate() {
        combine_lanes(&mut sc.acc[r * 16 * hd..(r + 1) * 16 * hd], hd, true, o);
    }
}

/// The tinyBLAS-order p·V lane sums of [`ROWS`] rows at once (`probs[r]` all the same
/// length, `acc` = `[row][lane][d]` for 16 lanes): each value row widened once for every
/// query row, 16 dimensions at a time. A position is skipped when every row's probability
/// is 0; a row whose probability alone is 0 adds `0 * v`, exactly +0 for a finite value (a
/// lane sum that starts at +0 never becomes -0), as the one-row `lane_sum` does by
/// skipping it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_sums_rows(w: &View<'_>, probs: &[Vec<f32>; ROWS], acc: &mut [f32]) {
    let hd = w.hd;
    let len = probs[0].len();
    let pp: [*const f32; ROWS] = std::array::from_fn(|r| probs[r].as_ptr());
    for lane in 0..16 {
        for d0 in (0..hd).step_by(16) {
            let mut a = [[_mm256_setzero_ps(); 2]; ROWS];
            for p in (lane..len).step_by(16) {
                let pr: [f32; ROWS] = std::array::from_fn(|r| *pp[r].add(p));
                if pr.iter().all(|&x| x == 0.0) {
                    continue;
                }
                let v = w.value(p).as_ptr().add(d0);
                let v0 = _mm256_cvtph_ps(_mm_loadu_si128(v.cast()));
                let v1 = _mm256_cvtph_ps(_mm_loadu_si128(v.add(8).cast()));
                for r in 0..ROWS {
                    let b = _mm256_set1_ps(pr[r]);
                    a[r][0] = _mm256_fmadd_ps(b, v0, a[r][0]);
                    a[r][1] = _mm256_fmadd_ps(b, v1, a[r][1]);
                }
            }
            for (r, a) in a.iter().enumerate() {
                let dst = acc.as_mut_ptr().add((r * 16 + lane) * hd + d0);
                _mm256_storeu_ps(dst, a[0]);
                _mm256_storeu_ps(dst.add(8), a[1]);
            }
        }
    }
}
