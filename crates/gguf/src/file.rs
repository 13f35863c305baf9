//! [`GgufFile`]: owns the bytes (a memory map or a `Vec`) and the parsed, validated header.

use std::path::Path;

use memmap2::Mmap;

use crate::error::GgufError;
use crate::metadata::Metadata;
use crate::reader::Reader;
use crate::tensor::{TensorInfo, TensorTable};
use crate::value::Value;

/// The magic bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Versions this reader accepts (little-endian only).
pub const SUPPORTED_VERSIONS: [u32; 2] = [2, 3];
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides [`DEFAULT_ALIGNMENT`]; its value must be a u32.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// The bytes behind a [`GgufFile`].
enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// Everything parsed from the header; independent of where the bytes live.
struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    tensors: TensorTable,
}

/// A parsed GGUF file. Construction validates everything (see the crate doc), so the
/// accessors cannot fail.
pub struct GgufFile {
    storage: Storage,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("len", &self.storage.bytes().len())
            .field("metadata_len", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.infos.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    ///
    /// The map is read-only and private; like every mmap-based loader, results are undefined
    /// if another process truncates or rewrites the file while it is open.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let file = std::fs::File::open(path.as_ref())?;
        let len = file.metadata()?.len();
        let storage = if len == 0 {
            // Mapping zero bytes fails on some platforms; an empty file is simply truncated.
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is only ever read through `&[u8]`. Concurrent modification of the
            // file by another process is outside what this reader can defend against (see above).
            Storage::Mmap(unsafe { Mmap::map(&file)? })
        };
        Self::with_storage(storage)
    }

    /// Parses a file held in memory (tests, fuzzing, files fetched over the network).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::with_storage(Storage::Owned(bytes))
    }

    fn with_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let header = parse(storage.bytes())?;
        Ok(GgufFile { storage, header })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Alignment of the data section and every tensor (a nonzero power of two).
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Length of the file in bytes.
    pub fn len(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// Whether the file is empty (never true for a parsed file; here for API symmetry).
    pub fn is_empty(&self) -> bool {
        self.storage.bytes().is_empty()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors.infos
    }

    /// The tensor named `name` (binary search).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.get(name)
    }

    /// The bytes of tensor `t`, `t.size` long.
    ///
    /// # Panics
    /// If `t` does not lie inside this file, which cannot happen for a `TensorInfo` obtained
    /// from this `GgufFile` (bounds were validated at open); it means `t` came from another file
    /// or was built by hand.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.end()).ok())
            .and_then(|(start, end)| self.storage.bytes().get(start..end));
        match range {
            Some(bytes) => bytes,
            None => panic!(
                "tensor {:?} ({} bytes at {}) is not inside this {}-byte GGUF file",
                t.name,
                t.size,
                t.offset,
                self.len()
            ),
        }
    }

    /// Tells the OS that this process will not read tensor `t`'s bytes again soon (its loader
    /// keeps its own repacked copy), so the pages they occupy can leave memory now instead of
    /// counting in the resident set beside the copy. A later read still sees the same bytes:
    /// the map is a private read-only file mapping, whose dropped pages fault back in from the
    /// file. Best effort: a no-op for files held in memory, errors ignored.
    pub fn release_tensor_pages(&self, t: &TensorInfo) {
        let Storage::Mmap(m) = &self.storage else {
            return;
        };
        let Some(range) = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.end()).ok())
            .filter(|&(start, end)| start <= end && end <= m.len())
        else {
            return;
        };
        #[cfg(unix)]
        // SAFETY: the mapping is private and never written, so MADV_DONTNEED only drops clean
        // pages that re-read from the file with the same contents; no reference sees a change.
        unsafe {
            let _ = m.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                range.0,
                range.1 - range.0,
            );
        }
        #[cfg(not(unix))]
        let _ = range;
    }

    /// `general.architecture` (`"llama"`, `"qwen2"`, ...).
    pub fn architecture(&self) -> Option<&str> {
        self.header.metadata.get_str("general.architecture")
    }
}

/// Parses and validates the whole header of `bytes`.
fn parse(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut r = Reader::new(bytes);
    let magic = r.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = r.u32("version")?;
    if !SUPPORTED_VERSIONS.contains(&version) {
        let swapped = version.swap_bytes();
        return Err(if SUPPORTED_VERSIONS.contains(&swapped) {
            GgufError::BigEndian(swapped)
        } else {
            GgufError::UnsupportedVersion(version)
        });
    }
    let n_tensors_offset = r.offset();
    let n_tensors = r.u64("tensor count")?;
    let n_kv_offset = r.offset();
    let n_kv = r.u64("metadata kv count")?;
    let metadata = Metadata::read(&mut r, n_kv, n_kv_offset)?;
    let alignment = alignment(&metadata)?;
    let mut tensors = TensorTable::read(&mut r, n_tensors, n_tensors_offset)?;

    // `alignment` is a power of two <= 2^31, and the offset is at most the file length, so
    // this cannot overflow; check anyway.
    let data_offset = r
        .offset()
        .checked_next_multiple_of(alignment)
        .unwrap_or(u64::MAX);
    tensors.place(data_offset, alignment, bytes.len() as u64)?;
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}

/// `general.alignment` if present (a u32, nonzero power of two), else the default.
fn alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    match metadata.get(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(GgufError::BadAlignment(u64::from(*a))),
        Some(other) => Err(GgufError::WrongValueType {
            key: ALIGNMENT_KEY,
            expected: "u32",
            found: other.type_name(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&n_tensors.to_le_bytes());
        b.extend_from_slice(&n_kv.to_le_bytes());
        b
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<GgufFile>();
    }

    #[test]
    fn a_bare_header_is_a_valid_empty_file() {
        for version in SUPPORTED_VERSIONS {
            let f = GgufFile::from_bytes(header(version, 0, 0)).unwrap();
            assert_eq!(f.version(), version);
            assert_eq!(f.alignment(), DEFAULT_ALIGNMENT);
            assert_eq!(f.data_offset(), 32); // past the end: fine with no tensors
            assert!(f.tensors().is_empty() && f.metadata().is_empty());
            assert_eq!(f.architecture(), None);
            assert_eq!(f.tensor("x"), None);
        }
    }

    #[test]
    fn versions_and_byte_order() {
        let err = |b| GgufFile::from_bytes(b).unwrap_err();
        assert!(matches!(
            err(header(1, 0, 0)),
            GgufError::UnsupportedVersion(1)
        ));
        assert!(matches!(
            err(header(2u32.swap_bytes(), 0, 0)),
            GgufError::BigEndian(2)
        ));
        assert!(matches!(err(b"gguf".to_vec()), GgufError::BadMagic(_)));
    }

    #[test]
    #[should_panic(expected = "not inside this")]
    fn tensor_data_rejects_foreign_tensor_infos() {
        let f = GgufFile::from_bytes(header(3, 0, 0)).unwrap();
        let foreign = TensorInfo {
            name: "w".into(),
            dims: vec![4],
            ty: crate::GgmlType::F32,
            offset: 32,
            size: 16,
        };
        let _ = f.tensor_data(&foreign);
    }
}
