//! The Responses API's memory of past responses, for `previous_response_id` and
//! `GET /v1/responses/{id}`: each stored response keeps its conversation (the chat messages
//! that led to it, its own reply last) and its response object. Bounded by count and by bytes;
//! the oldest go first. Lost on restart, like everything else the server holds.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// At most this many responses are kept...
const MAX_RESPONSES: usize = 1024;
/// ...and at most this many bytes of their JSON.
const MAX_BYTES: usize = 64 << 20;

#[derive(Clone, Debug)]
pub struct Stored {
    /// Chat messages: the inputs of this and all earlier turns, and the replies.
    pub conversation: Vec<Value>,
    /// The response object as returned.
    pub response: Value,
}

#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, (Stored, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

impl ResponseStore {
    pub fn get(&self, id: &str) -> Option<Stored> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.get(id).map(|(s, _)| s.clone())
    }

    /// Stores `stored` under `id`, evicting the oldest beyond the bounds. A response larger
    /// than the whole byte bound is not kept.
    pub fn put(&self, id: String, stored: Stored) {
        let size = stored.response.to_string().len()
            + stored
                .conversation
                .iter()
                .map(|m| m.to_string().len())
                .sum::<usize>();
        if size > MAX_BYTES {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while !inner.order.is_empty()
            && (inner.order.len() >= MAX_RESPONSES || inner.bytes + size > MAX_BYTES)
        {
            if let Some(old) = inner.order.pop_front()
                && let Some((_, n)) = inner.by_id.remove(&old)
            {
                inner.bytes -= n;
            }
        }
        inner.bytes += size;
        inner.order.push_back(id.clone());
        inner.by_id.insert(id, (stored, size));
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> Stored {
        Stored {
            conversation: vec![json!({"role": "assistant", "content": text})],
            response: json!({"id": "r"}),
        }
    }

    #[test]
    fn keeps_the_newest_within_the_count_bound() {
        let s = ResponseStore::default();
        for i in 0..MAX_RESPONSES + 10 {
            s.put(format!("r{i}"), stored("x"));
        }
        assert_eq!(s.len(), MAX_RESPONSES);
        assert!(s.get("r0").is_none() && s.get("r9").is_none());
        assert!(s.get("r10").is_some());
        assert!(s.get(&format!("r{}", MAX_RESPONSES + 9)).is_some());
    }

    #[test]
    fn evicts_by_bytes_and_refuses_what_cannot_fit() {
        let s = ResponseStore::default();
        let big = "y".repeat(MAX_BYTES / 3);
        for i in 0..4 {
            s.put(format!("b{i}"), stored(&big));
        }
        assert_eq!(s.len(), 2, "only two thirds-of-the-bound fit");
        assert!(s.get("b3").is_some() && s.get("b0").is_none());
        s.put("huge".into(), stored(&"z".repeat(MAX_BYTES)));
        assert!(s.get("huge").is_none());
        assert_eq!(s.len(), 2);
    }
}
