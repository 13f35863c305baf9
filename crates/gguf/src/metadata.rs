//! [`Metadata`]: the key/value section, in file order, with a sorted index for lookups.
//!
//! Keys must be UTF-8 and unique. The index is a permutation of entry positions sorted by key,
//! so lookups are a binary search and duplicate keys show up as equal neighbours; keys are
//! stored once.

use crate::error::GgufError;
use crate::reader::{Reader, bounded_vec};
use crate::value::{Array, MIN_KV_SIZE, Value, read_value};

/// The metadata key/value pairs of a GGUF file.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    /// Entries in file order.
    entries: Vec<(String, Value)>,
    /// Positions into `entries`, sorted by key.
    index: Vec<usize>,
}

impl Metadata {
    /// Reads `count` entries (the count stored at `count_offset`), after checking that the
    /// bytes left can hold that many.
    pub(crate) fn read(
        r: &mut Reader<'_>,
        count: u64,
        count_offset: u64,
    ) -> Result<Metadata, GgufError> {
        r.check_count(count, MIN_KV_SIZE, "metadata kv count", count_offset)?;
        let mut entries = bounded_vec(count, r.remaining());
        for _ in 0..count {
            let key = r.string("metadata key")?;
            let type_id = r.u32("metadata value type")?;
            let value = read_value(r, type_id, 0)?;
            entries.push((key, value));
        }
        Metadata::from_entries(entries)
    }

    /// Builds the index, rejecting duplicate keys.
    fn from_entries(entries: Vec<(String, Value)>) -> Result<Metadata, GgufError> {
        let mut index: Vec<usize> = (0..entries.len()).collect();
        let key = |i: &usize| entries.get(*i).map_or("", |(k, _)| k.as_str());
        index.sort_unstable_by(|a, b| key(a).cmp(key(b)));
        if let Some(pair) = index.windows(2).find(|w| key(&w[0]) == key(&w[1])) {
            return Err(GgufError::DuplicateKey(key(&pair[0]).to_owned()));
        }
        Ok(Metadata { entries, index })
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let pos = self
            .index
            .binary_search_by(|&i| self.key_at(i).cmp(key))
            .ok()?;
        let i = *self.index.get(pos)?;
        self.entries.get(i).map(|(_, v)| v)
    }

    fn key_at(&self, i: usize) -> &str {
        self.entries.get(i).map_or("", |(k, _)| k.as_str())
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer type holding a non-negative value.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any integer type holding a value that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// An f32, an f64 (narrowed) or an integer (converted).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key)?.as_array()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&str, Value)]) -> Result<Metadata, GgufError> {
        Metadata::from_entries(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn lookups_and_order() {
        let m = md(&[
            ("z.last", Value::U32(1)),
            ("a.first", Value::String("x".into())),
            ("m.mid", Value::F64(0.25)),
            ("neg", Value::I8(-4)),
        ])
        .unwrap();
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["z.last", "a.first", "m.mid", "neg"]);
        assert_eq!(m.get_u64("z.last"), Some(1));
        assert_eq!(m.get_str("a.first"), Some("x"));
        assert_eq!(m.get_f32("m.mid"), Some(0.25));
        assert_eq!(m.get_i64("neg"), Some(-4));
        assert_eq!(m.get_u64("neg"), None);
        assert_eq!(m.get("missing"), None);
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn duplicates_are_rejected() {
        let err = md(&[
            ("k", Value::U8(1)),
            ("j", Value::U8(2)),
            ("k", Value::U8(3)),
        ]);
        assert!(matches!(err, Err(GgufError::DuplicateKey(k)) if k == "k"));
    }
}
