//! A global allocator that refuses any single allocation over [`LIMIT`] bytes, so a fuzz
//! target built without a sanitizer still fails where `-malloc_limit_mb` would have stopped
//! it: libFuzzer checks that limit through the sanitizer's malloc hooks, which a
//! `-s none` build (the long run's, bench/fuzz/build.sh) does not have. Inputs are a few KB,
//! so an allocation this large means a length was trusted before it was checked against the
//! bytes present. A refused allocation makes Rust abort ("memory allocation of N bytes
//! failed"), which libFuzzer reports as a crash and keeps the input.

use std::alloc::{GlobalAlloc, Layout, System};

/// The same 256 MB as the runs' `-malloc_limit_mb=256`.
pub const LIMIT: usize = 256 << 20;

pub struct Limited;

// SAFETY: every call is forwarded to the system allocator unchanged, except that oversized
// requests return null, which the GlobalAlloc contract allows.
unsafe impl GlobalAlloc for Limited {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            return std::ptr::null_mut();
        }
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            return std::ptr::null_mut();
        }
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > LIMIT {
            return std::ptr::null_mut();
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Limited = Limited;
