//! Hostile counts and lengths never cause an allocation larger than the file.
//!
//! A counting global allocator records, per thread and only while armed, the largest single
//! allocation and the total bytes allocated during a parse.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{Spec, W, model_bytes};
use tokenmill_gguf::{GgufError, GgufFile};

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let armed = ARMED.try_with(Cell::get).unwrap_or(false);
    if armed {
        let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
        let _ = TOTAL.try_with(|t| t.set(t.get() + size));
    }
}

// SAFETY: forwards every call to `System` unchanged; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Parses `bytes`, returning the result with the largest single allocation and the total
/// allocated during the parse (the input buffer itself is allocated before arming).
fn parse_counting(bytes: Vec<u8>) -> (Result<GgufFile, GgufError>, usize, usize) {
    PEAK.with(|p| p.set(0));
    TOTAL.with(|t| t.set(0));
    ARMED.with(|a| a.set(true));
    let result = GgufFile::from_bytes(bytes);
    ARMED.with(|a| a.set(false));
    (result, PEAK.with(Cell::get), TOTAL.with(Cell::get))
}

/// Bytes of garbage after the hostile field: enough that "fits in the file" count checks pass
/// for counts sized to it, but useless as content (every length reads as ~2^64, every type id
/// as unknown, every bool as invalid).
const FILLER: usize = 64 * 1024;

/// A header claiming `n_tensors` and `n_kv`, then `body`, then filler.
fn file(n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut w = W::default();
    w.raw(b"GGUF").u32(3).u64(n_tensors).u64(n_kv).raw(body);
    w.0.resize(w.0.len() + FILLER, 0xff);
    w.0
}

/// One kv whose value is an array of `elem` claiming `count` elements.
fn array_kv(elem: u32, count: u64) -> Vec<u8> {
    let mut w = W::default();
    w.str(b"a").u32(9).u32(elem).u64(count);
    w.0
}

#[test]
fn hostile_counts_allocate_at_most_the_file_size() {
    let left = FILLER as u64; // bytes left after the hostile count, roughly
    let mut inputs: Vec<(String, Vec<u8>)> = vec![
        ("kv count u64::MAX".into(), file(0, u64::MAX, &[])),
        ("kv count fits".into(), file(0, left / 13, &[])),
        ("tensor count u64::MAX".into(), file(u64::MAX, 0, &[])),
        ("tensor count fits".into(), file(left / 32, 0, &[])),
    ];
    // Every element type, claiming u64::MAX elements and claiming as many as could fit.
    let min_size = [1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8];
    for (elem, size) in min_size.into_iter().enumerate() {
        for count in [u64::MAX, 1 << 40, left / size] {
            inputs.push((
                format!("array of type {elem} x {count}"),
                file(0, 1, &array_kv(elem as u32, count)),
            ));
        }
    }
    // Nested: an array of arrays whose first inner array claims a huge count of strings.
    let mut nested = array_kv(9, 1000);
    nested.extend(W::default().u32(8).u64(left / 8).0.iter());
    inputs.push(("nested array of strings".into(), file(0, 1, &nested)));
    let mut key = W::default();
    key.u64(u64::MAX);
    inputs.push(("key length u64::MAX".into(), file(0, 1, &key.0)));
    let mut key = W::default();
    key.u64(left);
    inputs.push(("key length = bytes left".into(), file(0, 1, &key.0)));
    let mut value = W::default();
    value.str(b"s").u32(8).u64(left - 8);
    inputs.push(("string value length fits".into(), file(0, 1, &value.0)));
    // Tensor infos with a huge n_dims.
    let mut t = W::default();
    t.str(b"t").u32(u32::MAX);
    inputs.push(("n_dims u32::MAX".into(), file(1, 0, &t.0)));

    let mut report = Vec::new();
    for (name, bytes) in inputs {
        let len = bytes.len();
        // (A byte array sized to the filler is a valid file; everything else is rejected.)
        let (_result, peak, total) = parse_counting(bytes);
        if peak > len || total > 4 * len {
            report.push(format!(
                "{name}: peak {peak}, total {total} for a {len}-byte file"
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

#[test]
fn the_counting_allocator_sees_parses() {
    let (result, peak, total) = parse_counting(Spec::small().build().bytes);
    assert!(result.is_ok());
    assert!(peak > 0 && total >= peak);

    // The real model: no single allocation as big as the file (tensor data is never copied).
    let real = model_bytes().to_vec();
    let len = real.len();
    let (result, peak, _) = parse_counting(real);
    assert!(result.is_ok());
    assert!(
        peak < len / 10,
        "peak allocation {peak} for a {len}-byte file"
    );
}
