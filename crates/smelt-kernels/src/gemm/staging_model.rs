//! Host models of the GEMM staging code (no GPU here): each model reads a repacked GPU row
//! at the offsets its `stage` reads, does the same word operations, and produces what the
//! kernel puts in shared memory (int8 weights in tile order, group scales and minima, the
//! per-tile floats). The test combines them as `compute_tile` does ([`Scales`]) and checks
//! every weight against ggml's dequantization (`smelt_quant`): a wrong offset, bit position
//! or scale unpacking in a format's layout shows here; the PTX itself is checked on the GPU
//! (`gpu_ops perf -o gemm`).

use super::Scales;
use crate::formats::{repack, GpuFormat, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1};
use crate::{GgmlType, TILE};
use smelt_quant::iq4::KVALUES_IQ4NL;

/// One staged tile of one row.
struct Staged {
    w: [i8; TILE],
    /// Per group: the integer scale, or the float `d`.
    sc: Vec<f64>,
    /// Per group: the integer or float minimum (empty without).
    min: Vec<f64>,
    /// The per-tile floats `d`, `-dmin`.
    rowf: [f64; 2],
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn half(b: &[u8], at: usize) -> f64 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f64()
}

fn put(w: &mut [i8; TILE], col: usize, v: u32) {
    for (i, b) in v.to_le_bytes().iter().enumerate() {
        w[col + i] = *b as i8;
    }
}

fn byte(v: u32, i: usize) -> u32 {
    (v >> (8 * i)) & 0xFF
}

/// The weights a staged tile stands for, as `compute_tile` combines them.
fn values(s: &Staged, scales: Scales, group: usize) -> Vec<f64> {
    (0..TILE)
        .map(|i| {
            let (g, q) = (i / group, f64::from(s.w[i]));
            match scales {
                Scales::Int { min } => {
                    let m = if min { s.min[g] * s.rowf[1] } else { 0.0 };
                    s.rowf[0] * s.sc[g] * q + m
                }
                Scales::Float => s.sc[g] * q,
                Scales::FloatMin => s.sc[g] * q + s.min[g],
            }
        })
        .collect()
}

/// Q4_K/Q5_K header at `blk`: per group (scale, minimum), `d`, `dmin`, by the word
/// operations of `stage_k_header`.
fn k_header(blk: &[u8]) -> (Vec<f64>, Vec<f64>, [f64; 2]) {
    let h: Vec<u32> = (0..4).map(|i| word(blk, 4 * i)).collect();
    let top = |w: u32| (w >> 2) & 0x3030_3030;
    let sc_lo = h[1] & 0x3F3F_3F3F;
    let m_lo = h[2] & 0x3F3F_3F3F;
    let sc_hi = (h[3] & 0x0F0F_0F0F) | top(h[1]);
    let m_hi = ((h[3] >> 4) & 0x0F0F_0F0F) | top(h[2]);
    let (mut sc, mut m) = (vec![], vec![]);
    for (s, mm) in [(sc_lo, m_lo), (sc_hi, m_hi)] {
        for i in 0..4 {
            sc.push(f64::from(byte(s, i)));
            m.push(f64::from(byte(mm, i)));
        }
    }
    (sc, m, [half(blk, 0), -half(blk, 2)])
}

fn q5_k(row: &[u8], _n: usize, t: usize) -> Staged {
    let blk = &row[176 * t..];
    let mut w = [0i8; TILE];
    for ch in 0..8 {
        let (j, c) = (ch / 2, ch % 2);
        let col = 64 * j + 16 * c;
        for x in 0..4 {
            let q = word(blk, 48 + 16 * ch + 4 * x);
            let bits = word(blk, 16 + 16 * c + 4 * x) >> (2 * j);
            let lo = (q & 0x0F0F_0F0F) | ((bits & 0x0101_0101) << 4);
            let hi = ((q >> 4) & 0x0F0F_0F0F) | ((bits & 0x0202_0202) << 3);
            put(&mut w, col + 4 * x, lo);
            put(&mut w, col + 32 + 4 * x, hi);
        }
    }
    let (sc, min, rowf) = k_header(blk);
    Staged { w, sc, min, rowf }
}

/// Legacy blocks (`high`: fifth bits; `min`: a minimum; else centered by `offset`) or,
/// with `table`, IQ4_NL's values.
fn legacy(row: &[u8], n: usize, t: usize, high: bool, min: bool, table: bool) -> Staged {
    let mut w = [0i8; TILE];
    let d_base = n * if high { 160 } else { 128 };
    let (mut sc, mut mins) = (vec![], vec![]);
    for ch in 0..8 {
        let qh = if high {
            word(row, 128 * n + 32 * t + 4 * ch)
        } else {
            0
        };
        for x in 0..4 {
            let q = word(row, 128 * t + 16 * ch + 4 * x);
            let (lo, hi) = if table {
                let lut = |sh: u32| {
                    (0..4)
                        .map(|b| {
                            u32::from(KVALUES_IQ4NL[((q >> (8 * b + sh)) & 15) as usize] as u8)
                                << (8 * b)
                        })
                        .sum::<u32>()
                };
                (lut(0), lut(4))
            } else {
                let spread = |bits: u32| bits.wrapping_mul(0x0204_0810) & 0x1010_1010;
                let fifth = |at: u32| if high { spread((qh >> at) & 15) } else { 0 };
                let lo = (q & 0x0F0F_0F0F) | fifth(4 * x as u32);
                let hi = ((q >> 4) & 0x0F0F_0F0F) | fifth(16 + 4 * x as u32);
                if min {
                    (lo, hi)
                } else {
                    let bias = super::legacy::bias(if high { 16 } else { 8 });
                    (
                        lo.wrapping_add(bias) ^ 0x8080_8080,
                        hi.wrapping_add(bias) ^ 0x8080_8080,
                    )
                }
            };
            put(&mut w, 32 * ch + 4 * x, lo);
            put(&mut w, 32 * ch + 16 + 4 * x, hi);
        }
        // IQ4_XS (the quants alone): its scales are elsewhere.
        if row.len() > d_base + 16 * t + 2 * ch {
            sc.push(half(row, d_base + 16 * t + 2 * ch));
        }
        if min {
            mins.push(half(row, d_base + 16 * n + 16 * t + 2 * ch));
        }
    }
    Staged {
        w,
        sc,
        min: mins,
        rowf: [0.0; 2],
    }
}

fn iq4_xs(row: &[u8], n: usize, t: usize) -> Staged {
    let Staged { w, .. } = legacy(row, n, t, false, false, true);
    let sl = word(row, 128 * n + 4 * t);
    let sh = u32::from(u16::from_le_bytes([
        row[132 * n + 2 * t],
        row[132 * n + 2 * t + 1],
    ]));
    let mut sc = vec![];
    for upper in 0..2 {
        let (sl, sh) = (sl >> (16 * upper), sh >> (8 * upper));
        for i in 0..4 {
            let v = ((sl >> (4 * i)) & 15) + 16 * ((sh >> (2 * i)) & 3);
            sc.push(f64::from(v as i32 - 32));
        }
    }
    Staged {
        w,
        sc,
        min: vec![],
        rowf: [half(row, 134 * n + 2 * t), 0.0],
    }
}

/// Q2_K/Q3_K quants (with Q3_K's `hmask` when `three`).
fn low_bits(row: &[u8], n: usize, t: usize, three: bool) -> [i8; TILE] {
    let mut w = [0i8; TILE];
    for half in 0..2 {
        for l16 in 0..2 {
            for x in 0..4 {
                let q = word(row, 64 * t + 32 * half + 16 * l16 + 4 * x);
                let hs = if three {
                    word(row, 64 * n + 32 * t + 16 * l16 + 4 * x) >> (4 * half)
                } else {
                    0
                };
                for j in 0..4 {
                    let q2 = q >> (2 * j);
                    let v = if three {
                        let clear = (((hs >> j) & 0x0101_0101) ^ 0x0101_0101).wrapping_mul(0xFC);
                        (q2 & 0x0303_0303) | clear
                    } else {
                        q2 & 0x0303_0303
                    };
                    put(&mut w, 128 * half + 16 * l16 + 32 * j + 4 * x, v);
                }
            }
        }
    }
    w
}

fn q3_k(row: &[u8], n: usize, t: usize) -> Staged {
    let w = low_bits(row, n, t, true);
    let a: Vec<u32> = (0..3).map(|i| word(row, 96 * n + 12 * t + 4 * i)).collect();
    let mut sc = vec![];
    for upper in 0..2 {
        let tops = a[2] >> (4 * upper);
        for (i, &w) in a[..2].iter().enumerate() {
            let low = w >> (4 * upper);
            let top = ((tops >> (2 * i)) & 0x0303_0303) << 4;
            let v = (low & 0x0F0F_0F0F) | top;
            for b in 0..4 {
                sc.push(f64::from(byte(v, b) as i32 - 32));
            }
        }
    }
    Staged {
        w,
        sc,
        min: vec![],
        rowf: [half(row, 108 * n + 2 * t), 0.0],
    }
}

fn q2_k(row: &[u8], n: usize, t: usize) -> Staged {
    let w = low_bits(row, n, t, false);
    let (mut sc, mut min) = (vec![], vec![]);
    for g in 0..16 {
        let b = u32::from(row[64 * n + 16 * t + g]);
        sc.push(f64::from(b & 15));
        min.push(f64::from(b >> 4));
    }
    let at = 80 * n + 4 * t;
    Staged {
        w,
        sc,
        min,
        rowf: [half(row, at), -half(row, at + 2)],
    }
}

/// Random ggml rows of `ty`: quantized floats where smelt_quant can, else random bytes.
fn ggml_rows(ty: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as u32
    };
    let row_bytes = k / ty.block_size() * ty.type_size();
    let mut out = vec![0u8; rows * row_bytes];
    if smelt_quant::can_quantize(ty) {
        let x: Vec<f32> = (0..rows * k)
            .map(|_| (next() % 20001) as f32 / 10000.0 - 1.0 + 0.3)
            .collect();
        for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(row_bytes)) {
            smelt_quant::quantize_row(ty, src, dst).unwrap();
        }
    } else {
        out.iter_mut().for_each(|b| *b = next() as u8);
    }
    out
}

/// Every weight of a few random rows through `model` against ggml's dequantization.
fn check<F: GpuFormat + super::GemmFormat>(
    model: impl Fn(&[u8], usize, usize) -> Staged,
    k: usize,
) {
    let rows = 3;
    let ggml = ggml_rows(F::TYPE, rows, k, 7 + k as u64);
    let packed = repack::<F>(&ggml, rows, k).unwrap();
    let row_bytes = F::row_bytes(k).unwrap();
    let ggml_row = ggml.len() / rows;
    let ntiles = k.div_ceil(TILE);
    let mut want = vec![0f32; k];
    let mut checked = 0;
    for r in 0..rows {
        smelt_quant::dequantize_row(F::TYPE, &ggml[r * ggml_row..(r + 1) * ggml_row], &mut want)
            .unwrap();
        let row = &packed[r * row_bytes..(r + 1) * row_bytes];
        for t in 0..ntiles {
            let got = values(&model(row, ntiles, t), F::SCALES, F::GROUP as usize);
            for (i, &g) in got.iter().enumerate() {
                let at = t * TILE + i;
                let w = if at < k { f64::from(want[at]) } else { 0.0 };
                if !w.is_finite() {
                    continue;
                }
                let tol = 1e-5 * w.abs().max(1e-3);
                assert!(
                    (g - w).abs() <= tol,
                    "{} row {r} weight {at}: staged {g} ggml {w}",
                    F::NAME
                );
                checked += 1;
            }
        }
    }
    assert!(checked > rows * k / 2, "{}: {checked} checked", F::NAME);
}

#[test]
fn q5_k_staging_gives_ggmls_weights() {
    check::<Q5K>(q5_k, 512);
}

#[test]
fn q4_k_header_model_matches_ggml() {
    // The Q4_K stage's header with its nibbles, modelled as Q5_K's without fifth bits.
    check::<Q4K>(
        |row, _n, t| {
            let blk = &row[144 * t..];
            let mut w = [0i8; TILE];
            for (i, &b) in blk[16..144].iter().enumerate() {
                let (j, l) = (i / 32, i % 32);
                w[64 * j + l] = (b & 15) as i8;
                w[64 * j + 32 + l] = (b >> 4) as i8;
            }
            let (sc, min, rowf) = k_header(blk);
            Staged { w, sc, min, rowf }
        },
        512,
    );
}

#[test]
fn legacy_staging_gives_ggmls_weights() {
    // 800 weights: three tiles, the last one of padding blocks (zero weights).
    for k in [256, 800] {
        check::<Q4_0>(|r, n, t| legacy(r, n, t, false, false, false), k);
        check::<Q5_0>(|r, n, t| legacy(r, n, t, true, false, false), k);
        check::<Q4_1>(|r, n, t| legacy(r, n, t, false, true, false), k);
        check::<Q5_1>(|r, n, t| legacy(r, n, t, true, true, false), k);
        check::<IQ4NL>(|r, n, t| legacy(r, n, t, false, false, true), k);
    }
}

#[test]
fn iq4_xs_staging_gives_ggmls_weights() {
    check::<IQ4XS>(iq4_xs, 512);
}

#[test]
fn q3_k_and_q2_k_staging_give_ggmls_weights() {
    check::<Q3K>(q3_k, 512);
    check::<Q2K>(q2_k, 512);
}
