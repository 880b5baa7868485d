//! Plain float formats (F32, F16, BF16) as one-weight blocks. STUB
pub type F32 = f32;
pub type F16 = half::f16;
pub type BF16 = half::bf16;
macro_rules! stub { ($t:ty, $g:ident) => {
impl crate::Block for $t {
    const TYPE: crate::GgmlType = crate::GgmlType::$g;
    const WEIGHTS: usize = 1;
    type Act = $t;
    fn dequantize_row(_src: &[Self], _dst: &mut [f32]) { todo!() }
    fn vec_dot(_x: &[Self], _y: &[Self::Act]) -> f32 { todo!() }
}
impl crate::Quantize for $t { fn quantize_row(_src: &[f32], _dst: &mut [Self]) { todo!() } }
}}
stub!(f32, F32);
stub!(half::f16, F16);
stub!(half::bf16, BF16);
