//! [`SafetensorsFile`]: one `.safetensors` file, memory-mapped and validated whole at open.
//!
//! Layout ([spec](https://github.com/huggingface/safetensors#format)): a little-endian u64 `N`,
//! `N` bytes of UTF-8 JSON (an object: tensor name → `{dtype, shape, data_offsets}`, plus an
//! optional `__metadata__` string map), then the data section. Offsets are relative to the
//! data section.
//!
//! # Invariants (checked in this order, each with its own error)
//!
//! - `8 <= file length`; `N <= MAX_HEADER_LEN`; `8 + N <= file length`.
//! - The header is UTF-8 and a JSON object of exactly that shape (unknown fields in a tensor
//!   entry are rejected); names are unique (duplicates are caught, not silently overwritten).
//! - Every dtype is a known one; rank ≤ [`MAX_RANK`]; `shape × dtype size` is overflow-free.
//! - Every `data_offsets = [begin, end]` has `begin <= end` and `end - begin` equal to that
//!   size.
//! - Sorted by `begin`, the tensors tile the data section exactly: the first starts at 0,
//!   each starts where the previous one ends (no gap, no overlap) and the last ends at the
//!   end of the file (no trailing bytes).
//!
//! Hence, after `open`, [`SafetensorsFile::tensor_data`] is an infallible slice. Tensor data
//! has no alignment guarantee; consumers read it as bytes (little-endian).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;

use memmap2::Mmap;
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};

use crate::{Dtype, SafetensorsError};

/// Largest header accepted (the reference implementation's cap as well).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Most dimensions a tensor may have.
pub const MAX_RANK: usize = 8;

/// One tensor of a validated file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    /// Row-major, outermost first (PyTorch order).
    pub shape: Vec<u64>,
    /// Absolute byte range in the file.
    pub range: Range<usize>,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

/// A parsed, validated safetensors file.
pub struct SafetensorsFile {
    storage: Storage,
    /// Sorted by name.
    tensors: Vec<TensorInfo>,
    metadata: BTreeMap<String, String>,
}

impl fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("len", &self.bytes().len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The header's entries in file order, duplicates kept so they can be reported.
struct RawHeader {
    entries: Vec<(String, Entry)>,
    metadata: Option<BTreeMap<String, String>>,
    duplicate: Option<String>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeader;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a safetensors header object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
                let mut h = RawHeader {
                    entries: Vec::new(),
                    metadata: None,
                    duplicate: None,
                };
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        if h.metadata.is_some() {
                            h.duplicate.get_or_insert(key);
                        }
                        h.metadata = Some(map.next_value()?);
                    } else {
                        let e: Entry = map.next_value()?;
                        h.entries.push((key, e));
                    }
                }
                Ok(h)
            }
        }
        d.deserialize_map(V)
    }
}

impl SafetensorsFile {
    /// Memory-maps and validates the file at `path`. As with any mmap loader, results are
    /// undefined if another process rewrites the file while it is open.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile, SafetensorsError> {
        let path = path.as_ref();
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is only read through `&[u8]` (see above for concurrent writers).
            Storage::Mmap(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        Self::with_storage(storage)
    }

    /// Validates a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<SafetensorsFile, SafetensorsError> {
        Self::with_storage(Storage::Owned(bytes))
    }

    fn with_storage(storage: Storage) -> Result<SafetensorsFile, SafetensorsError> {
        let bytes = match &storage {
            Storage::Mmap(m) => &m[..],
            Storage::Owned(v) => &v[..],
        };
        let (tensors, metadata) = parse(bytes)?;
        Ok(SafetensorsFile {
            storage,
            tensors,
            metadata,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        &self.bytes()[t.range.clone()]
    }

    /// The `__metadata__` map (empty when absent).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
}

type Parsed = (Vec<TensorInfo>, BTreeMap<String, String>);

fn parse(bytes: &[u8]) -> Result<Parsed, SafetensorsError> {
    let file_len = bytes.len() as u64;
    let Some(len_bytes) = bytes.first_chunk::<8>() else {
        return Err(SafetensorsError::TooShort { len: file_len });
    };
    let n = u64::from_le_bytes(*len_bytes);
    if n > MAX_HEADER_LEN {
        return Err(SafetensorsError::HeaderTooLarge {
            len: n,
            max: MAX_HEADER_LEN,
        });
    }
    if n > file_len - 8 {
        return Err(SafetensorsError::HeaderOutOfBounds { len: n, file_len });
    }
    let data_start = 8 + n as usize;
    let text = std::str::from_utf8(&bytes[8..data_start]).map_err(|e| {
        SafetensorsError::HeaderNotUtf8 {
            valid_up_to: e.valid_up_to(),
        }
    })?;
    let raw: RawHeader =
        serde_json::from_str(text).map_err(|e| SafetensorsError::HeaderJson(e.to_string()))?;
    if let Some(d) = raw.duplicate {
        return Err(SafetensorsError::DuplicateTensor(d));
    }
    let mut tensors = Vec::with_capacity(raw.entries.len());
    for (name, e) in raw.entries {
        tensors.push(check_entry(name, e, data_start)?);
    }
    tensors.sort_by_key(|t| t.range.start);
    let mut expected = data_start;
    for t in &tensors {
        if t.range.start != expected {
            return Err(SafetensorsError::NotContiguous {
                name: t.name.clone(),
                expected: (expected - data_start) as u64,
                found: (t.range.start - data_start) as u64,
            });
        }
        expected = t.range.end;
    }
    if expected != bytes.len() {
        return Err(SafetensorsError::DataLenMismatch {
            data_len: (bytes.len() - data_start) as u64,
            covered: (expected - data_start) as u64,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = tensors.windows(2).find(|w| w[0].name == w[1].name) {
        return Err(SafetensorsError::DuplicateTensor(w[0].name.clone()));
    }
    Ok((tensors, raw.metadata.unwrap_or_default()))
}

/// Checks one entry's dtype, rank, size and offsets; its range is absolute (saturating: the
/// tiling check then rejects anything past the file).
fn check_entry(name: String, e: Entry, data_start: usize) -> Result<TensorInfo, SafetensorsError> {
    let Some(dtype) = Dtype::from_name(&e.dtype) else {
        return Err(SafetensorsError::UnknownDtype {
            name,
            dtype: e.dtype,
        });
    };
    if e.shape.len() > MAX_RANK {
        let rank = e.shape.len();
        return Err(SafetensorsError::TooManyDims {
            name,
            rank,
            max: MAX_RANK,
        });
    }
    let size = e
        .shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d));
    let Some(size) = size else {
        return Err(SafetensorsError::SizeOverflow { name });
    };
    let [begin, end] = e.data_offsets;
    if begin > end {
        return Err(SafetensorsError::BadOffsets { name, begin, end });
    }
    if end - begin != size {
        return Err(SafetensorsError::SizeMismatch {
            name,
            expected: size,
            found: end - begin,
        });
    }
    let abs = |o: u64| usize::try_from(o).map_or(usize::MAX, |o| o.saturating_add(data_start));
    Ok(TensorInfo {
        name,
        dtype,
        shape: e.shape,
        range: abs(begin)..abs(end),
    })
}
