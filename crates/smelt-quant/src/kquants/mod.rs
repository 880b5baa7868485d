//! K-quants: 256-weight super-blocks (Q2_K ... Q8_K). STUB

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub raw: [u8; 84],
}

impl crate::Block for BlockQ2K {
    const TYPE: crate::GgmlType = crate::GgmlType::Q2_K;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ2K {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub raw: [u8; 110],
}

impl crate::Block for BlockQ3K {
    const TYPE: crate::GgmlType = crate::GgmlType::Q3_K;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ3K {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub raw: [u8; 144],
}

impl crate::Block for BlockQ4K {
    const TYPE: crate::GgmlType = crate::GgmlType::Q4_K;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ4K {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub raw: [u8; 176],
}

impl crate::Block for BlockQ5K {
    const TYPE: crate::GgmlType = crate::GgmlType::Q5_K;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ5K {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub raw: [u8; 210],
}

impl crate::Block for BlockQ6K {
    const TYPE: crate::GgmlType = crate::GgmlType::Q6_K;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ6K {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub raw: [u8; 292],
}

impl crate::Block for BlockQ8K {
    const TYPE: crate::GgmlType = crate::GgmlType::Q8_K;
    const WEIGHTS: usize = 256;
    type Act = BlockQ8K;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ8K {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}
