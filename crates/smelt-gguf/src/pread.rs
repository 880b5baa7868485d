//! Parallel positional reads of a model file: the loaders (`smelt-load`'s pipeline and the
//! CUDA backend's in-situ quantization) both read large tensor ranges this way, because the
//! page cache copies at several GB/s per core and a disk queue likes several large requests
//! in flight.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Reads `buf.len()` bytes of `file` at `offset` with up to `threads` parallel reads of at
/// least `piece` bytes each.
pub fn pread_parallel(
    file: &File,
    offset: u64,
    buf: &mut [u8],
    threads: usize,
    piece: usize,
) -> std::io::Result<()> {
    let n = buf.len().div_ceil(piece.max(1)).clamp(1, threads.max(1));
    if n == 1 {
        return file.read_exact_at(buf, offset);
    }
    let per = buf.len().div_ceil(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(i, part)| {
                let at = offset + (i * per) as u64;
                s.spawn(move || file.read_exact_at(part, at))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a reader panicked")))
        })
    })
}
