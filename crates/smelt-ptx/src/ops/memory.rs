//! Loads, stores and atomics. A load is described by a [`Load`] value (state space,
//! read-only path, cache hints) so the options that make GEMV fast — 16-byte vectors,
//! `.nc`, `.L2::256B` — are one word each at the call site.

use crate::kernel::Kernel;
use crate::ops::warp::Scope;
use crate::reg::{Addr, Src};
use crate::types::{AtomAdd, Data, Int, RegType, U32, U64};
use crate::Reg;

/// A PTX state space that loads and stores address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Device memory.
    Global,
    /// The block's shared memory.
    Shared,
    /// Per-thread spill memory.
    Local,
}

impl Space {
    fn name(self) -> &'static str {
        match self {
            Space::Global => "global",
            Space::Shared => "shared",
            Space::Local => "local",
        }
    }
}

/// How much the L2 cache fetches around a global load (`.L2::64B` ...): a streaming
/// kernel asks for 256 bytes so the next warps' lines are already on their way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L2Prefetch {
    /// `.L2::64B`.
    B64,
    /// `.L2::128B`.
    B128,
    /// `.L2::256B`, what streaming GEMV wants.
    B256,
}

impl L2Prefetch {
    fn name(self) -> &'static str {
        match self {
            L2Prefetch::B64 => "L2::64B",
            L2Prefetch::B128 => "L2::128B",
            L2Prefetch::B256 => "L2::256B",
        }
    }
}

/// A load's cache operator (`.ca` cache everywhere, `.cg` L2 only, `.cs` streaming,
/// `.lu` last use, `.cv` volatile).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadCache {
    /// Cache at all levels (`.ca`).
    Ca,
    /// Cache in L2 only (`.cg`).
    Cg,
    /// Streaming, likely read once (`.cs`).
    Cs,
    /// Last use (`.lu`).
    Lu,
    /// Volatile, fetch again (`.cv`).
    Cv,
}

impl LoadCache {
    fn name(self) -> &'static str {
        match self {
            LoadCache::Ca => "ca",
            LoadCache::Cg => "cg",
            LoadCache::Cs => "cs",
            LoadCache::Lu => "lu",
            LoadCache::Cv => "cv",
        }
    }
}

/// How a load reads memory: `Load::GLOBAL_NC.prefetch(L2Prefetch::B256)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Load {
    space: Space,
    nc: bool,
    cache: Option<LoadCache>,
    prefetch: Option<L2Prefetch>,
}

impl Load {
    /// A plain global load.
    pub const GLOBAL: Load = Load::new(Space::Global);
    /// A global load through the read-only (non-coherent texture) path: for data no
    /// thread writes during the kernel, such as weights.
    pub const GLOBAL_NC: Load = Load {
        nc: true,
        ..Load::GLOBAL
    };
    /// A shared-memory load.
    pub const SHARED: Load = Load::new(Space::Shared);
    /// A local-memory load.
    pub const LOCAL: Load = Load::new(Space::Local);

    const fn new(space: Space) -> Self {
        Load {
            space,
            nc: false,
            cache: None,
            prefetch: None,
        }
    }

    /// Adds an L2 prefetch-size hint (global loads only).
    pub const fn prefetch(self, size: L2Prefetch) -> Self {
        Load {
            prefetch: Some(size),
            ..self
        }
    }

    /// Adds a cache operator.
    pub const fn cache(self, op: LoadCache) -> Self {
        Load {
            cache: Some(op),
            ..self
        }
    }

    /// The opcode up to the vector and type suffixes, in PTX's order:
    /// `ld.global{.cop}{.nc}{.L2::size}`.
    fn opcode(self) -> Result<String, String> {
        if self.space != Space::Global && (self.nc || self.prefetch.is_some()) {
            return Err(format!(
                "`.nc` and L2 prefetch hints apply to global loads, not {}",
                self.space.name()
            ));
        }
        let mut s = format!("ld.{}", self.space.name());
        if let Some(c) = self.cache {
            s.push('.');
            s.push_str(c.name());
        }
        if self.nc {
            s.push_str(".nc");
        }
        if let Some(p) = self.prefetch {
            s.push('.');
            s.push_str(p.name());
        }
        Ok(s)
    }
}

/// A store's cache operator (`.wb` write back, `.cg` L2 only, `.cs` streaming, `.wt`
/// write through).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreCache {
    /// Write back (`.wb`), the default.
    Wb,
    /// Cache in L2 only (`.cg`).
    Cg,
    /// Streaming, unlikely read soon (`.cs`).
    Cs,
    /// Write through to system memory (`.wt`).
    Wt,
}

/// How a store writes memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Store {
    space: Space,
    cache: Option<StoreCache>,
}

impl Store {
    /// A plain global store.
    pub const GLOBAL: Store = Store {
        space: Space::Global,
        cache: None,
    };
    /// A shared-memory store.
    pub const SHARED: Store = Store {
        space: Space::Shared,
        cache: None,
    };
    /// A local-memory store.
    pub const LOCAL: Store = Store {
        space: Space::Local,
        cache: None,
    };

    /// Adds a cache operator (`.cs` for outputs nobody reads soon).
    pub const fn cache(self, op: StoreCache) -> Self {
        Store {
            cache: Some(op),
            ..self
        }
    }

    fn opcode(self) -> String {
        let cache = match self.cache {
            None => "",
            Some(StoreCache::Wb) => ".wb",
            Some(StoreCache::Cg) => ".cg",
            Some(StoreCache::Cs) => ".cs",
            Some(StoreCache::Wt) => ".wt",
        };
        format!("st.{}{cache}", self.space.name())
    }
}

/// The memory-ordering semantics of [`Kernel::ld_sync`] / [`Kernel::st_sync`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sem {
    /// Morally strong, unordered (`.relaxed`).
    Relaxed,
    /// Later accesses stay after the load (`.acquire`, loads only).
    Acquire,
    /// Earlier accesses stay before the store (`.release`, stores only).
    Release,
}

impl Sem {
    fn name(self) -> &'static str {
        match self {
            Sem::Relaxed => "relaxed",
            Sem::Acquire => "acquire",
            Sem::Release => "release",
        }
    }
}

/// A scope as `ld`/`st`/`fence` spell it (`membar` says `gl` where these say `gpu`).
fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Cta => "cta",
        Scope::Gpu => "gpu",
        Scope::Sys => "sys",
    }
}

/// A narrow memory type loaded into or stored from a wider integer register (PTX lets
/// `ld.u8` fill a 32-bit register, zero- or sign-extending).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Narrow {
    /// Unsigned byte, zero-extended.
    U8,
    /// Signed byte, sign-extended.
    S8,
    /// Unsigned 16 bits, zero-extended.
    U16,
    /// Signed 16 bits, sign-extended.
    S16,
}

impl Narrow {
    fn name(self) -> &'static str {
        match self {
            Narrow::U8 => "u8",
            Narrow::S8 => "s8",
            Narrow::U16 => "u16",
            Narrow::S16 => "s16",
        }
    }
}

fn vector<T: RegType, const N: usize>(regs: &[Reg<T>; N]) -> String {
    let names: Vec<String> = regs.iter().map(|r| r.to_string()).collect();
    format!("{{{}}}", names.join(", "))
}

impl Kernel {
    fn load_opcode(&self, op: Load) -> String {
        match op.opcode() {
            Ok(s) => s,
            Err(reason) => {
                self.fail(reason);
                String::from("ld")
            }
        }
    }

    /// Checks that a vector access stays within the 16 bytes one instruction moves.
    fn check_vector<T: RegType>(&self, lanes: u32) {
        if lanes * T::BITS > 128 {
            self.fail(format!(
                "a {lanes}-lane vector of {} is {} bytes; PTX vectors move at most 16",
                T::NAME,
                lanes * T::BITS / 8
            ));
        }
    }

    /// `d = *addr`.
    pub fn ld<T: Data>(&self, op: Load, d: Reg<T>, addr: impl Into<Addr>) -> Reg<T> {
        let opcode = self.load_opcode(op);
        self.emit(format!("{opcode}.{} {d}, {}", T::MOVE_NAME, addr.into()));
        d
    }

    /// A new register loaded from `addr`: `let x = k.load::<F32>(Load::GLOBAL_NC, a)`.
    pub fn load<T: Data>(&self, op: Load, addr: impl Into<Addr>) -> Reg<T> {
        self.ld(op, self.reg::<T>(), addr)
    }

    /// Two consecutive elements in one instruction (`ld.v2`); `addr` aligned to their size.
    pub fn ld_v2<T: Data>(&self, op: Load, d: [Reg<T>; 2], addr: impl Into<Addr>) {
        let opcode = self.load_opcode(op);
        self.check_vector::<T>(2);
        self.emit(format!(
            "{opcode}.v2.{} {}, {}",
            T::MOVE_NAME,
            vector(&d),
            addr.into()
        ));
    }

    /// Four consecutive elements in one instruction (`ld.global.nc.v4.u32`): the 16-byte
    /// load that streaming kernels are built on; `addr` must be 16-byte aligned for 32-bit
    /// elements.
    pub fn ld_v4<T: Data>(&self, op: Load, d: [Reg<T>; 4], addr: impl Into<Addr>) {
        let opcode = self.load_opcode(op);
        self.check_vector::<T>(4);
        self.emit(format!(
            "{opcode}.v4.{} {}, {}",
            T::MOVE_NAME,
            vector(&d),
            addr.into()
        ));
    }

    /// Loads an 8- or 16-bit value into a wider integer register, extending by the
    /// memory type's sign.
    pub fn ld_narrow<T: Int>(
        &self,
        op: Load,
        mem: Narrow,
        d: Reg<T>,
        addr: impl Into<Addr>,
    ) -> Reg<T> {
        let opcode = self.load_opcode(op);
        self.emit(format!("{opcode}.{} {d}, {}", mem.name(), addr.into()));
        d
    }

    /// `*addr = v`.
    pub fn st<T: Data>(&self, op: Store, addr: impl Into<Addr>, v: Reg<T>) {
        self.emit(format!(
            "{}.{} {}, {v}",
            op.opcode(),
            T::MOVE_NAME,
            addr.into()
        ));
    }

    /// Stores two consecutive elements (`st.v2`).
    pub fn st_v2<T: Data>(&self, op: Store, addr: impl Into<Addr>, v: [Reg<T>; 2]) {
        self.check_vector::<T>(2);
        self.emit(format!(
            "{}.v2.{} {}, {}",
            op.opcode(),
            T::MOVE_NAME,
            addr.into(),
            vector(&v)
        ));
    }

    /// Stores four consecutive elements (`st.v4`), 16 bytes for 32-bit elements.
    pub fn st_v4<T: Data>(&self, op: Store, addr: impl Into<Addr>, v: [Reg<T>; 4]) {
        self.check_vector::<T>(4);
        self.emit(format!(
            "{}.v4.{} {}, {}",
            op.opcode(),
            T::MOVE_NAME,
            addr.into(),
            vector(&v)
        ));
    }

    /// Stores the low 8 or 16 bits of an integer register.
    pub fn st_narrow<T: Int>(&self, op: Store, mem: Narrow, addr: impl Into<Addr>, v: Reg<T>) {
        self.emit(format!(
            "{}.{} {}, {v}",
            op.opcode(),
            mem.name(),
            addr.into()
        ));
    }

    /// Atomically adds `v` at `addr` and returns the old value (`atom.global.add.f32`).
    pub fn atom_add<T: AtomAdd>(
        &self,
        space: Space,
        d: Reg<T>,
        addr: impl Into<Addr>,
        v: impl Src<T>,
    ) -> Reg<T> {
        self.check_atomic_space(space);
        self.emit(format!(
            "atom.{}.add.{} {d}, {}, {}",
            space.name(),
            T::NAME,
            addr.into(),
            v.operand()
        ));
        d
    }

    /// Atomically adds `v` at `addr`, discarding the old value (`red.global.add.f32`):
    /// cheaper than [`Kernel::atom_add`] when nobody reads the result.
    pub fn red_add<T: AtomAdd>(&self, space: Space, addr: impl Into<Addr>, v: impl Src<T>) {
        self.check_atomic_space(space);
        self.emit(format!(
            "red.{}.add.{} {}, {}",
            space.name(),
            T::NAME,
            addr.into(),
            v.operand()
        ));
    }

    /// Compare-and-swap on 32 bits (`atom.global.cas.b32`): stores `new` if the word
    /// equals `expected`; returns the old word.
    pub fn atom_cas(
        &self,
        space: Space,
        d: Reg<U32>,
        addr: impl Into<Addr>,
        expected: impl Src<U32>,
        new: impl Src<U32>,
    ) -> Reg<U32> {
        self.check_atomic_space(space);
        self.emit(format!(
            "atom.{}.cas.b32 {d}, {}, {}, {}",
            space.name(),
            addr.into(),
            expected.operand(),
            new.operand()
        ));
        d
    }

    /// A global load that synchronises with other threads (PTX memory model): `ld.acquire.sys`
    /// (every later access of this thread, and of threads ordered after it by a barrier,
    /// sees what the releasing writer wrote before its release), or `ld.relaxed.gpu` (a
    /// morally strong load with no ordering). The flag side of a cross-GPU handshake reads
    /// with `Sem::Acquire` at `Scope::Sys`.
    pub fn ld_sync<T: Data>(
        &self,
        sem: Sem,
        scope: Scope,
        d: Reg<T>,
        addr: impl Into<Addr>,
    ) -> Reg<T> {
        if sem == Sem::Release {
            self.fail("a load cannot have release semantics (use Acquire or Relaxed)");
        }
        self.emit(format!(
            "ld.{}.{}.global.{} {d}, {}",
            sem.name(),
            scope_name(scope),
            T::MOVE_NAME,
            addr.into()
        ));
        d
    }

    /// A global store that synchronises with other threads: `st.release.sys` makes every
    /// write this thread (and the threads ordered before it by a barrier) did before it
    /// visible to whoever acquires the stored value, in `scope`.
    pub fn st_sync<T: Data>(&self, sem: Sem, scope: Scope, addr: impl Into<Addr>, v: Reg<T>) {
        if sem == Sem::Acquire {
            self.fail("a store cannot have acquire semantics (use Release or Relaxed)");
        }
        self.emit(format!(
            "st.{}.{}.global.{} {}, {v}",
            sem.name(),
            scope_name(scope),
            T::MOVE_NAME,
            addr.into()
        ));
    }

    fn check_atomic_space(&self, space: Space) {
        if space == Space::Local {
            self.fail("atomics act on global or shared memory, not local");
        }
    }

    /// `base + index * elem_bytes` as a new 64-bit address (`mul.wide.u32` + `add.u64`).
    pub fn elem_addr(&self, base: Reg<U64>, index: Reg<U32>, elem_bytes: u32) -> Reg<U64> {
        let offset = self.mul_wide(self.reg::<U64>(), index, elem_bytes);
        self.add(offset, base, offset)
    }

    /// Asks L2 to fetch the line at `addr` ahead of a later load (`prefetch.global.L2`).
    pub fn prefetch_l2(&self, addr: impl Into<Addr>) {
        self.emit(format!("prefetch.global.L2 {}", addr.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PtxError;
    use crate::module::{Module, Target};
    use crate::testing::body;
    use crate::types::{F16, F32, S32};

    #[test]
    fn loads_spell_options_in_ptx_order() {
        let text = body(|k| {
            let p = k.reg::<U64>();
            let x = k.reg::<F32>();
            k.ld(Load::GLOBAL, x, p);
            k.ld(Load::GLOBAL_NC, x, p.at(4));
            let q = k.regs::<U32, 4>();
            k.ld_v4(Load::GLOBAL_NC.prefetch(L2Prefetch::B256), q, p.at(16));
            k.ld_v2(Load::GLOBAL.cache(LoadCache::Cg), [q[0], q[1]], p);
            let h = k.reg::<F16>();
            k.ld(Load::GLOBAL_NC, h, p);
            k.ld_narrow(Load::GLOBAL_NC, Narrow::U16, q[0], p.at(2));
            k.ld_narrow(Load::GLOBAL, Narrow::S8, k.reg::<S32>(), p);
            k.ld(Load::SHARED, x, q[1].at(128));
            k.load::<F32>(Load::GLOBAL_NC, p.at(8));
        });
        assert_eq!(
            text,
            [
                "ld.global.f32 %f0, [%rd0];",
                "ld.global.nc.f32 %f0, [%rd0+4];",
                "ld.global.nc.L2::256B.v4.u32 {%r0, %r1, %r2, %r3}, [%rd0+16];",
                "ld.global.cg.v2.u32 {%r0, %r1}, [%rd0];",
                "ld.global.nc.b16 %h0, [%rd0];",
                "ld.global.nc.u16 %r0, [%rd0+2];",
                "ld.global.s8 %s0, [%rd0];",
                "ld.shared.f32 %f0, [%r1+128];",
                "ld.global.nc.f32 %f1, [%rd0+8];",
            ]
        );
    }

    #[test]
    fn stores_and_atomics() {
        let text = body(|k| {
            let p = k.reg::<U64>();
            let x = k.reg::<F32>();
            k.st(Store::GLOBAL, p, x);
            k.st_v4(
                Store::GLOBAL.cache(StoreCache::Cs),
                p.at(16),
                k.regs::<F32, 4>(),
            );
            k.st_v2(Store::SHARED, k.reg::<U32>(), k.regs::<U32, 2>());
            k.st_narrow(Store::GLOBAL, Narrow::U8, p.at(3), k.reg::<U32>());
            k.atom_add(Space::Global, x, p, x);
            k.red_add::<F32>(Space::Global, p, 1.0f32);
            k.atom_add(Space::Shared, k.reg::<U32>(), k.reg::<U32>(), 1u32);
            k.atom_cas(Space::Global, k.reg::<U32>(), p, 0u32, 1u32);
            let a = k.elem_addr(p, k.reg::<U32>(), 34);
            k.prefetch_l2(a);
        });
        assert_eq!(
            text,
            [
                "st.global.f32 [%rd0], %f0;",
                "st.global.cs.v4.f32 [%rd0+16], {%f1, %f2, %f3, %f4};",
                "st.shared.v2.u32 [%r0], {%r1, %r2};",
                "st.global.u8 [%rd0+3], %r3;",
                "atom.global.add.f32 %f0, [%rd0], %f0;",
                "red.global.add.f32 [%rd0], 0f3F800000;",
                "atom.shared.add.u32 %r4, [%r5], 1;",
                "atom.global.cas.b32 %r6, [%rd0], 0, 1;",
                "mul.wide.u32 %rd1, %r7, 34;",
                "add.u64 %rd1, %rd0, %rd1;",
                "prefetch.global.L2 [%rd1];",
            ]
        );
    }

    #[test]
    fn ordered_loads_and_stores_spell_semantics_then_scope() {
        let text = body(|k| {
            let p = k.reg::<U64>();
            let f = k.reg::<U32>();
            k.st_sync(Sem::Release, Scope::Sys, p.at(8), f);
            k.ld_sync(Sem::Acquire, Scope::Sys, f, p);
            k.ld_sync(Sem::Relaxed, Scope::Gpu, f, p.at(4));
        });
        assert_eq!(
            text,
            [
                "st.release.sys.global.u32 [%rd0+8], %r0;",
                "ld.acquire.sys.global.u32 %r0, [%rd0];",
                "ld.relaxed.gpu.global.u32 %r0, [%rd0+4];",
            ]
        );
        let mut m = Module::new(Target::Sm80);
        let err = m.kernel("k", |k| {
            let p = k.reg::<U64>();
            k.ld_sync(Sem::Release, Scope::Sys, k.reg::<U32>(), p);
        });
        assert!(matches!(err, Err(PtxError::Invalid { .. })), "{err:?}");
    }

    #[test]
    fn misused_options_are_refused() {
        let mut m = Module::new(Target::Sm80);
        let err = m.kernel("k", |k| {
            let r = k.reg::<U32>();
            k.ld(Load::SHARED.prefetch(L2Prefetch::B256), r, r);
        });
        assert!(matches!(err, Err(PtxError::Invalid { .. })), "{err:?}");
        let err = m.kernel("k2", |k| {
            let p = k.reg::<U64>();
            k.ld_v4(Load::GLOBAL, k.regs::<U64, 4>(), p);
        });
        assert!(matches!(err, Err(PtxError::Invalid { .. })), "{err:?}");
    }
}
