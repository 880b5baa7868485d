//! Scratch memory of a forward pass: one device buffer handed out by bumping an offset and
//! reset at the start of every step, so a step allocates nothing from the driver and the
//! same batch shape gets the same addresses every time (a captured graph replays on them).
//!
//! The model asks for its activations as it goes; the arena does not know the list in
//! advance. When a step needs more than the buffer holds, it spills into extra chunks for
//! that step, and the next reset replaces everything with one buffer of the peak size
//! (a new generation: graphs captured on the old addresses are dropped).
//!
//! A step's scratch ([`StepScratch`]) is three such arenas: one for what lives through the
//! whole step (the residual stream, the model's reused buffers, the output) and two that
//! layers take turns in. When layer `l` begins, the arena layer `l - 2` used is reset: a
//! layer's temporaries (a Qwen3-Next-80B layer's experts at 512 tokens take hundreds of
//! MB) are dead two layers on, while the layer just before may still have its cached
//! matmul input or a deferred launch pointing into its arena. So a step needs the
//! temporaries of two layers, not of all 48 (the 80B ran out of memory at 32 sequences).

use smelt_cuda::CudaError;

/// Alignment of every allocation: 16-byte vector loads need 16; 256 matches the driver's
/// own and keeps rows of different tensors on separate cache lines.
pub const ALIGN: usize = 256;

/// Smallest spill chunk, so a step that outgrows the buffer does not spill per tensor.
pub const MIN_CHUNK: usize = 16 << 20;

/// A chunk: the owning buffer, its device address, its size in bytes.
struct Chunk<B> {
    _buf: B,
    base: u64,
    size: usize,
}

/// Bump allocator over device chunks of type `B` (a `CudaSlice<u8>`, or a stand-in in tests).
pub struct Arena<B> {
    chunks: Vec<Chunk<B>>,
    cur: usize,
    off: usize,
    used: usize,
    peak: usize,
    generation: u64,
}

impl<B> Default for Arena<B> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            cur: 0,
            off: 0,
            used: 0,
            peak: 0,
            generation: 0,
        }
    }
}

/// A source of device chunks: `bytes` -> (owner, address).
pub type NewChunk<'a, B> = dyn FnMut(usize) -> Result<(B, u64), CudaError> + 'a;

fn round_up(n: usize) -> usize {
    n.max(1).div_ceil(ALIGN) * ALIGN
}

impl<B> Arena<B> {
    /// Starts a step that will need about `planned` bytes: when the last step spilled or
    /// the plan is larger than the buffer, replaces the chunks with one buffer big enough
    /// for both (and bumps the generation).
    pub fn reset(
        &mut self,
        planned: usize,
        new_chunk: &mut NewChunk<'_, B>,
    ) -> Result<(), CudaError> {
        let want = round_up(planned).max(self.peak);
        let first = self.chunks.first().map_or(0, |c| c.size);
        if self.chunks.len() > 1 || first < want {
            self.chunks.clear();
            let (buf, base) = new_chunk(want)?;
            self.chunks.push(Chunk {
                _buf: buf,
                base,
                size: want,
            });
            self.generation += 1;
        }
        self.cur = 0;
        self.off = 0;
        self.used = 0;
        Ok(())
    }

    /// Hands out the same memory again within a step: back to the first chunk's start, the
    /// chunks kept (consolidating here would free memory that kernels already queued may
    /// still read; the next [`Arena::reset`] does it). The peak stays what it was.
    pub fn rewind(&mut self) {
        self.cur = 0;
        self.off = 0;
        self.used = 0;
    }

    /// `bytes` of scratch, aligned, valid until the next [`Arena::reset`].
    pub fn alloc(
        &mut self,
        bytes: usize,
        new_chunk: &mut NewChunk<'_, B>,
    ) -> Result<u64, CudaError> {
        let bytes = round_up(bytes);
        loop {
            if let Some(c) = self.chunks.get(self.cur) {
                if self.off + bytes <= c.size {
                    let p = c.base + self.off as u64;
                    self.off += bytes;
                    self.used += bytes;
                    self.peak = self.peak.max(self.used);
                    return Ok(p);
                }
                if self.cur + 1 < self.chunks.len() {
                    // The rest of this chunk is wasted this step; count it so the
                    // consolidated buffer fits the same sequence without spilling.
                    self.used += c.size - self.off;
                    self.cur += 1;
                    self.off = 0;
                    continue;
                }
                self.used += c.size - self.off;
            }
            let size = bytes.max(MIN_CHUNK);
            let (buf, base) = new_chunk(size)?;
            self.chunks.push(Chunk {
                _buf: buf,
                base,
                size,
            });
            self.cur = self.chunks.len() - 1;
            self.off = 0;
        }
    }

    /// Changes whenever the addresses handed out for the same sequence of requests change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `ptr` lies in one of this arena's chunks.
    pub fn holds(&self, ptr: u64) -> bool {
        self.chunks
            .iter()
            .any(|c| c.base <= ptr && ptr < c.base + c.size as u64)
    }

    #[cfg(test)]
    /// Whether this step has spilled out of the main buffer (its addresses are not stable).
    pub fn spilled(&self) -> bool {
        self.chunks.len() > 1
    }

    #[cfg(test)]
    /// Bytes held in all chunks.
    pub fn capacity(&self) -> usize {
        self.chunks.iter().map(|c| c.size).sum()
    }
}

/// Where a step's scratch comes from: the step's own arena, or one of the two that layers
/// take turns in (see the module doc).
pub struct StepScratch<B> {
    step: Arena<B>,
    layers: [Arena<B>; 2],
    /// The arena allocations come from: `None` for the step's, else a layer one.
    active: Option<usize>,
    /// Layers begun this step.
    layer: usize,
    /// Whether layers reuse memory at all (`false`: every allocation from the step arena).
    enabled: bool,
}

impl<B> StepScratch<B> {
    pub fn new(enabled: bool) -> Self {
        Self {
            step: Arena::default(),
            layers: [Arena::default(), Arena::default()],
            active: None,
            layer: 0,
            enabled,
        }
    }

    /// Starts a step: every arena empty, allocations from the step's.
    pub fn reset(&mut self, new_chunk: &mut NewChunk<'_, B>) -> Result<(), CudaError> {
        self.step.reset(0, new_chunk)?;
        for a in &mut self.layers {
            a.reset(0, new_chunk)?;
        }
        self.active = None;
        self.layer = 0;
        Ok(())
    }

    /// `bytes` from the active arena, valid until it is reset.
    pub fn alloc(
        &mut self,
        bytes: usize,
        new_chunk: &mut NewChunk<'_, B>,
    ) -> Result<u64, CudaError> {
        match self.active {
            Some(i) => self.layers[i].alloc(bytes, new_chunk),
            None => self.step.alloc(bytes, new_chunk),
        }
    }

    /// The layer arena the next layer takes (the one the layer before last used), when
    /// layers reuse memory; the caller checks what still points into it
    /// ([`StepScratch::holds`]) before [`StepScratch::begin_layer`].
    pub fn next_layer_arena(&self) -> Option<usize> {
        self.enabled.then_some(self.layer % 2)
    }

    /// Whether `ptr` lies in layer arena `i`.
    pub fn holds(&self, i: usize, ptr: u64) -> bool {
        self.layers[i].holds(ptr)
    }

    /// A layer begins: its temporaries come from layer arena `layer % 2`, which is reset
    /// first when `reuse` (the caller found nothing live in it); else it goes on where it
    /// was. Does nothing when layers do not reuse memory.
    pub fn begin_layer(&mut self, reuse: bool) {
        let Some(i) = self.next_layer_arena() else {
            return;
        };
        if reuse {
            self.layers[i].rewind();
        }
        self.active = Some(i);
        self.layer += 1;
    }

    /// Changes whenever any arena's addresses for the same requests change.
    pub fn generation(&self) -> u64 {
        self.step.generation() + self.layers[0].generation() + self.layers[1].generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fake device memory: hands out disjoint address ranges and counts the calls.
    struct Fake {
        next: u64,
        calls: usize,
    }

    impl Fake {
        fn new() -> Self {
            Self {
                next: 1 << 32,
                calls: 0,
            }
        }
        fn chunk(&mut self, bytes: usize) -> Result<((), u64), CudaError> {
            self.calls += 1;
            let p = self.next;
            self.next += bytes as u64 + (1 << 20);
            Ok(((), p))
        }
    }

    fn step(a: &mut Arena<()>, f: &mut Fake, planned: usize, sizes: &[usize]) -> Vec<u64> {
        a.reset(planned, &mut |b| f.chunk(b)).unwrap();
        sizes
            .iter()
            .map(|&s| a.alloc(s, &mut |b| f.chunk(b)).unwrap())
            .collect()
    }

    #[test]
    fn same_requests_get_same_addresses_and_no_new_memory() {
        let (mut a, mut f) = (Arena::default(), Fake::new());
        let sizes = [4096 * 4, 100, 14336 * 4, 1, 4096 * 4];
        let first = step(&mut a, &mut f, 1 << 20, &sizes);
        let calls = f.calls;
        let gen = a.generation();
        for _ in 0..5 {
            assert_eq!(step(&mut a, &mut f, 1 << 20, &sizes), first);
        }
        assert_eq!(f.calls, calls, "a steady state allocates nothing");
        assert_eq!(a.generation(), gen);
        for p in &first {
            assert_eq!(p % ALIGN as u64, 0);
        }
        // Disjoint and in order.
        for w in first.windows(2) {
            assert!(w[1] > w[0]);
        }
    }

    #[test]
    fn a_step_that_outgrows_the_buffer_spills_then_consolidates() {
        let (mut a, mut f) = (Arena::default(), Fake::new());
        step(&mut a, &mut f, 1024, &[512]);
        let small = a.generation();
        let big: Vec<usize> = vec![MIN_CHUNK / 2; 5];
        let ptrs = step(&mut a, &mut f, 1024, &big);
        assert!(a.spilled());
        // Every allocation is disjoint from every other.
        let mut sorted = ptrs.clone();
        sorted.sort();
        for w in sorted.windows(2) {
            assert!(w[1] - w[0] >= (MIN_CHUNK / 2) as u64);
        }
        // Next step: one buffer big enough, new generation, then stable.
        let again = step(&mut a, &mut f, 1024, &big);
        assert!(!a.spilled());
        assert!(a.generation() > small);
        let calls = f.calls;
        assert_eq!(step(&mut a, &mut f, 1024, &big), again);
        assert_eq!(f.calls, calls);
        assert!(a.capacity() >= 5 * MIN_CHUNK / 2);
    }

    #[test]
    fn a_larger_plan_grows_the_buffer_up_front() {
        let (mut a, mut f) = (Arena::default(), Fake::new());
        step(&mut a, &mut f, 1000, &[10]);
        step(&mut a, &mut f, 50 << 20, &[40 << 20, 10 << 20]);
        assert!(!a.spilled());
        assert!(a.capacity() >= 50 << 20);
    }

    /// One step of a model: `before` from the step arena, then per layer `per_layer`
    /// (layer arenas, reused when `reuse(layer)`), returning every layer's addresses.
    fn layered_step(
        s: &mut StepScratch<()>,
        f: &mut Fake,
        before: usize,
        layers: usize,
        per_layer: &[usize],
        reuse: impl Fn(usize) -> bool,
    ) -> (u64, Vec<Vec<u64>>) {
        s.reset(&mut |b| f.chunk(b)).unwrap();
        let first = s.alloc(before, &mut |b| f.chunk(b)).unwrap();
        let mut all = Vec::new();
        for l in 0..layers {
            s.begin_layer(reuse(l));
            let ptrs = per_layer
                .iter()
                .map(|&n| s.alloc(n, &mut |b| f.chunk(b)).unwrap())
                .collect();
            all.push(ptrs);
        }
        (first, all)
    }

    #[test]
    fn layers_two_apart_share_memory_and_neighbours_do_not() {
        let (mut s, mut f) = (StepScratch::new(true), Fake::new());
        let sizes = [3 << 20, 100, 5 << 20];
        let (first, layers) = layered_step(&mut s, &mut f, 1 << 20, 6, &sizes, |_| true);
        for l in 2..6 {
            assert_eq!(
                layers[l],
                layers[l - 2],
                "layer {l} reuses layer {}'s",
                l - 2
            );
        }
        // Neighbouring layers and the step's own allocation are disjoint.
        let mut spans: Vec<(u64, u64)> = layers[..2]
            .iter()
            .flat_map(|ps| ps.iter().zip(&sizes).map(|(&p, &n)| (p, p + n as u64)))
            .collect();
        spans.push((first, first + (1 << 20)));
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "{w:?} overlap");
        }
        // The next steps consolidate the spilled chunks, then allocate nothing and hand out
        // the same addresses: a captured graph stays valid.
        let again = layered_step(&mut s, &mut f, 1 << 20, 6, &sizes, |_| true);
        let (calls, gen) = (f.calls, s.generation());
        assert_eq!(
            layered_step(&mut s, &mut f, 1 << 20, 6, &sizes, |_| true),
            again
        );
        assert_eq!((f.calls, s.generation()), (calls, gen));
        // Two layers' worth of memory, not six.
        let held = s.layers.iter().map(Arena::capacity).sum::<usize>();
        assert!(held < 4 * (8 << 20), "{held} bytes held");
    }

    #[test]
    fn a_layer_arena_in_use_is_not_reused() {
        let (mut s, mut f) = (StepScratch::new(true), Fake::new());
        // Layer 2 finds something live in layer 0's arena: it goes on after it.
        let (_, layers) = layered_step(&mut s, &mut f, 256, 4, &[1 << 20], |l| l != 2);
        assert!(layers[2][0] > layers[0][0]);
        // Layer 3 reuses layer 1's as usual.
        assert_eq!(layers[3], layers[1]);
    }

    #[test]
    fn off_every_allocation_is_new() {
        let (mut s, mut f) = (StepScratch::new(false), Fake::new());
        let (first, layers) = layered_step(&mut s, &mut f, 256, 4, &[1 << 20, 512], |_| true);
        let mut all: Vec<u64> = layers.concat();
        all.push(first);
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_eq!(s.next_layer_arena(), None);
    }
}
