//! Q3_K: 3.4375 bits per weight. Sixteen 16-weight groups, each `d * sc * q` with
//! `q` in `-4..=3` (two low bits in `qs`, the high bit in `hmask`) and 6-bit signed `sc`.

use super::common::{f16_to_f32, fold, from_lanes, group_sums, nearest_int, to_lanes, QK_K};
use super::{lanes, BlockQ8K};
use half::f16;

/// ggml's `block_q3_K` (110 bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    /// High bits: bit `b` of byte `l` belongs to weight `32 * b + l`; set means the
    /// quant is `q2 + 0`, clear means `q2 - 4`.
    pub hmask: [u8; QK_K / 8],
    /// Low two bits: in each 128-weight half `h`, bits `2k..2k+2` of byte `32 * h + l`
    /// belong to weight `128 * h + 32 * k + l`.
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales (offset by 32): low nibbles in bytes 0..8, top two bits
    /// in bytes 8..12.
    pub scales: [u8; 12],
    /// Scale of the group scales.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// Packs sixteen 6-bit values (`0..64`) into Q3_K's 12 scale bytes.
fn pack_scales(l: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in l.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    s
}

/// Unpacks Q3_K's 12 scale bytes into sixteen 6-bit scales (`0..64`, offset by 32),
/// four per little-endian word, with ggml's 32-bit masking: words 0-1 hold the low
/// nibbles, word 2 the top bits.
#[inline(always)]
fn unpack_scale_words(s: &[u8; 12]) -> [u32; 4] {
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, t) = (w(0), w(1), w(2));
    [
        (a0 & M4) | ((t & M2) << 4),
        (a1 & M4) | (((t >> 2) & M2) << 4),
        ((a0 >> 4) & M4) | (((t >> 4) & M2) << 4),
        ((a1 >> 4) & M4) | (((t >> 6) & M2) << 4),
    ]
}

/// Unpacks Q3_K's 12 scale bytes into signed group scales (`-32..32`).
#[inline(always)]
pub(crate) fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(unpack_scale_words(s)) {
        for (o, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *o = b as i8 - 32;
        }
    }
    out
}

impl BlockQ3K {
    /// ggml's `quantize_row_q3_K_ref` for one super-block.
    #[inline(always)]
    pub fn quantize(x: &[f32; QK_K]) -> Self {
        let xt: [[f32; 16]; 16] = to_lanes(x);
        let mut lt = [[0i8; 16]; 16];
        let scales = lanes::make_q3_quants::<16>(4, &xt, &mut lt);
        let mut l = [0i8; QK_K];
        from_lanes(&lt, &mut l);
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for &scale in &scales {
            if scale.abs() > amax {
                amax = scale.abs();
                max_scale = scale;
            }
        }
        let mut y = <Self as bytemuck::Zeroable>::zeroed();
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            // ggml stores nearest_int into an int8_t before clamping: keep that wrap.
            let ls: [u8; 16] = std::array::from_fn(|j| {
                ((nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32) as u8
            });
            y.scales = pack_scales(&ls);
            y.d = f16::from_f32(1.0 / iscale);
        }
        let sc = unpack_scales(&y.scales);
        for j in 0..16 {
            let d = f16_to_f32(y.d) * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * j..16 * j + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        // Levels are 0..8 here, so ggml's `if l > 3 { set the high bit; l -= 4 }` is
        // bit 2 moved into `hmask`: done without a branch per weight.
        for (b, chunk) in l.chunks_exact_mut(32).enumerate() {
            for (m, l) in y.hmask.iter_mut().zip(chunk) {
                *m |= (((*l as u8) >> 2) & 1) << b;
                *l &= 3;
            }
        }
        for h in 0..2 {
            let l = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                y.qs[32 * h + i] =
                    (l[i] | (l[32 + i] << 2) | (l[64 + i] << 4) | (l[96 + i] << 6)) as u8;
            }
        }
        y
    }

    /// The quant of weight `128 * h + 32 * k + i` plus 4 (`0..8`).
    #[inline(always)]
    fn q(&self, h: usize, k: usize, i: usize) -> i32 {
        let low = (self.qs[32 * h + i] >> (2 * k)) & 3;
        let high = (self.hmask[i] >> (4 * h + k)) & 1;
        (low | (high << 2)) as i32
    }

    /// All quants plus 4, in weight order.
    #[inline(always)]
    fn quants(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for h in 0..2 {
            let out = &mut q[128 * h..128 * h + 128];
            let qs = &self.qs[32 * h..32 * h + 32];
            for i in 0..32 {
                let (b, m) = (qs[i], self.hmask[i] >> (4 * h));
                out[i] = (b & 3) | ((m & 1) << 2);
                out[32 + i] = ((b >> 2) & 3) | ((m & 2) << 1);
                out[64 + i] = ((b >> 4) & 3) | (m & 4);
                out[96 + i] = (b >> 6) | ((m & 8) >> 1);
            }
        }
        q
    }

    /// ggml's `dequantize_row_q3_K` for one super-block.
    pub fn dequantize(&self, out: &mut [f32; QK_K]) {
        let d = f16_to_f32(self.d);
        let sc = unpack_scales(&self.scales);
        for h in 0..2 {
            for k in 0..4 {
                for i in 0..32 {
                    let e = 128 * h + 32 * k + i;
                    let dl = d * sc[e / 16] as f32;
                    out[e] = dl * (self.q(h, k, i) - 4) as f32;
                }
            }
        }
    }
}

/// Q3_K x Q8_K on any CPU.
pub fn vec_dot_portable(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let sc = unpack_scales(&x.scales).map(i32::from);
        // Quants are summed with offset 4 (0..8), taken off through the group sums.
        let offset: i32 = (0..16).map(|j| sc[j] * y.bsums[j] as i32).sum();
        let isum = group_sums::<16>(&x.quants(), &y.qs, &sc).wrapping_sub(4 * offset);
        acc = fold(acc, y.d * f16_to_f32(x.d), isum, 0.0, 0);
    }
    acc
}

/// Q3_K x Q8_K with AVX2; bit-identical to [`vec_dot_portable`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn vec_dot_avx2(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    super::avx2::dot(x, y)
}

#[cfg(target_arch = "x86_64")]
impl super::avx2::Kernel for BlockQ3K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sums(
        &self,
        y: &BlockQ8K,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use super::avx2::{load, pick_pair};
        use std::arch::x86_64::*;
        let two_bits = _mm256_set1_epi8(3);
        let one_bit = _mm256_set1_epi8(1);
        let [w0, w1, w2, w3] = unpack_scale_words(&self.scales).map(|w| w as i32);
        let sc8 = _mm_sub_epi8(_mm_setr_epi32(w0, w1, w2, w3), _mm_set1_epi8(32));
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        // Quants are summed with offset 4 (0..8), taken off through the group sums.
        let offset = _mm256_slli_epi32::<2>(_mm256_madd_epi16(load(y.bsums.as_ptr().cast()), sc16));
        let mut sum = _mm256_sub_epi32(_mm256_setzero_si256(), offset);
        // Shifted right one bit per 32-weight chunk, so that bit 0 is the chunk's.
        let mut hm = load(self.hmask.as_ptr());
        for h in 0..2 {
            let scales = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let mut q = load(self.qs.as_ptr().add(32 * h));
            for k in 0..4 {
                let high = _mm256_slli_epi16::<2>(_mm256_and_si256(hm, one_bit));
                let q3 = _mm256_or_si256(_mm256_and_si256(q, two_bits), high);
                let ys = load(y.qs.as_ptr().add(128 * h + 32 * k).cast());
                let p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(q3, ys),
                    pick_pair(scales, 2 * k, 2 * k + 1),
                );
                sum = _mm256_add_epi32(sum, p);
                q = _mm256_srli_epi16::<2>(q);
                hm = _mm256_srli_epi16::<1>(hm);
            }
        }
        (sum, _mm_setzero_si128())
    }

    fn scales(&self, y: &BlockQ8K) -> (f32, f32) {
        (y.d * f16_to_f32(self.d), 0.0)
    }

    #[inline(always)]
    unsafe fn scales4(
        x: &[Self; 4],
        y: &[BlockQ8K; 4],
    ) -> (std::arch::x86_64::__m128, std::arch::x86_64::__m128) {
        super::avx2::f16_scales4::<false>(x.map(|b| b.d.to_bits() as u32), y)
    }
}

impl_kquant!(BlockQ3K, Q3_K);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kquants::testutil::*;

    #[test]
    fn scale_packing_round_trips() {
        let l: [u8; 16] = std::array::from_fn(|j| ((j * 37 + 5) % 64) as u8);
        let back = unpack_scales(&pack_scales(&l));
        for j in 0..16 {
            assert_eq!(back[j] as i32 + 32, l[j] as i32);
        }
    }

    #[test]
    fn dot_paths_agree_on_arbitrary_bytes() {
        check_dot_raw::<BlockQ3K>(vec_dot_portable, avx2_fn!(vec_dot_avx2));
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        check_dot::<BlockQ3K>(vec_dot_portable, avx2_fn!(vec_dot_avx2), 4e-2);
    }

    #[test]
    fn round_trip_error_is_bounded() {
        check_round_trip::<BlockQ3K>(0.25);
    }

    #[test]
    fn zero_row_is_all_zero() {
        check_zero_row::<BlockQ3K>();
    }
}
