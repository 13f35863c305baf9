//! [`Reader`]: a bounds-checked little-endian cursor over the file's bytes.
//!
//! Every read either returns the bytes it asked for or a typed error; nothing here can index
//! out of bounds or overflow. Lengths and counts read from the file are compared against
//! [`Reader::remaining`] *before* anything is allocated for them.

use crate::error::GgufError;

/// A cursor over `buf`; `pos <= buf.len()` always holds.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// Absolute offset of the next byte to read.
    pub(crate) fn offset(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the cursor.
    pub(crate) fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    /// The next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], GgufError> {
        let chunk = self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.first_chunk::<N>())
            .ok_or(GgufError::Truncated {
                what,
                offset: self.offset(),
            })?;
        self.pos += N;
        Ok(*chunk)
    }

    /// The next `len` bytes. Callers check `len` against [`Reader::remaining`] first when they
    /// want a more specific error than `Truncated`.
    pub(crate) fn bytes(&mut self, len: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let offset = self.offset();
        let out = usize::try_from(len)
            .ok()
            .and_then(|len| self.pos.checked_add(len))
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or(GgufError::Truncated { what, offset })?;
        self.pos += out.len();
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A bool byte, which must be 0 or 1.
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, GgufError> {
        let offset = self.offset();
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::BadBool { offset, value }),
        }
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8 (no terminator).
    /// Allocates at most `len <= remaining` bytes.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let bytes = self.str_bytes(what)?;
        let offset = self.offset() - bytes.len() as u64;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 { what, offset }),
        }
    }

    /// The raw bytes of a GGUF string, length-checked but not UTF-8-checked.
    fn str_bytes(&mut self, what: &'static str) -> Result<&'a [u8], GgufError> {
        let len = self.u64(what)?;
        let remaining = self.remaining();
        if len > remaining {
            return Err(GgufError::StringTooLong {
                what,
                offset: self.offset(),
                len,
                remaining,
            });
        }
        self.bytes(len, what)
    }

    /// Checks that `count` items of at least `min_bytes_each` bytes fit in what is left of the
    /// file. `count_offset` is where `count` was read (the error points at it).
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_bytes_each: u64,
        what: &'static str,
        count_offset: u64,
    ) -> Result<(), GgufError> {
        let remaining = self.remaining();
        let fits = count
            .checked_mul(min_bytes_each)
            .is_some_and(|need| need <= remaining);
        if fits {
            Ok(())
        } else {
            Err(GgufError::CountTooLarge {
                what,
                offset: count_offset,
                count,
                min_bytes_each,
                remaining,
            })
        }
    }
}

/// A `Vec` with room for `count` items of `T`, but never reserving more bytes than `remaining`:
/// a hostile count that passed [`Reader::check_count`] (because the file is large) still cannot
/// make one allocation bigger than the file. Real items beyond that grow the vector normally.
pub(crate) fn bounded_vec<T>(count: u64, remaining: u64) -> Vec<T> {
    let size = std::mem::size_of::<T>().max(1) as u64;
    let cap = count.min(remaining / size);
    Vec::with_capacity(usize::try_from(cap).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let buf = [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9];
        let mut r = Reader::new(&buf);
        assert_eq!(r.u32("a").unwrap(), 1);
        assert_eq!(r.u64("b").unwrap(), 2);
        assert_eq!(r.remaining(), 1);
        assert!(matches!(
            r.u32("c"),
            Err(GgufError::Truncated {
                what: "c",
                offset: 12
            })
        ));
        // A failed read does not move the cursor.
        assert_eq!(r.u8("d").unwrap(), 9);
        assert!(r.bytes(u64::MAX, "e").is_err());
        assert!(r.bytes(0, "f").unwrap().is_empty());
    }

    #[test]
    fn strings_are_length_checked_and_utf8_checked() {
        let mut buf = 3u64.to_le_bytes().to_vec();
        buf.extend_from_slice(b"abc");
        assert_eq!(Reader::new(&buf).string("s").unwrap(), "abc");

        let mut long = u64::MAX.to_le_bytes().to_vec();
        long.extend_from_slice(b"abc");
        assert!(matches!(
            Reader::new(&long).string("s"),
            Err(GgufError::StringTooLong {
                len: u64::MAX,
                remaining: 3,
                ..
            })
        ));

        let mut bad = 2u64.to_le_bytes().to_vec();
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert!(matches!(
            Reader::new(&bad).string("s"),
            Err(GgufError::InvalidUtf8 {
                what: "s",
                offset: 8
            })
        ));
    }

    #[test]
    fn counts_are_checked_without_overflow() {
        let buf = [0u8; 16];
        let r = Reader::new(&buf);
        assert!(r.check_count(2, 8, "n", 0).is_ok());
        assert!(r.check_count(3, 8, "n", 0).is_err());
        assert!(r.check_count(u64::MAX, 2, "n", 0).is_err());
        assert!(r.check_count(u64::MAX, 0, "n", 0).is_ok());
    }

    #[test]
    fn bounded_vec_never_reserves_more_than_the_bytes_left() {
        let v: Vec<u64> = bounded_vec(u64::MAX, 80);
        assert!(v.capacity() >= 10 && v.capacity() * 8 <= 160);
        let v: Vec<()> = bounded_vec(5, 0);
        assert_eq!(v.len(), 0);
    }
}
