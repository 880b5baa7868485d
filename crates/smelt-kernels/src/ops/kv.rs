//! The KV-cache append: new K and V rows (f32) stored as f16 into their paged slots.
//!
//! Cache layout (the GPU contract): per layer, K and V each f16 `[n_blocks][block_size]
//! [kv_dim]`, `kv_dim = n_head_kv * head_dim`. A sequence's blocks are
//! `block_tables[block_table_offset..]`; block `i` holds positions `i * block_size ..`.

use smelt_ptx::{Exact, FloatRound, Kernel, Load, Store, F16, F32, U32, U64};

use super::{dim, kernel_params, Launch};
use crate::catalog::Entry;

/// Name of [`kv_append_kernel`].
pub const KV_APPEND: &str = "kv_append";

/// One sequence's share of a batch, as the kernels read it from device memory (four u32,
/// in this order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct SeqDesc {
    /// First query row of the sequence in the batch.
    pub row: u32,
    /// Number of new tokens (rows).
    pub n_tokens: u32,
    /// Position of the first new token.
    pub start_pos: u32,
    /// Where the sequence's blocks start in the flat block table array.
    pub block_table_offset: u32,
}

impl SeqDesc {
    /// The descriptor as the four words the kernels read.
    pub fn words(&self) -> [u32; 4] {
        [
            self.row,
            self.n_tokens,
            self.start_pos,
            self.block_table_offset,
        ]
    }
}

/// The kernel of this module.
pub fn catalog() -> Vec<Entry> {
    vec![(KV_APPEND.to_string(), Box::new(kv_append_kernel))]
}

/// Threads per block.
pub const THREADS: u32 = 256;

/// Launch for `n_seqs` sequences of at most `max_tokens` new tokens each, rows of
/// `kv_dim` values. Any `grid.z` is correct (blocks stride over a sequence's tokens);
/// this one gives every token its own blocks, up to 1024.
pub fn launch(n_seqs: usize, max_tokens: usize, kv_dim: usize) -> Launch {
    Launch::new(
        (
            dim(kv_dim.div_ceil(THREADS as usize)),
            dim(n_seqs),
            dim(max_tokens.min(1024)),
        ),
        (THREADS, 1, 1),
    )
}

kernel_params! {
    /// Arguments of [`kv_append_kernel`].
    KvAppendArgs, KvAppendRegs {
        k: Ptr,
        v: Ptr,
        k_cache: Ptr,
        v_cache: Ptr,
        seqs: Ptr,
        block_tables: Ptr,
        kv_dim: U32,
        block_size: U32,
    }
}

/// Stores row `seq.row + t` of `k` and `v` at position `seq.start_pos + t` for every
/// sequence and `t < seq.n_tokens`, rounded to f16 to nearest even (ggml's conversion).
///
/// Parameters: `k: *const f32, v: *const f32, k_cache: *mut f16, v_cache: *mut f16,
/// seqs: *const SeqDesc, block_tables: *const u32, kv_dim: u32, block_size: u32`.
/// Launch: [`launch`] (grid x = column blocks, y = sequences, z strides over tokens).
pub fn kv_append_kernel(k: &Kernel) {
    k.max_threads(THREADS, 1, 1);
    let KvAppendRegs {
        k: kin,
        v: vin,
        k_cache: kc,
        v_cache: vc,
        seqs,
        block_tables: tables,
        kv_dim,
        block_size,
    } = KvAppendRegs::declare(k);
    let d = k.mad(k.reg(), k.ctaid_x(), THREADS, k.tid_x());
    k.exit_if(k.ge(d, kv_dim));
    let desc = k.elem_addr(seqs, k.ctaid_y(), 16);
    let w = k.regs::<U32, 4>();
    k.ld_v4(Load::GLOBAL_NC, w, desc);
    let [row0, n_tokens, start, bto] = w;
    let nz = k.special(smelt_ptx::Special::Nctaid(smelt_ptx::Dim::Z));
    let z = k.special(smelt_ptx::Special::Ctaid(smelt_ptx::Dim::Z));
    k.stride_loop(z, n_tokens, nz, |k, t| {
        let pos = k.add(k.reg(), start, t);
        let bi = k.div_int(k.reg(), pos, block_size);
        let off = k.rem(k.reg(), pos, block_size);
        let ti = k.add(k.reg(), bto, bi);
        let block = k.load::<U32>(Load::GLOBAL_NC, k.elem_addr(tables, ti, 4));
        let slot = k.mad(k.reg(), block, block_size, off);
        let dst = k.mul_wide(k.reg::<U64>(), slot, kv_dim);
        let dcol = k.cvt(k.reg::<U64>(), d, Exact);
        k.add(dst, dst, dcol);
        k.shl(dst, dst, 1u32);
        let row = k.add(k.reg(), row0, t);
        let src = k.mad(k.reg(), row, kv_dim, d);
        let a = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(kin, src, 4));
        let b = k.load::<F32>(Load::GLOBAL_NC, k.elem_addr(vin, src, 4));
        let ah = k.cvt(k.reg::<F16>(), a, FloatRound::Rn);
        let bh = k.cvt(k.reg::<F16>(), b, FloatRound::Rn);
        k.st(Store::GLOBAL, k.add(k.reg(), kc, dst), ah);
        k.st(Store::GLOBAL, k.add(k.reg(), vc, dst), bh);
    });
}

/// CPU twin of [`kv_append_kernel`] on f16 bit caches (`u16`), the CPU backend's
/// `CpuKv::write`.
#[allow(clippy::too_many_arguments)]
pub fn kv_append_cpu(
    k: &[f32],
    v: &[f32],
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    seqs: &[SeqDesc],
    block_tables: &[u32],
    kv_dim: usize,
    block_size: usize,
) {
    use smelt_quant::fp::f32_to_f16;
    for s in seqs {
        for t in 0..s.n_tokens as usize {
            let pos = s.start_pos as usize + t;
            let block = block_tables[s.block_table_offset as usize + pos / block_size] as usize;
            let slot = block * block_size + pos % block_size;
            let row = s.row as usize + t;
            for d in 0..kv_dim {
                k_cache[slot * kv_dim + d] = f32_to_f16(k[row * kv_dim + d]).to_bits();
                v_cache[slot * kv_dim + d] = f32_to_f16(v[row * kv_dim + d]).to_bits();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ptx::{Module, Target};

    #[test]
    fn kernel_reads_descriptors_from_memory_and_rounds_to_nearest_even() {
        let mut m = Module::new(Target::Sm80);
        m.kernel(KV_APPEND, kv_append_kernel).unwrap();
        let ptx = m.to_ptx();
        assert!(ptx.contains("ld.global.nc.v4.u32"));
        assert!(ptx.contains("cvt.rn.f16.f32"));
        assert!(ptx.contains("st.global.b16"));
        assert!(!ptx.contains("start_pos"));
    }

    #[test]
    fn twin_writes_slots_through_the_block_table() {
        let (kv_dim, bs) = (2, 2);
        let k: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..6).map(|i| -(i as f32)).collect();
        let mut kc = vec![0u16; 4 * bs * kv_dim];
        let mut vc = kc.clone();
        // One sequence: 3 tokens from position 1, blocks [3, 0].
        let seqs = [SeqDesc {
            row: 0,
            n_tokens: 3,
            start_pos: 1,
            block_table_offset: 1,
        }];
        kv_append_cpu(&k, &v, &mut kc, &mut vc, &seqs, &[9, 3, 0], kv_dim, bs);
        let h = |x: f32| smelt_quant::fp::f32_to_f16(x).to_bits();
        // Position 1 -> block 3 slot 1; 2 -> block 0 slot 0; 3 -> block 0 slot 1.
        assert_eq!(&kc[(3 * bs + 1) * kv_dim..][..2], &[h(0.0), h(1.0)]);
        assert_eq!(&kc[0..4], &[h(2.0), h(3.0), h(4.0), h(5.0)]);
        assert_eq!(vc[1], h(-3.0));
    }
}
