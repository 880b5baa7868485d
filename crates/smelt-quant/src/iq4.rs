//! Non-linear 4-bit formats (IQ4_NL, IQ4_XS): dequantize and dot.
//!
//! Both store 4-bit indices into [`KVALUES_IQ4NL`], a table of 16 levels spaced to fit
//! the bell shape of trained weights better than Q4_0's even steps. IQ4_NL has one f16
//! scale per 32 weights; IQ4_XS has a 256-weight super-block with one f16 scale and a
//! 6-bit signed scale per 32 weights. smelt reads them (dequantize and dot); it does not
//! write them.
//!
//! The dots follow the legacy formats' scheme (see `legacy::dot`): exact integer dot per
//! block in both paths, float scales combined by shared code, so AVX2 == portable.

use crate::fp::f16_to_f32;
use crate::kquants::BlockQ8K;
use crate::legacy::dot::{self, dot_blocks, nibbles};
use crate::legacy::scan::{blocks32_mut, vectorized};
use crate::legacy::BlockQ8_0;
use crate::{Block, GgmlType};
use half::f16;

/// ggml's `kvalues_iq4nl`: the 16 levels a 4-bit index selects.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Exact `sum KVALUES_IQ4NL[q[j]] * y[j]` over one 32-weight group packed as Q4_0 packs
/// its nibbles (weight `j` low nibble of byte `j`, weight `j + 16` high nibble).
#[inline(always)]
fn group_isum(qs: &[u8; 16], y: &[i8; 32]) -> i32 {
    nibbles(qs)
        .iter()
        .zip(y)
        .map(|(&q, &v)| KVALUES_IQ4NL[q as usize] as i32 * v as i32)
        .sum()
}

#[inline(always)]
fn dequantize_group(qs: &[u8; 16], d: f32, out: &mut [f32]) {
    for (o, q) in out.iter_mut().zip(nibbles(qs)) {
        *o = d * KVALUES_IQ4NL[q as usize] as f32;
    }
}

/// ggml's `block_iq4_nl`.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);

impl BlockIQ4NL {
    #[inline(always)]
    fn isum(x: &Self, y: &BlockQ8_0) -> i32 {
        group_isum(&x.qs, &y.qs)
    }

    #[inline(always)]
    fn term(x: &Self, y: &BlockQ8_0, isum: i32) -> f32 {
        (f16_to_f32(x.d) * f16_to_f32(y.d)) * isum as f32
    }

    /// [`Block::vec_dot`] without SIMD.
    pub fn vec_dot_portable(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        dot_blocks(x, y, Self::isum, Self::term)
    }

    /// [`Block::vec_dot`] with AVX2, bit-identical to [`Self::vec_dot_portable`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_avx2(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        use dot::x86;
        use std::arch::x86_64::*;
        let table = avx2::Table::new();
        let group = |xs: &[Self], ys: &[BlockQ8_0]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| {
                    let pairs = table.pairs(&xs[l].qs, x86::load(&ys[l].qs));
                    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
                }));
                x86::scaled(x86::f16x8(|l| xs[l].d), x86::f16x8(|l| ys[l].d), sums)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_0;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(blocks32_mut(dst)) {
                dequantize_group(&b.qs, f16_to_f32(b.d), out);
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::legacy::dot::avx2_ready() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { Self::vec_dot_avx2(x, y) };
        }
        Self::vec_dot_portable(x, y)
    }
}

/// ggml's `block_iq4_xs`: eight 32-weight groups; group `g`'s scale is the 6-bit value
/// `(low nibble g of scales_l) | (bits 2g..2g+2 of scales_h) << 4`, minus 32.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; 4],
    pub qs: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);

impl BlockIQ4XS {
    /// Group `g`'s signed scale, -32..=31.
    #[inline(always)]
    pub fn group_scale(&self, g: usize) -> i32 {
        let low = (self.scales_l[g / 2] >> (4 * (g % 2))) & 0x0F;
        let high = ((self.scales_h >> (2 * g)) & 3) as u8;
        (low | (high << 4)) as i32 - 32
    }

    #[inline(always)]
    fn groups(&self) -> &[[u8; 16]; 8] {
        bytemuck::cast_ref(&self.qs)
    }

    #[inline(always)]
    fn isum(x: &Self, y: &BlockQ8K) -> i32 {
        let ys: &[[i8; 32]; 8] = bytemuck::cast_ref(&y.qs);
        (0..8)
            .map(|g| x.group_scale(g) * group_isum(&x.groups()[g], &ys[g]))
            .sum()
    }

    #[inline(always)]
    fn term(x: &Self, y: &BlockQ8K, isum: i32) -> f32 {
        (f16_to_f32(x.d) * y.d) * isum as f32
    }

    /// [`Block::vec_dot`] without SIMD.
    pub fn vec_dot_portable(x: &[Self], y: &[BlockQ8K]) -> f32 {
        dot_blocks(x, y, Self::isum, Self::term)
    }

    /// [`Block::vec_dot`] with AVX2, bit-identical to [`Self::vec_dot_portable`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_avx2(x: &[Self], y: &[BlockQ8K]) -> f32 {
        use dot::x86;
        use std::arch::x86_64::*;
        let table = avx2::Table::new();
        let block = |x: &Self, y: &BlockQ8K| {
            let ys: &[[i8; 32]; 8] = bytemuck::cast_ref(&y.qs);
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let mut acc = _mm256_setzero_si256();
                for (g, (qs, yg)) in x.groups().iter().zip(ys).enumerate() {
                    let pairs = table.pairs(qs, x86::load(yg));
                    // |pair| <= 2*127*128 and |scale| <= 32: the i32 sums cannot overflow.
                    let scale = _mm256_set1_epi16(x.group_scale(g) as i16);
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scale));
                }
                acc
            }
        };
        let group = |xs: &[Self], ys: &[BlockQ8K]| {
            // SAFETY: this closure runs inside an AVX2 function.
            unsafe {
                let sums = x86::hsum8(std::array::from_fn(|l| block(&xs[l], &ys[l])));
                let dy = _mm256_loadu_ps(std::array::from_fn::<f32, 8, _>(|l| ys[l].d).as_ptr());
                x86::scaled(x86::f16x8(|l| xs[l].d), dy, sums)
            }
        };
        x86::dot_groups(x, y, group, Self::isum, Self::term)
    }
}

impl Block for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;

    fn dequantize_row(src: &[Self], dst: &mut [f32]) {
        vectorized(|| {
            for (b, out) in src.iter().zip(dst.chunks_exact_mut(256)) {
                let d = f16_to_f32(b.d);
                for (g, (qs, out)) in b.groups().iter().zip(out.chunks_exact_mut(32)).enumerate() {
                    dequantize_group(qs, d * b.group_scale(g) as f32, out);
                }
            }
        })
    }

    fn vec_dot(x: &[Self], y: &[BlockQ8K]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if crate::legacy::dot::avx2_ready() {
            // SAFETY: AVX2, FMA and F16C were detected at run time.
            return unsafe { Self::vec_dot_avx2(x, y) };
        }
        Self::vec_dot_portable(x, y)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::KVALUES_IQ4NL;
    use crate::legacy::dot::x86;
    use std::arch::x86_64::*;

    /// The level table split into its positive and negative parts (as unsigned bytes), so
    /// `maddubs` can multiply levels by arbitrary signed activations without the
    /// sign-flip trick, which is wrong for an activation of -128.
    pub(super) struct Table {
        pos: __m256i,
        neg: __m256i,
    }

    impl Table {
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) unsafe fn new() -> Self {
            let pos: [i8; 16] = KVALUES_IQ4NL.map(|v| v.max(0));
            let neg: [i8; 16] = KVALUES_IQ4NL.map(|v| (-v).max(0));
            Self {
                pos: _mm256_broadcastsi128_si256(_mm_loadu_si128(pos.as_ptr().cast())),
                neg: _mm256_broadcastsi128_si256(_mm_loadu_si128(neg.as_ptr().cast())),
            }
        }

        /// Pair sums (16 x i16) of `level(q) * y` over one packed 32-weight group.
        #[target_feature(enable = "avx2")]
        #[inline]
        pub(super) unsafe fn pairs(&self, qs: &[u8; 16], y: __m256i) -> __m256i {
            let idx = x86::nibbles(qs);
            let pos = _mm256_shuffle_epi8(self.pos, idx);
            let neg = _mm256_shuffle_epi8(self.neg, idx);
            x86::pairs_signed(pos, neg, y)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legacy::testutil::*;
    use bytemuck::Zeroable;
    use rand::Rng;

    #[test]
    fn sizes_match_ggml() {
        assert_eq!(
            std::mem::size_of::<BlockIQ4NL>(),
            GgmlType::IQ4_NL.type_size()
        );
        assert_eq!(
            std::mem::size_of::<BlockIQ4XS>(),
            GgmlType::IQ4_XS.type_size()
        );
    }

    /// Random levels with a sane f16 scale.
    fn nl_blocks(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<BlockIQ4NL> {
        let mut v: Vec<BlockIQ4NL> = random_blocks(rng, n);
        for b in &mut v {
            b.d = f16::from_f32(rng.gen_range(-0.02..0.02));
        }
        v
    }

    fn xs_blocks(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<BlockIQ4XS> {
        let mut v: Vec<BlockIQ4XS> = random_blocks(rng, n);
        for b in &mut v {
            b.d = f16::from_f32(rng.gen_range(-0.002..0.002));
        }
        v
    }

    #[test]
    fn dequantize_known_blocks() {
        let mut b = BlockIQ4NL::zeroed();
        b.d = f16::from_f32(0.5);
        b.qs[0] = 0xF0; // weight 0 -> level 0, weight 16 -> level 15
        b.qs[3] = 0x08;
        let out = dequantized(&[b]);
        assert_eq!(
            (out[0], out[16], out[3], out[19]),
            (-63.5, 56.5, 0.5, -63.5)
        );

        let mut x = BlockIQ4XS::zeroed();
        x.d = f16::ONE;
        // group 0: scale 33 - 32 = 1; group 1: 0 - 32 = -32; group 7: 63 - 32 = 31.
        x.scales_l = [0x01, 0x00, 0x00, 0xF0];
        x.scales_h = 0b10 | (0b11 << 14);
        assert_eq!(
            (x.group_scale(0), x.group_scale(1), x.group_scale(7)),
            (1, -32, 31)
        );
        x.qs[0] = 0x0F; // group 0, weight 0 -> 113
        x.qs[16] = 0x0F; // group 1, weight 0 -> -32 * 113
        x.qs[16 * 7 + 15] = 0x00; // group 7, weight 31 -> 31 * -127
        let out = dequantized(&[x]);
        assert_eq!(
            (out[0], out[32], out[255]),
            (113.0, -32.0 * 113.0, 31.0 * -127.0)
        );
    }

    #[test]
    fn nl_dot_paths() {
        check_dot_with(nl_blocks, BlockIQ4NL::vec_dot_portable, avx2!(BlockIQ4NL));
    }

    #[test]
    fn xs_dot_paths() {
        check_dot_with(xs_blocks, BlockIQ4XS::vec_dot_portable, avx2!(BlockIQ4XS));
    }
}
