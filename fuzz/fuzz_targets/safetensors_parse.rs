//! Fuzz target: `SafetensorsFile::from_bytes` on arbitrary bytes returns `Ok` or `Err`, never
//! panics; a file it accepts satisfies the invariants `file.rs` promises (every tensor's bytes
//! are `n_elements × dtype size`, the tensors tile the data section exactly, lookups by name
//! find each one), and re-serialising its tensors with `tokenmill_safetensors::serialize`
//! gives a file that parses to the same tensors.
//!
//! Input: the first byte picks the framing. Odd: the rest is the whole file. Even: the next two
//! bytes (LE) are the header length `h`, then `h` bytes of header JSON and the data section;
//! the target writes the 8-byte length prefix itself, so mutations of the JSON keep a
//! consistent prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmill_fuzz::take_u16;
use tokenmill_safetensors::{SafetensorsFile, serialize};

fn file_bytes(data: &[u8]) -> Vec<u8> {
    let Some((&mode, rest)) = data.split_first() else {
        return Vec::new();
    };
    if mode & 1 == 1 {
        return rest.to_vec();
    }
    let (h, rest) = take_u16(rest);
    let h = (h as usize).min(rest.len());
    let mut out = (h as u64).to_le_bytes().to_vec();
    out.extend_from_slice(rest);
    out
}

fuzz_target!(|data: &[u8]| {
    let bytes = file_bytes(data);
    let Ok(file) = SafetensorsFile::from_bytes(bytes) else {
        return;
    };
    let n = file.bytes().len();
    let header_len = u64::from_le_bytes(file.bytes()[..8].try_into().unwrap()) as usize;
    let data_start = 8 + header_len;
    // The tensors tile the data section: sorted by start, each begins where the last ended.
    let mut ranges: Vec<_> = file.tensors().iter().map(|t| t.range.clone()).collect();
    ranges.sort_by_key(|r| (r.start, r.end));
    let mut at = data_start;
    for r in &ranges {
        assert_eq!(r.start, at, "gap or overlap in the data section");
        at = r.end;
    }
    assert_eq!(at, n, "trailing bytes after the last tensor");
    for t in file.tensors() {
        let size = t.n_elements() as usize * t.dtype.size();
        assert_eq!(file.tensor_data(t).len(), size, "{t:?}");
        assert_eq!(file.tensor(&t.name), Some(t));
        let _ = format!("{t:?}");
    }
    for (k, v) in file.metadata() {
        let _ = (k.len(), v.len());
    }
    let _ = format!("{file:?}");
    // Round trip through the writer (in file order, so offsets come out the same).
    let mut by_offset: Vec<_> = file.tensors().iter().collect();
    by_offset.sort_by_key(|t| t.range.start);
    let specs: Vec<_> = by_offset
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.dtype,
                t.shape.as_slice(),
                file.tensor_data(t),
            )
        })
        .collect();
    let again =
        SafetensorsFile::from_bytes(serialize(&specs)).expect("a re-serialised valid file parses");
    assert_eq!(again.tensors().len(), file.tensors().len());
    for (a, b) in again.tensors().iter().zip(file.tensors()) {
        assert_eq!((&a.name, a.dtype, &a.shape), (&b.name, b.dtype, &b.shape));
        assert_eq!(again.tensor_data(a), file.tensor_data(b));
    }
});
