//! The kernel builder: register allocation, the instruction stream, parameters, shared
//! arrays, labels and predication. Instruction families live in `ops/`, each an `impl`
//! block on [`Kernel`].

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;

use crate::error::PtxError;
use crate::module::{GridDep, Target};
use crate::reg::{Addr, Cond, Reg};
use crate::types::{Data, RegType, CLASSES, U32, U64};

/// A branch target inside one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Label(u32);

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$L__{}", self.0)
    }
}

/// A shared-memory array declared in a kernel. Its name is an address in the shared
/// window: use [`Shared::at`] directly in `ld`/`st`, or [`Kernel::shared_base`] to get it
/// into a register for computed indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    name: String,
    bytes: u32,
}

impl Shared {
    /// The array's address plus `bytes`.
    pub fn at(&self, bytes: i64) -> Addr {
        Addr::symbol(&self.name).offset(bytes)
    }

    /// The array's size in bytes.
    pub fn bytes(&self) -> u32 {
        self.bytes
    }

    /// The array's PTX name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One kernel (`.entry`) being built. Every method appends PTX in call order, so a Rust
/// loop around calls unrolls at generation time and Rust generics specialise kernels.
///
/// Every method takes `&self` (the state lives in cells), so calls nest the way the
/// expressions they stand for do: `k.exit_if(k.ge(i, n))`, `let s = k.add(k.reg(), a, b)`.
/// Arguments are evaluated, and so emitted, before the instruction that uses them.
pub struct Kernel {
    name: String,
    target: Target,
    params: RefCell<Vec<String>>,
    decls: RefCell<Vec<String>>,
    /// Module-scope declarations placed before the `.entry` (the dynamic shared array).
    module_decls: RefCell<Vec<String>>,
    names: RefCell<HashSet<String>>,
    directives: RefCell<Vec<String>>,
    counters: [Cell<u32>; CLASSES],
    next_label: Cell<u32>,
    placed: RefCell<HashSet<u32>>,
    targeted: RefCell<HashSet<u32>>,
    body: RefCell<Vec<String>>,
    guard: Cell<Option<Cond>>,
    error: RefCell<Option<PtxError>>,
    grid_dep: Cell<GridDep>,
    waited: Cell<bool>,
    launched: Cell<bool>,
    timeline: Cell<bool>,
}

/// PTX identifiers: a letter or underscore, then letters, digits, `_` or `$`.
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

impl Kernel {
    pub(crate) fn new(name: &str, target: Target) -> Result<Self, PtxError> {
        if !is_identifier(name) {
            return Err(PtxError::BadName {
                kernel: name.to_string(),
                what: "kernel",
                name: name.to_string(),
            });
        }
        Ok(Self {
            name: name.to_string(),
            target,
            params: RefCell::default(),
            decls: RefCell::default(),
            module_decls: RefCell::default(),
            names: RefCell::default(),
            directives: RefCell::default(),
            counters: Default::default(),
            next_label: Cell::new(0),
            placed: RefCell::default(),
            targeted: RefCell::default(),
            body: RefCell::default(),
            guard: Cell::new(None),
            error: RefCell::new(None),
            grid_dep: Cell::new(GridDep::default()),
            waited: Cell::new(false),
            launched: Cell::new(false),
            timeline: Cell::new(false),
        })
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The architecture being generated for, so a kernel can choose instructions by it.
    pub fn target(&self) -> Target {
        self.target
    }

    pub(crate) fn set_timeline(&self, on: bool) {
        self.timeline.set(on);
    }

    pub(crate) fn set_grid_dep(&self, grid_dep: GridDep) {
        self.grid_dep.set(grid_dep.for_target(self.target));
    }

    /// How this kernel takes part in programmatic dependent launch (the module's setting;
    /// off before sm_90). A kernel that has work reading nothing earlier grids wrote does
    /// it before [`Kernel::grid_dep_wait`] when `early_work` is on.
    pub fn grid_dep(&self) -> GridDep {
        self.grid_dep.get()
    }

    /// `griddepcontrol.wait`: from here on, every grid this launch depends on has ended and
    /// its writes are visible. Emits nothing when the module has programmatic dependent
    /// launch off. A kernel that never calls it waits at entry.
    pub fn grid_dep_wait(&self) {
        let g = self.grid_dep.get();
        if g.wait {
            self.emit("griddepcontrol.wait");
            self.waited.set(true);
            if g.early_launch && g.launch_after_wait && !self.launched.get() {
                self.grid_dep_launch_dependents();
            }
        }
    }

    /// `griddepcontrol.launch_dependents`: the next kernel on the stream may launch once
    /// every block of this one has passed here (or ended); it still waits for this one to
    /// end before reading its output. Emits nothing unless the module has `early_launch`
    /// on. A kernel that never calls it does so at entry (when `early_launch` is on).
    pub fn grid_dep_launch_dependents(&self) {
        let g = self.grid_dep.get();
        if g.wait && g.early_launch {
            self.emit("griddepcontrol.launch_dependents");
            self.launched.set(true);
        }
    }

    /// A fresh register of type `T`.
    pub fn reg<T: RegType>(&self) -> Reg<T> {
        let counter = &self.counters[T::CLASS];
        let id = counter.get();
        counter.set(id + 1);
        Reg::new(id)
    }

    /// `N` fresh registers, for vector loads and register arrays.
    pub fn regs<T: RegType, const N: usize>(&self) -> [Reg<T>; N] {
        std::array::from_fn(|_| self.reg())
    }

    /// A fresh label, to be placed once with [`Kernel::place`].
    pub fn label(&self) -> Label {
        let id = self.next_label.get();
        self.next_label.set(id + 1);
        Label(id)
    }

    /// Refuses the kernel being built: a generator that finds its configuration unusable
    /// (a tile that does not divide a shape, say) says why, and [`crate::Module::kernel`]
    /// returns the reason as an error instead of emitting a broken kernel.
    pub fn reject(&self, reason: impl Into<String>) {
        self.fail(reason);
    }

    /// Records the first misuse; [`crate::Module::kernel`] reports it.
    pub(crate) fn fail(&self, reason: impl Into<String>) {
        self.record(PtxError::Invalid {
            kernel: self.name.clone(),
            reason: reason.into(),
        });
    }

    /// Keeps the first error: later ones are usually its consequences.
    fn record(&self, error: PtxError) {
        self.error.borrow_mut().get_or_insert(error);
    }

    /// Appends one instruction (without the `;`), under the current guard if any.
    pub(crate) fn emit(&self, instr: impl AsRef<str>) {
        let instr = instr.as_ref();
        let line = match self.guard.get() {
            Some(g) => format!("\t@{g} {instr};"),
            None => format!("\t{instr};"),
        };
        self.body.borrow_mut().push(line);
    }

    /// Appends an instruction that carries its own predicate (a conditional branch or
    /// exit), which cannot sit inside a predicated block.
    pub(crate) fn emit_guarded(&self, cond: Cond, instr: &str) {
        if self.in_guard() {
            self.nested_guard(instr);
            return;
        }
        self.body.borrow_mut().push(format!("\t@{cond} {instr};"));
    }

    pub(crate) fn in_guard(&self) -> bool {
        self.guard.get().is_some()
    }

    pub(crate) fn nested_guard(&self, instr: &str) {
        self.record(PtxError::NestedGuard {
            kernel: self.name.clone(),
            instr: instr.to_string(),
        });
    }

    /// Emits any instruction text as is (no trailing `;`), under the current guard: the
    /// escape hatch for instructions this crate has no method for yet. Registers print as
    /// their PTX names, so `format!("tanh.approx.f32 {d}, {a}")` works.
    pub fn raw(&self, instr: impl AsRef<str>) {
        self.emit(instr);
    }

    /// A `//` comment in the output, to find a kernel's phases when reading PTX or SASS.
    pub fn comment(&self, text: &str) {
        for line in text.lines() {
            self.body.borrow_mut().push(format!("\t// {line}"));
        }
    }

    /// Places `label` here. A label must be placed exactly once, outside predicated blocks.
    pub fn place(&self, label: Label) {
        if self.in_guard() {
            self.nested_guard(&format!("{label}:"));
            return;
        }
        if !self.placed.borrow_mut().insert(label.0) {
            self.record(PtxError::LabelPlacedTwice {
                kernel: self.name.clone(),
                label: label.to_string(),
            });
        }
        self.body.borrow_mut().push(format!("{label}:"));
    }

    pub(crate) fn target_label(&self, label: Label) {
        self.targeted.borrow_mut().insert(label.0);
    }

    /// Runs `body` with every instruction predicated on `cond` (`@p` / `@!p`): the
    /// branch-free way to make a few instructions conditional.
    pub fn guarded(&self, cond: impl Into<Cond>, body: impl FnOnce(&Kernel)) {
        if self.in_guard() {
            self.nested_guard("guarded block");
            return;
        }
        self.guard.set(Some(cond.into()));
        body(self);
        self.guard.set(None);
    }

    fn declare_name(&self, what: &'static str, name: &str) -> bool {
        if !is_identifier(name) {
            self.record(PtxError::BadName {
                kernel: self.name.clone(),
                what,
                name: name.to_string(),
            });
            return false;
        }
        if !self.names.borrow_mut().insert(name.to_string()) {
            self.record(PtxError::Duplicate {
                kernel: self.name.clone(),
                name: name.to_string(),
            });
            return false;
        }
        true
    }

    /// Declares a kernel parameter `name` of type `T` and loads it into a register
    /// (`ld.param`). Parameters appear in the order they are declared, which is the order
    /// the host passes them in.
    pub fn param<T: Data>(&self, name: &str) -> Reg<T> {
        let r = self.reg::<T>();
        if self.declare_name("parameter", name) {
            self.params
                .borrow_mut()
                .push(format!(".param .{} {name}", T::MOVE_NAME));
        }
        self.emit(format!("ld.param.{} {r}, [{name}]", T::MOVE_NAME));
        r
    }

    /// Declares a pointer parameter (`.param .u64`) and converts it to a global-space
    /// address (`cvta.to.global`), the form `ld.global`/`st.global` want.
    pub fn param_ptr(&self, name: &str) -> Reg<U64> {
        let generic = self.param::<U64>(name);
        let global = self.reg::<U64>();
        self.emit(format!("cvta.to.global.u64 {global}, {generic}"));
        global
    }

    /// Declares a `u32` scalar parameter (sizes, counts, strides).
    pub fn param_u32(&self, name: &str) -> Reg<U32> {
        self.param::<U32>(name)
    }

    /// Declares a shared-memory array of `len` elements of `T`, aligned to
    /// `max(align, size of T)` bytes (16 for arrays read with vector loads).
    pub fn shared<T: Data>(&self, name: &str, len: u32, align: u32) -> Shared {
        let elem = T::BITS.div_ceil(8);
        let align = align.max(elem);
        if !align.is_power_of_two() {
            self.fail(format!(
                "shared array `{name}`: alignment {align} is not a power of two"
            ));
        }
        if self.declare_name("shared array", name) {
            self.decls.borrow_mut().push(format!(
                ".shared .align {align} .{} {name}[{len}];",
                T::MOVE_NAME
            ));
        }
        Shared {
            name: name.to_string(),
            bytes: len * elem,
        }
    }

    /// Declares the kernel's dynamic shared memory (sized at launch, over the 48 KB that a
    /// static array may take; the driver must be told the kernel's largest size first), at
    /// `align` bytes: an `.extern .shared` array of bytes, which PTX allows only at module
    /// scope, so it is named after the kernel and placed before its `.entry`. One a kernel;
    /// `bytes` is what the kernel addresses, for its own checks.
    pub fn shared_dynamic(&self, align: u32, bytes: u32) -> Shared {
        let name = format!("{}_dyn", self.name);
        if !align.is_power_of_two() {
            self.fail(format!(
                "dynamic shared array: alignment {align} is not a power of two"
            ));
        }
        if self.declare_name("shared array", &name) {
            self.module_decls
                .borrow_mut()
                .push(format!(".extern .shared .align {align} .b8 {name}[];"));
        }
        Shared { name, bytes }
    }

    /// The shared array's address as a 32-bit shared-window register, for computed
    /// indices (`[base + 4*i]`).
    pub fn shared_base(&self, array: &Shared) -> Reg<U32> {
        let r = self.reg::<U32>();
        self.emit(format!("mov.u32 {r}, {}", array.name));
        r
    }

    /// Caps the block size (`.maxntid x, y, z`); ptxas then budgets registers so that
    /// many threads fit, instead of assuming 1024.
    pub fn max_threads(&self, x: u32, y: u32, z: u32) {
        self.directives
            .borrow_mut()
            .push(format!(".maxntid {x}, {y}, {z}"));
    }

    /// Asks for at least `n` resident blocks per SM (`.minnctapersm`), which ptxas meets
    /// by limiting registers.
    pub fn min_blocks_per_sm(&self, n: u32) {
        self.directives
            .borrow_mut()
            .push(format!(".minnctapersm {n}"));
    }

    /// The instruction lines so far, without indentation (for unit tests).
    #[cfg(test)]
    pub(crate) fn body_lines(&self) -> Vec<String> {
        self.body
            .borrow()
            .iter()
            .map(|l| l.trim().to_string())
            .collect()
    }

    /// Checks the kernel as a whole and renders its `.entry`.
    pub(crate) fn finish(self) -> Result<String, PtxError> {
        if let Some(e) = self.error.into_inner() {
            return Err(e);
        }
        let (targeted, placed) = (self.targeted.into_inner(), self.placed.into_inner());
        let mut unplaced: Vec<u32> = targeted.difference(&placed).copied().collect();
        unplaced.sort_unstable();
        if let Some(&id) = unplaced.first() {
            return Err(PtxError::LabelNotPlaced {
                kernel: self.name,
                label: Label(id).to_string(),
            });
        }
        let g = self.grid_dep.get();
        let mut entry = Vec::new();
        let launch = g.wait && g.early_launch && !self.launched.get();
        if launch && !g.launch_after_wait {
            entry.push("\tgriddepcontrol.launch_dependents;".to_string());
        }
        if g.wait && !self.waited.get() {
            entry.push("\tgriddepcontrol.wait;".to_string());
        }
        if launch && g.launch_after_wait {
            entry.push("\tgriddepcontrol.launch_dependents;".to_string());
        }
        let mut params = self.params.into_inner();
        let mut body = self.body.into_inner();
        if self.timeline.get() {
            params.push(format!(".param .u64 {}", crate::timeline::PARAM));
            let mut lines = crate::timeline::prologue();
            if !g.wait {
                // No wait: released at entry.
                lines.extend(crate::timeline::after_wait());
            }
            for line in entry.into_iter().chain(body) {
                if let Some(b) = crate::timeline::redirect_exit(&line) {
                    lines.push(b);
                    continue;
                }
                let wait = crate::timeline::is_wait(&line);
                lines.push(line);
                if wait {
                    lines.extend(crate::timeline::after_wait());
                }
            }
            lines.extend(crate::timeline::epilogue());
            entry = Vec::new();
            body = lines;
        }
        let mut out = String::new();
        for d in self.module_decls.into_inner() {
            out.push_str(&d);
            out.push('\n');
        }
        out.push_str(&format!(".visible .entry {}(", self.name));
        if params.is_empty() {
            out.push_str(")\n");
        } else {
            out.push('\n');
            out.push_str(&format!("\t{}\n)\n", params.join(",\n\t")));
        }
        for d in self.directives.into_inner() {
            out.push_str(&d);
            out.push('\n');
        }
        out.push_str("{\n");
        for (class, counter) in self.counters.iter().enumerate() {
            let n = counter.get();
            if n > 0 {
                let (ty, prefix) = class_decl(class);
                out.push_str(&format!("\t.reg .{ty} {prefix}<{n}>;\n"));
            }
        }
        for d in self.decls.into_inner() {
            out.push_str(&format!("\t{d}\n"));
        }
        out.push('\n');
        for line in entry.into_iter().chain(body) {
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("\tret;\n}\n");
        Ok(out)
    }
}

/// The declared type and name prefix of each register class, by [`RegType::CLASS`].
fn class_decl(class: usize) -> (&'static str, &'static str) {
    crate::types::CLASS_DECLS[class]
}

#[cfg(test)]
mod tests {
    use crate::types::{F32, U32};
    use crate::{Load, Module, PtxError, Store, Target};

    #[test]
    fn entry_declares_params_registers_and_shared_arrays() {
        let mut m = Module::new(Target::Sm80);
        m.kernel("scale", |k| {
            k.max_threads(256, 1, 1);
            let x = k.param_ptr("x");
            let n = k.param_u32("n");
            let tile = k.shared::<F32>("tile", 256, 16);
            let i = k.tid_x();
            k.exit_if(k.ge(i, n));
            let v = k.ld(Load::GLOBAL, k.reg::<F32>(), k.elem_addr(x, i, 4));
            k.st(Store::SHARED, tile.at(0), v);
            let base = k.shared_base(&tile);
            k.ld(Load::SHARED, v, base.at(4));
        })
        .unwrap();
        let ptx = m.to_ptx();
        let entry = &ptx[ptx.find(".visible").unwrap()..];
        assert_eq!(
            entry,
            "\
.visible .entry scale(
\t.param .u64 x,
\t.param .u32 n
)
.maxntid 256, 1, 1
{
\t.reg .pred %p<1>;
\t.reg .u32 %r<3>;
\t.reg .f32 %f<1>;
\t.reg .u64 %rd<3>;
\t.shared .align 16 .f32 tile[256];

\tld.param.u64 %rd0, [x];
\tcvta.to.global.u64 %rd1, %rd0;
\tld.param.u32 %r0, [n];
\tmov.u32 %r1, %tid.x;
\tsetp.ge.u32 %p0, %r1, %r0;
\t@%p0 exit;
\tmul.wide.u32 %rd2, %r1, 4;
\tadd.u64 %rd2, %rd1, %rd2;
\tld.global.f32 %f0, [%rd2];
\tst.shared.f32 [tile], %f0;
\tmov.u32 %r2, tile;
\tld.shared.f32 %f0, [%r2+4];
\tret;
}
"
        );
    }

    #[test]
    fn dynamic_shared_memory_is_declared_at_module_scope_before_its_entry() {
        let mut m = Module::new(Target::Sm80);
        m.kernel("ring", |k| {
            let x = k.param_ptr("x");
            let dyn_s = k.shared_dynamic(16, 64 * 1024);
            assert_eq!(dyn_s.bytes(), 64 * 1024);
            let base = k.shared_base(&dyn_s);
            let v = k.ld(Load::SHARED, k.reg::<F32>(), base.at(60_000));
            k.st(Store::GLOBAL, x.at(0), v);
        })
        .unwrap();
        let ptx = m.to_ptx();
        let decl = ptx.find(".extern .shared .align 16 .b8 ring_dyn[];\n.visible .entry ring(");
        assert!(decl.is_some(), "{ptx}");
        assert!(ptx.contains("mov.u32 %r0, ring_dyn;"), "{ptx}");
        // A second dynamic array in one kernel is a duplicate name.
        let r = m.kernel("twice", |k| {
            k.shared_dynamic(16, 16);
            k.shared_dynamic(16, 16);
        });
        assert!(
            matches!(r, Err(PtxError::Duplicate { .. })),
            "{:?}",
            r.err()
        );
    }

    #[test]
    fn generators_can_reject_a_configuration() {
        let mut m = Module::new(Target::Sm80);
        let r = m.kernel("tiled", |k| k.reject("tile 48 does not divide 4096"));
        assert_eq!(
            r.err().map(|e| e.to_string()),
            Some("kernel `tiled`: tile 48 does not divide 4096".to_string())
        );
    }

    #[test]
    fn names_are_checked() {
        let mut m = Module::new(Target::Sm80);
        assert!(matches!(
            m.kernel("9lives", |_| {}),
            Err(PtxError::BadName { .. })
        ));
        let r = m.kernel("k", |k| {
            k.param_u32("n");
            k.param_u32("n");
        });
        assert!(matches!(r, Err(PtxError::Duplicate { .. })), "{r:?}");
        let r = m.kernel("k", |k| {
            k.param_u32("n");
            k.shared::<U32>("bad name", 4, 4);
        });
        assert!(matches!(r, Err(PtxError::BadName { .. })), "{r:?}");
    }

    #[test]
    fn raw_and_comments_pass_through_under_guards() {
        let mut m = Module::new(Target::Sm90);
        m.kernel("t", |k| {
            let (d, a) = (k.reg::<F32>(), k.reg::<F32>());
            k.comment("tanh has no method yet");
            let p = k.reg::<crate::types::Pred>();
            k.guarded(p, |k| k.raw(format!("tanh.approx.f32 {d}, {a}")));
        })
        .unwrap();
        let ptx = m.to_ptx();
        assert!(ptx.contains("\t// tanh has no method yet\n"), "{ptx}");
        assert!(ptx.contains("\t@%p0 tanh.approx.f32 %f0, %f1;\n"), "{ptx}");
    }
}
