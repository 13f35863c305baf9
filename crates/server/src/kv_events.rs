//! vLLM's KV-cache events over ZMQ (`--kv-events-config`), so a prefix-aware router — llm-d's
//! prefix-cache scorer, or anything that speaks vLLM's format — can follow what each worker's
//! prefix cache holds.
//!
//! - **Config**: vLLM's JSON keys — `enable_kv_cache_events`, `publisher` (`"zmq"`, or
//!   `"null"` for none), `endpoint` (default `tcp://*:5557`), `replay_endpoint`,
//!   `buffer_steps` (batches kept for replay, 10000), `topic` (`""`); `hwm` and
//!   `max_queue_size` are accepted (the queue to the publisher is unbounded: the engine never
//!   waits on it). An endpoint with `*` or `::` is bound, any other connected (vLLM's rule).
//! - **Wire**: one ZMQ PUB message per engine step that changed the cache, three frames — the
//!   topic, the sequence number (8 bytes, big-endian, from 0), and the msgpack `KVEventBatch`
//!   `[ts, [event…], data_parallel_rank]`, each event a positional array as vLLM's msgspec
//!   structs encode them: `["BlockStored", [hash…], parent_hash | nil, [token…], block_size,
//!   lora_id = nil, medium = "GPU", lora_name = nil]`, `["BlockRemoved", [hash…], "GPU"]`,
//!   `["AllBlocksCleared"]`. Hashes are tokenmill's own chained 64-bit block keys, always
//!   written as 8-byte msgpack integers (llm-d's decoder rejects the short forms); llm-d keys
//!   blocks by the token ids it is sent, so it needs no agreement on the hash function.
//! - **Replay**: with `replay_endpoint`, a ROUTER socket answers `[b"", start_seq]` (8 bytes)
//!   from a DEALER with every kept batch from `start_seq` on, as `[b"", seq, payload]`, then
//!   `[b"", 0xff×8, b""]`.

use std::collections::VecDeque;

use serde_json::Value;
use tokenmill_engine::{KvEvent, KvEventBatch};
use tokio::sync::mpsc::UnboundedReceiver;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// `--kv-events-config`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsConfig {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub buffer_steps: usize,
    pub topic: String,
}

impl KvEventsConfig {
    /// Parses the flag's JSON; `None` when events are off (`enable_kv_cache_events` false, or
    /// the `null` publisher).
    pub fn parse(json: &str) -> Result<Option<KvEventsConfig>, String> {
        let v: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
        let Value::Object(o) = v else {
            return Err("must be a JSON object".into());
        };
        let known = [
            "enable_kv_cache_events",
            "publisher",
            "endpoint",
            "replay_endpoint",
            "buffer_steps",
            "hwm",
            "max_queue_size",
            "topic",
        ];
        if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(format!("unknown key {k:?} (known: {})", known.join(", ")));
        }
        let str_of = |k: &str| match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{k}` must be a string")),
        };
        let enabled = match o.get("enable_kv_cache_events") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("`enable_kv_cache_events` must be true or false".into()),
        };
        match str_of("publisher")?.as_deref() {
            None | Some("zmq") => {}
            Some("null") => return Ok(None),
            Some(p) => return Err(format!("unknown publisher {p:?} (zmq or null)")),
        }
        for k in ["buffer_steps", "hwm", "max_queue_size"] {
            if o.get(k).is_some_and(|v| v.as_u64().is_none_or(|n| n == 0)) {
                return Err(format!("`{k}` must be a positive integer"));
            }
        }
        let cfg = KvEventsConfig {
            endpoint: str_of("endpoint")?.unwrap_or_else(|| "tcp://*:5557".into()),
            replay_endpoint: str_of("replay_endpoint")?,
            buffer_steps: o
                .get("buffer_steps")
                .and_then(Value::as_u64)
                .map_or(10_000, |n| n as usize),
            topic: str_of("topic")?.unwrap_or_default(),
        };
        Ok(enabled.then_some(cfg))
    }
}

/// The msgpack payload of one batch (see the module docs).
pub fn encode_batch(batch: &KvEventBatch) -> Vec<u8> {
    use rmp::encode::{write_array_len, write_f64, write_nil, write_str, write_u64, write_uint};
    let mut b = Vec::with_capacity(64);
    // Writing to a Vec cannot fail.
    let w = &mut b;
    let _ = write_array_len(w, 3);
    let _ = write_f64(w, batch.ts);
    let _ = write_array_len(w, batch.events.len() as u32);
    for e in &batch.events {
        match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
            } => {
                let _ = write_array_len(w, 8);
                let _ = write_str(w, "BlockStored");
                let _ = write_array_len(w, block_hashes.len() as u32);
                for &h in block_hashes {
                    let _ = write_u64(w, h);
                }
                match parent_block_hash {
                    Some(h) => drop(write_u64(w, *h)),
                    None => drop(write_nil(w)),
                }
                let _ = write_array_len(w, token_ids.len() as u32);
                for &t in token_ids {
                    let _ = write_uint(w, t as u64);
                }
                let _ = write_uint(w, *block_size as u64);
                let _ = write_nil(w); // lora_id
                let _ = write_str(w, "GPU"); // medium: where the blocks live, in vLLM's words
                let _ = write_nil(w); // lora_name
            }
            KvEvent::BlockRemoved { block_hashes } => {
                let _ = write_array_len(w, 3);
                let _ = write_str(w, "BlockRemoved");
                let _ = write_array_len(w, block_hashes.len() as u32);
                for &h in block_hashes {
                    let _ = write_u64(w, h);
                }
                let _ = write_str(w, "GPU");
            }
            KvEvent::AllBlocksCleared => {
                let _ = write_array_len(w, 1);
                let _ = write_str(w, "AllBlocksCleared");
            }
        }
    }
    let _ = write_uint(w, 0); // data_parallel_rank
    b
}

/// The address for the zeromq crate (`*` is every interface), and whether vLLM would bind it.
fn address(endpoint: &str) -> (String, bool) {
    let bind = endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://");
    (endpoint.replace('*', "0.0.0.0"), bind)
}

async fn open<S: Socket>(mut s: S, endpoint: &str, what: &str) -> Result<(S, String), String> {
    let (addr, bind) = address(endpoint);
    let err = |e: zeromq::ZmqError| format!("kv events {what} socket on {endpoint}: {e}");
    let at = if bind {
        s.bind(&addr).await.map_err(err)?.to_string()
    } else {
        s.connect(&addr).await.map_err(err)?;
        addr
    };
    Ok((s, at))
}

/// Opens the sockets and publishes every batch `rx` brings, on a task of the current runtime,
/// until the engine drops its sender. Returns the endpoints (as bound: a port 0 resolved).
pub async fn start(
    cfg: KvEventsConfig,
    rx: UnboundedReceiver<KvEventBatch>,
) -> Result<(String, Option<String>), String> {
    let (publisher, at) = open(zeromq::PubSocket::new(), &cfg.endpoint, "PUB").await?;
    let (replay, replay_at) = match &cfg.replay_endpoint {
        Some(e) => {
            let (s, at) = open(zeromq::RouterSocket::new(), e, "replay").await?;
            (Some(s), Some(at))
        }
        None => (None, None),
    };
    tokio::spawn(publish(cfg, rx, publisher, replay));
    Ok((at, replay_at))
}

async fn publish(
    cfg: KvEventsConfig,
    mut rx: UnboundedReceiver<KvEventBatch>,
    mut publisher: zeromq::PubSocket,
    mut replay: Option<zeromq::RouterSocket>,
) {
    let mut kept: VecDeque<(u64, bytes::Bytes)> = VecDeque::new();
    let mut seq = 0u64;
    loop {
        let request = async {
            match &mut replay {
                Some(r) => r.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            batch = rx.recv() => {
                let Some(batch) = batch else { return };
                let payload = bytes::Bytes::from(encode_batch(&batch));
                let mut m = ZmqMessage::from(cfg.topic.clone().into_bytes());
                m.push_back(seq.to_be_bytes().to_vec().into());
                m.push_back(payload.clone());
                if let Err(e) = publisher.send(m).await {
                    tracing::warn!("kv events: publishing batch {seq}: {e}");
                }
                if replay.is_some() {
                    kept.push_back((seq, payload));
                    if kept.len() > cfg.buffer_steps {
                        kept.pop_front();
                    }
                }
                seq += 1;
            }
            Ok(req) = request => {
                if let Some(r) = &mut replay {
                    answer_replay(r, &kept, req).await;
                }
            }
        }
    }
}

/// Answers one replay request `[identity, b"", start_seq]`.
async fn answer_replay(
    r: &mut zeromq::RouterSocket,
    kept: &VecDeque<(u64, bytes::Bytes)>,
    req: ZmqMessage,
) {
    let frames = req.into_vec();
    let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
        tracing::warn!("kv events: a replay request without an 8-byte start sequence");
        return;
    };
    let frame = |seq: [u8; 8], payload: bytes::Bytes| {
        let mut m = ZmqMessage::from(identity.clone());
        m.push_back(bytes::Bytes::new());
        m.push_back(seq.to_vec().into());
        m.push_back(payload);
        m
    };
    for (seq, payload) in kept.iter().filter(|(s, _)| *s >= start) {
        if r.send(frame(seq.to_be_bytes(), payload.clone()))
            .await
            .is_err()
        {
            return;
        }
    }
    let _ = r.send(frame([0xff; 8], bytes::Bytes::new())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_disabling_and_errors() {
        let on = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "zmq"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(on.endpoint, "tcp://*:5557");
        assert_eq!(on.buffer_steps, 10_000);
        assert_eq!(on.topic, "");
        assert_eq!(KvEventsConfig::parse("{}").unwrap(), None);
        let null = r#"{"enable_kv_cache_events": true, "publisher": "null"}"#;
        assert_eq!(KvEventsConfig::parse(null).unwrap(), None);
        for bad in [
            "[]",
            "nope",
            r#"{"enable_kv_cache_events": "yes"}"#,
            r#"{"publisher": "kafka"}"#,
            r#"{"endpoint": 5557}"#,
            r#"{"buffer_steps": 0}"#,
            r#"{"enable": true}"#,
        ] {
            assert!(KvEventsConfig::parse(bad).is_err(), "{bad}");
        }
    }

    /// The bytes vLLM's msgspec structs encode to, with every hash in its 8-byte form.
    #[test]
    fn encodes_vllms_positional_arrays_with_full_width_hashes() {
        let batch = KvEventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::BlockStored {
                    block_hashes: vec![0x1111, u64::MAX],
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![0x1111],
                },
                KvEvent::AllBlocksCleared,
            ],
        };
        let mut want = vec![0x93, 0xcb];
        want.extend(1.5f64.to_be_bytes());
        want.push(0x93);
        want.extend([0x98, 0xab]);
        want.extend(b"BlockStored");
        want.extend([0x92, 0xcf, 0, 0, 0, 0, 0, 0, 0x11, 0x11, 0xcf]);
        want.extend([0xff; 8]);
        want.extend([0xc0, 0x94, 1, 2, 3, 4, 2, 0xc0, 0xa3]);
        want.extend(b"GPU");
        want.extend([0xc0, 0x93, 0xac]);
        want.extend(b"BlockRemoved");
        want.extend([0x91, 0xcf, 0, 0, 0, 0, 0, 0, 0x11, 0x11, 0xa3]);
        want.extend(b"GPU");
        want.extend([0x91, 0xb0]);
        want.extend(b"AllBlocksCleared");
        want.push(0);
        assert_eq!(encode_batch(&batch), want);
    }
}
