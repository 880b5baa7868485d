//! Arbitrary bytes into the GGUF reader. A parse may fail, but never panic, hang or allocate
//! beyond the input's size; a successful parse must give in-range tensor views and must
//! survive a write -> read round trip unchanged.

#![no_main]

#[path = "common/alloc_limit.rs"]
mod alloc_limit;

use libfuzzer_sys::fuzz_target;
use smelt_gguf::{Gguf, GgufWriter, TensorSpec};

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };

    let mut checksum = 0u64;
    for t in g.tensors() {
        let view = g.tensor_data(t);
        assert_eq!(view.len() as u64, t.n_bytes(), "{}", t.name);
        assert_eq!(t.offset % g.alignment(), 0);
        assert!(std::ptr::eq(g.tensor(&t.name).unwrap(), t));
        let _ = (t.n_elements(), t.row_len(), t.n_rows());
        checksum = view.iter().fold(checksum, |a, &b| a.wrapping_add(b.into()));
    }
    for (key, value) in g.metadata().iter() {
        assert!(std::ptr::eq(g.metadata().get(key).unwrap(), value));
        let shown = value.to_string();
        checksum = checksum.wrapping_add(shown.len() as u64);
        let _ = value.type_name();
    }
    std::hint::black_box(checksum);

    // What we read, we can write, and it reads back the same. The writer pads the header to
    // the file's alignment (a power of two up to 2^31, which the reader accepts: a file with
    // no tensors may end before its data section would start), so the round trip is skipped
    // where that padding alone would exceed the fuzzer's memory limit.
    if g.alignment() > 1 << 20 {
        return;
    }
    let specs = g
        .tensors()
        .iter()
        .map(|t| TensorSpec {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
        })
        .collect();
    let mut w = GgufWriter::new(Vec::new(), g.metadata(), specs)
        .expect("writer accepts what the reader accepted");
    for t in g.tensors() {
        w.write_tensor(&t.name, g.tensor_data(t))
            .expect("write_tensor");
    }
    let bytes = w.finish().expect("finish");
    let again = Gguf::from_bytes(bytes).expect("our own output parses");
    assert_eq!(again.version(), 3);
    assert_eq!(again.alignment(), g.alignment());
    // Compared as Debug text, not with PartialEq: NaN values are equal only in how they print.
    let entries = |g: &Gguf| -> Vec<String> {
        g.metadata()
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect()
    };
    assert_eq!(entries(&again), entries(&g));
    assert_eq!(again.tensors().len(), g.tensors().len());
    for (a, b) in again.tensors().iter().zip(g.tensors()) {
        assert_eq!((&a.name, a.ty, &a.shape), (&b.name, b.ty, &b.shape));
        assert_eq!(again.tensor_data(a), g.tensor_data(b));
    }
});
