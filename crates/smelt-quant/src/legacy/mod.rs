//! Legacy 32-weight block formats (Q4_0 ... Q8_1). STUB

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub raw: [u8; 18],
}

impl crate::Block for BlockQ4_0 {
    const TYPE: crate::GgmlType = crate::GgmlType::Q4_0;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_0;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ4_0 {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub raw: [u8; 20],
}

impl crate::Block for BlockQ4_1 {
    const TYPE: crate::GgmlType = crate::GgmlType::Q4_1;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_1;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ4_1 {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub raw: [u8; 22],
}

impl crate::Block for BlockQ5_0 {
    const TYPE: crate::GgmlType = crate::GgmlType::Q5_0;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_0;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ5_0 {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub raw: [u8; 24],
}

impl crate::Block for BlockQ5_1 {
    const TYPE: crate::GgmlType = crate::GgmlType::Q5_1;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_1;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ5_1 {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub raw: [u8; 34],
}

impl crate::Block for BlockQ8_0 {
    const TYPE: crate::GgmlType = crate::GgmlType::Q8_0;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_0;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ8_0 {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}

/// STUB: replaced by the real layout.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub raw: [u8; 36],
}

impl crate::Block for BlockQ8_1 {
    const TYPE: crate::GgmlType = crate::GgmlType::Q8_1;
    const WEIGHTS: usize = 32;
    type Act = BlockQ8_1;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) {
        todo!()
    }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl crate::Quantize for BlockQ8_1 {
    fn quantize_row(_src: &[f32], _dst: &mut [Self]) {
        todo!()
    }
}
