//! The tensor element types GGUF files name, with their block geometry.
//!
//! The ids are ggml's `enum ggml_type`; gaps are types ggml removed, which a reader must
//! reject rather than guess a size for.

/// A ggml tensor element type, as stored in a GGUF tensor-info record.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    /// NVIDIA's FP4: 64 E2M1 values with four FP8 (UE4M3) scales, one per 16.
    NVFP4 = 40,
    /// 1-bit weights, 128 per block under one f16 scale.
    Q1_0 = 41,
}

impl GgmlType {
    /// Every type this reader knows, in id order.
    pub const ALL: [GgmlType; 34] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
    ];

    /// The type with ggml id `id`, or `None` for ids ggml never had or removed.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// ggml's id for this type.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_size(self) -> usize {
        self.geometry().0
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.geometry().1
    }

    /// Whether this is a block-quantized type (as opposed to a plain scalar type).
    pub fn is_quantized(self) -> bool {
        !matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::F64
                | Self::I8
                | Self::I16
                | Self::I32
                | Self::I64
        )
    }

    /// Bytes taken by a row of `n` elements, or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    /// ggml's lower-case name (`q4_K`, `f16`, ...), as `ggml_type_name` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q8_1 => "q8_1",
            Self::Q2_K => "q2_K",
            Self::Q3_K => "q3_K",
            Self::Q4_K => "q4_K",
            Self::Q5_K => "q5_K",
            Self::Q6_K => "q6_K",
            Self::Q8_K => "q8_K",
            Self::IQ2_XXS => "iq2_xxs",
            Self::IQ2_XS => "iq2_xs",
            Self::IQ3_XXS => "iq3_xxs",
            Self::IQ1_S => "iq1_s",
            Self::IQ4_NL => "iq4_nl",
            Self::IQ3_S => "iq3_s",
            Self::IQ2_S => "iq2_s",
            Self::IQ4_XS => "iq4_xs",
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::F64 => "f64",
            Self::IQ1_M => "iq1_m",
            Self::BF16 => "bf16",
            Self::TQ1_0 => "tq1_0",
            Self::TQ2_0 => "tq2_0",
            Self::MXFP4 => "mxfp4",
            Self::NVFP4 => "nvfp4",
            Self::Q1_0 => "q1_0",
        }
    }

    /// Parses a type name case-insensitively (`Q4_K`, `q4_k`, `bf16`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// (elements per block, bytes per block), from ggml's type traits.
    fn geometry(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q8_1 => (32, 36),
            Self::Q2_K => (256, 84),
            Self::Q3_K => (256, 110),
            Self::Q4_K => (256, 144),
            Self::Q5_K => (256, 176),
            Self::Q6_K => (256, 210),
            Self::Q8_K => (256, 292),
            Self::IQ2_XXS => (256, 66),
            Self::IQ2_XS => (256, 74),
            Self::IQ3_XXS => (256, 98),
            Self::IQ1_S => (256, 50),
            Self::IQ4_NL => (32, 18),
            Self::IQ3_S => (256, 110),
            Self::IQ2_S => (256, 82),
            Self::IQ4_XS => (256, 136),
            Self::I8 => (1, 1),
            Self::I16 => (1, 2),
            Self::I32 => (1, 4),
            Self::I64 => (1, 8),
            Self::F64 => (1, 8),
            Self::IQ1_M => (256, 56),
            Self::BF16 => (1, 2),
            Self::TQ1_0 => (256, 54),
            Self::TQ2_0 => (256, 66),
            Self::MXFP4 => (32, 17),
            // gguf-py 0.19's GGML_QUANT_SIZES: 32 bytes of nibbles + 4 scale bytes.
            Self::NVFP4 => (64, 36),
            // 16 bytes of sign bits + an f16 scale.
            Self::Q1_0 => (128, 18),
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_gaps_are_rejected() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for gap in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert_eq!(GgmlType::from_id(gap), None);
        }
    }

    #[test]
    fn newest_types_have_gguf_py_geometry() {
        // gguf-py 0.19: NVFP4 (64, 4 + 32), Q1_0 (128, 2 + 16).
        assert_eq!(GgmlType::from_id(40), Some(GgmlType::NVFP4));
        assert_eq!(GgmlType::from_id(41), Some(GgmlType::Q1_0));
        assert_eq!(GgmlType::NVFP4.row_bytes(4096), Some(64 * 36));
        assert_eq!(GgmlType::Q1_0.row_bytes(4096), Some(32 * 18));
        assert_eq!(GgmlType::Q1_0.row_bytes(64), None);
        assert!(GgmlType::NVFP4.is_quantized() && GgmlType::Q1_0.is_quantized());
        assert_eq!(GgmlType::from_name("NVFP4"), Some(GgmlType::NVFP4));
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
