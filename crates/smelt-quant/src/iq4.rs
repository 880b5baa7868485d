//! Non-linear 4-bit formats (IQ4_NL, IQ4_XS): dequantize and dot. STUB

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub raw: [u8; 18],
}

impl crate::Block for BlockIQ4NL {
    const TYPE: crate::GgmlType = crate::GgmlType::IQ4_NL;
    const WEIGHTS: usize = 32;
    type Act = crate::legacy::BlockQ8_0;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub raw: [u8; 136],
}

impl crate::Block for BlockIQ4XS {
    const TYPE: crate::GgmlType = crate::GgmlType::IQ4_XS;
    const WEIGHTS: usize = 256;
    type Act = crate::kquants::BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}
