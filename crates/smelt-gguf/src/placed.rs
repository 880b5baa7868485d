//! A GGUF file written at known places: the header and every tensor's offset follow from
//! the specs, so a pipelined quantizer can write each chunk where it belongs, from any
//! thread and in any order, instead of funnelling the whole output through one stream.
//!
//! The file is created at its final size before the first byte of data: the same bytes
//! [`crate::GgufWriter`] writes, with no write extending the file. [`finish`] checks that
//! every tensor got exactly its bytes.
//!
//! On Linux its blocks are allocated up front (`fallocate`): a disk too small fails before
//! any work (a 14B run once failed half-way with ENOSPC), and on ext4 page-cache writes into
//! allocated (unwritten) blocks ran 1.5-2x faster than into the holes of a file sized by
//! `ftruncate` (1 GB of 26 MB `pwrite`s, 0.44-0.47 s against 0.87-1.12 s, this project's
//! 2-core VM); on the H100 host's disk it is even (8B q6_k, 6.06 GB written: 2.65 s against
//! 2.68 s, the writer busy 1.93 s against 2.02 s; bench/gpu/load.sh, 2026-11-27).
//! `SMELT_WRITE_ALLOC=sparse` sizes it with `ftruncate` instead (holes; where `fallocate` is
//! not supported that is what happens anyway).
//!
//! On Linux a thread of its own puts the file's pages in the page cache from the moment the
//! file is created (while a GPU opens, the writer has nothing to write yet): window by
//! window, a shared mapping's pages are faulted in for writing (`MADV_POPULATE_WRITE`),
//! which never changes the file's bytes, and takes no inode lock, so it runs beside the
//! writer's `pwrite`s. A `pwrite` into a page already cached is a copy and nothing more: on
//! this project's VM, 5-6 GB/s against 1.5-4.5 GB/s into a new page. Measured with
//! `bench/gpu/load.sh` (8B q6_k, 6.06 GB written, rounds 1 / 2): 1.83 / 2.13 s against 4.15
//! / 2.06 s without it on an H100 host (2026-11-27), 2.27 / 2.36 s against 3.24 / 2.66 s on
//! a 2x H200 host (2026-11-28); on by default since, `SMELT_WRITE_PREFAULT=0` turns it off.
//!
//! Two ways to put the bytes in: positioned writes (`pwrite`, the default), which a
//! filesystem runs one at a time per file (buffered writes take the inode's lock), or copies
//! into a shared mapping of the file ([`GgufPlacedWriter::create_mapped`]), whose page
//! faults run in parallel; a measurement switch until a GPU machine's run says which is
//! faster there (a full disk is a SIGBUS on a mapping, where `pwrite` returns an error).
//!
//! [`finish`]: GgufPlacedWriter::finish

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::tensor::TensorSpec;
use crate::write::{header, Layout};

/// See the module docs. `Sync`: [`GgufPlacedWriter::write_at`] takes `&self`.
#[derive(Debug)]
pub struct GgufPlacedWriter {
    file: File,
    map: Option<Mapped>,
    path: PathBuf,
    names: Vec<String>,
    /// Where tensor data starts in the file (the header padded to the alignment).
    data_start: u64,
    offsets: Vec<u64>,
    sizes: Vec<u64>,
    /// Bytes written into each tensor so far.
    written: Vec<AtomicU64>,
    len: u64,
    prefault: Option<Prefault>,
}

/// The page-cache prefault thread (see the module docs); stopped and joined by
/// [`GgufPlacedWriter::finish`] or on drop.
struct Prefault {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Prefault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefault").finish_non_exhaustive()
    }
}

impl Prefault {
    /// Starts faulting in `file`'s pages from `from` to `len`, 64 MB windows at a time.
    #[cfg(target_os = "linux")]
    fn start(file: &File, from: u64, len: u64) -> Option<Self> {
        use std::sync::atomic::AtomicBool;
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        const WINDOW: u64 = 64 << 20;
        let file = file.try_clone().ok()?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prefault".into())
            .spawn(move || {
                let mut at = from - from % WINDOW;
                while at < len && !halt.load(Ordering::Relaxed) {
                    let n = WINDOW.min(len - at);
                    let Ok(map) = memmap2::MmapOptions::new()
                        .offset(at)
                        .len(n as usize)
                        .map_raw(&file)
                    else {
                        return;
                    };
                    // SAFETY: the advice covers exactly this live mapping; populating pages
                    // for writing reads and keeps their bytes, it never writes them.
                    #[allow(unsafe_code)]
                    let r = unsafe {
                        libc::madvise(map.as_mut_ptr().cast(), n as usize, MADV_POPULATE_WRITE)
                    };
                    if r != 0 {
                        return; // a kernel before 5.14, or no room: the writer does it all
                    }
                    at += n;
                }
            })
            .ok()?;
        Some(Self {
            stop,
            thread: Some(thread),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn start(_: &File, _: u64, _: u64) -> Option<Self> {
        None
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl GgufPlacedWriter {
    /// Creates (or truncates) `path` at its final size and writes the header.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        tensors: Vec<TensorSpec>,
    ) -> Result<Self, GgufError> {
        Self::create_with(path.as_ref(), metadata, tensors, false)
    }

    /// [`Self::create`], with data copied into a shared mapping of the file instead of
    /// written with `pwrite` (see the module docs).
    pub fn create_mapped(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        tensors: Vec<TensorSpec>,
    ) -> Result<Self, GgufError> {
        Self::create_with(path.as_ref(), metadata, tensors, true)
    }

    fn create_with(
        path: &Path,
        metadata: &Metadata,
        tensors: Vec<TensorSpec>,
        mapped: bool,
    ) -> Result<Self, GgufError> {
        let prefault = std::env::var("SMELT_WRITE_PREFAULT").as_deref() != Ok("0");
        Self::create_opts(path, metadata, tensors, mapped, prefault)
    }

    fn create_opts(
        path: &Path,
        metadata: &Metadata,
        tensors: Vec<TensorSpec>,
        mapped: bool,
        prefault: bool,
    ) -> Result<Self, GgufError> {
        // Validate before touching the file, so a bad spec leaves no half-written output.
        let layout = Layout::new(metadata, &tensors, Some(path))?;
        let head = header(metadata, &tensors, &layout);
        let data_start = (head.len() as u64).next_multiple_of(layout.alignment);
        let len = data_start + layout.data_bytes;
        let io = |what, e| GgufError::io(Some(path), what, e);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io("create", e))?;
        allocate(&file, len).map_err(|e| io("size", e))?;
        file.write_all_at(&head, 0).map_err(|e| io("write", e))?;
        let map = if mapped && len > 0 {
            Some(Mapped::new(&file).map_err(|e| io("map", e))?)
        } else {
            None
        };
        let prefault = if !mapped && len > data_start && prefault {
            Prefault::start(&file, data_start, len)
        } else {
            None
        };
        Ok(Self {
            file,
            map,
            path: path.to_path_buf(),
            names: tensors.into_iter().map(|t| t.name).collect(),
            data_start,
            offsets: layout.offsets,
            written: layout.sizes.iter().map(|_| AtomicU64::new(0)).collect(),
            sizes: layout.sizes,
            len,
            prefault,
        })
    }

    /// The file's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds no data (a header only).
    pub fn is_empty(&self) -> bool {
        self.data_start == self.len
    }

    /// Writes `data` at byte `offset` of tensor `tensor` (its index in the specs). A range
    /// outside the tensor is refused and nothing is written; ranges are not checked against
    /// each other (the caller writes each byte once, which [`Self::finish`] counts).
    pub fn write_at(&self, tensor: usize, offset: u64, data: &[u8]) -> Result<(), GgufError> {
        let (Some(&size), Some(&at)) = (self.sizes.get(tensor), self.offsets.get(tensor)) else {
            return Err(GgufError::invalid(
                Some(&self.path),
                format!("tensor #{tensor}"),
                format!("there are {} tensors", self.sizes.len()),
            ));
        };
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > size) {
            return Err(GgufError::invalid(
                Some(&self.path),
                format!("tensor '{}' (#{tensor})", self.names[tensor]),
                format!("bytes {offset}..+{} are past its {size} bytes", data.len()),
            ));
        }
        let pos = self.data_start + at + offset;
        match &self.map {
            Some(m) => m.copy_in(pos, data).map_err(|why| {
                GgufError::invalid(
                    Some(&self.path),
                    format!("tensor '{}' (#{tensor})", self.names[tensor]),
                    why,
                )
            })?,
            None => self
                .file
                .write_all_at(data, pos)
                .map_err(|e| GgufError::io(Some(&self.path), "write", e))?,
        }
        self.written[tensor].fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Checks that every tensor got exactly its bytes, and closes the file.
    pub fn finish(mut self) -> Result<(), GgufError> {
        drop(self.prefault.take());
        for (i, (w, &size)) in self.written.iter().zip(&self.sizes).enumerate() {
            let got = w.load(Ordering::Relaxed);
            if got != size {
                return Err(GgufError::invalid(
                    Some(&self.path),
                    format!("tensor '{}' (#{i})", self.names[i]),
                    format!("{got} bytes written, expected {size}"),
                ));
            }
        }
        Ok(())
    }
}

/// Gives `file` (empty) its `len` bytes: allocated blocks where the filesystem can
/// (`fallocate`; see the module docs), else a hole (`ftruncate`). A disk without room is an
/// error here, before any data.
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    if len > 0 && std::env::var("SMELT_WRITE_ALLOC").as_deref() != Ok("sparse") {
        use std::os::fd::AsRawFd;
        let n = libc::off_t::try_from(len).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: a plain system call on an open descriptor this function borrows.
        #[allow(unsafe_code)]
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, n) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        // Not supported by this filesystem (or descriptor): a hole, as before.
        if !matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
        ) {
            return Err(e);
        }
    }
    file.set_len(len)
}

/// A shared writable mapping of the whole file, written by copies into ranges that are
/// claimed first, so no two copies ever touch the same bytes.
struct Mapped {
    map: memmap2::MmapRaw,
    /// Claimed ranges, start -> end (each byte is written once).
    claimed: Mutex<BTreeMap<u64, u64>>,
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("len", &self.map.len())
            .finish_non_exhaustive()
    }
}

impl Mapped {
    fn new(file: &File) -> std::io::Result<Self> {
        Ok(Self {
            map: memmap2::MmapOptions::new().map_raw(file)?,
            claimed: Mutex::new(BTreeMap::new()),
        })
    }

    /// Copies `data` to byte `pos` of the file; refuses a range another copy claimed.
    fn copy_in(&self, pos: u64, data: &[u8]) -> Result<(), String> {
        if data.is_empty() {
            return Ok(());
        }
        let end = pos + data.len() as u64;
        if end > self.map.len() as u64 {
            return Err(format!("bytes {pos}..{end} are past the file's end"));
        }
        {
            let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
            let before = claimed.range(..end).next_back();
            if before.is_some_and(|(_, &e)| e > pos) {
                return Err(format!("bytes {pos}..{end} were already written"));
            }
            claimed.insert(pos, end);
        }
        // SAFETY: `pos..end` lies inside the mapping (checked above) and was claimed by
        // this call alone (no claimed range overlaps it, and claims are never released),
        // so no other copy or reference touches these bytes; the mapping lives as long as
        // `self`.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.map.as_mut_ptr().add(pos as usize),
                data.len(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgmlType, GgufWriter, Value};

    fn specs() -> Vec<TensorSpec> {
        vec![
            TensorSpec {
                name: "a".into(),
                ty: GgmlType::F32,
                shape: vec![4, 3],
            },
            TensorSpec {
                name: "b".into(),
                ty: GgmlType::F16,
                shape: vec![5],
            },
            TensorSpec {
                name: "c".into(),
                ty: GgmlType::F32,
                shape: vec![7],
            },
        ]
    }

    /// Chunks written out of order, from several threads, make the file the stream writer
    /// makes (header, data and zero padding alike); the stream writer's own file is created
    /// at its size too, and is still the same bytes.
    #[test]
    fn placed_chunks_in_any_order_make_the_stream_writers_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut md = Metadata::new();
        md.insert("general.architecture", Value::from("llama"));
        md.insert("general.alignment", Value::U32(64));
        let a: Vec<u8> = (0..48).collect();
        let b: Vec<u8> = (100..110).collect();
        let c: Vec<u8> = (200..228).collect();
        let stream = dir.path().join("stream.gguf");
        let mut w = GgufWriter::create(&stream, &md, specs()).expect("writer");
        w.write_tensor("a", &a).expect("a");
        w.write_tensor("b", &b).expect("b");
        w.write_tensor("c", &c).expect("c");
        w.finish().expect("finish");
        let want = std::fs::read(&stream).expect("reads");

        // pwrite, pwrite with the pages faulted in beside it, a shared mapping.
        for (mapped, prefault) in [(false, false), (false, true), (true, false)] {
            let placed = dir.path().join(format!("placed-{mapped}-{prefault}.gguf"));
            let p = GgufPlacedWriter::create_opts(&placed, &md, specs(), mapped, prefault)
                .expect("placed");
            assert_eq!(p.prefault.is_some(), prefault && cfg!(target_os = "linux"));
            assert_eq!(p.len(), want.len() as u64);
            std::thread::scope(|s| {
                s.spawn(|| p.write_at(2, 10, &c[10..]).expect("c1"));
                s.spawn(|| p.write_at(0, 16, &a[16..]).expect("a1"));
                s.spawn(|| p.write_at(1, 0, &b).expect("b"));
            });
            p.write_at(2, 0, &c[..10]).expect("c0");
            p.write_at(0, 0, &a[..16]).expect("a0");
            if mapped {
                let e = p.write_at(0, 8, &a[8..24]).unwrap_err().to_string();
                assert!(e.contains("already written"), "{e}");
            }
            p.finish().expect("finish");
            assert_eq!(
                std::fs::read(&placed).expect("reads"),
                want,
                "mapped: {mapped}"
            );
        }
    }

    /// The file's blocks are allocated at creation (Linux: `fallocate`), so writes land in
    /// allocated blocks, and the unwritten padding still reads as zeros (the test above).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_file_is_allocated_at_its_size() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let specs = vec![TensorSpec {
            name: "big".into(),
            ty: GgmlType::F32,
            shape: vec![1 << 18],
        }];
        let path = dir.path().join("alloc.gguf");
        let p = GgufPlacedWriter::create(&path, &Metadata::new(), specs).expect("placed");
        let m = std::fs::metadata(&path).expect("stat");
        assert_eq!(m.len(), p.len());
        if std::env::var("SMELT_WRITE_ALLOC").as_deref() != Ok("sparse") {
            assert!(
                m.blocks() * 512 >= p.len(),
                "{} bytes allocated of {}",
                m.blocks() * 512,
                p.len()
            );
        }
    }

    #[test]
    fn writes_past_a_tensor_and_missing_bytes_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = GgufPlacedWriter::create(dir.path().join("x.gguf"), &Metadata::new(), specs())
            .expect("placed");
        let e = p.write_at(1, 4, &[0; 7]).unwrap_err().to_string();
        assert!(e.contains("'b'") && e.contains("past its 10 bytes"), "{e}");
        assert!(p.write_at(3, 0, &[0]).is_err(), "no tensor #3");
        p.write_at(0, 0, &[1; 48]).expect("a");
        p.write_at(1, 0, &[2; 10]).expect("b");
        p.write_at(2, 0, &[3; 27]).expect("c short");
        let e = p.finish().unwrap_err().to_string();
        assert!(
            e.contains("'c'") && e.contains("27 bytes written, expected 28"),
            "{e}"
        );
    }
}
