//! Scratch memory of a forward pass: one device buffer handed out by bumping an offset and
//! reset at the start of every step, so a step allocates nothing from the driver and the
//! same batch shape gets the same addresses every time (a captured graph replays on them).
//!
//! The model asks for its activations as it goes; the arena does not know the list in
//! advance. When a step needs more than the buffer holds, it spills into extra chunks for
//! that step, and the next reset replaces everything with one buffer of the peak size
//! (a new generation: graphs captured on the old addresses are dropped).

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
}
