"""An independent subscriber to `tokenmill serve --kv-events-config` (pyzmq + msgpack): it
rebuilds the worker's prefix cache from the events alone and checks it against what the
worker does.

Usage: python test_kv_events.py BASE_URL MODEL PUB_PORT REPLAY_PORT TOPIC

Requests go in one at a time as token ids (shared prefixes, more distinct tokens than the
small KV cache holds, so blocks are evicted). Before each, the subscriber predicts from its
rebuilt cache how many prompt tokens the worker will find cached — a chain of stored blocks
from block 0 whose tokens match the prompt's — and the worker's own count
(`vllm:prefix_cache_hits_total`) must move by exactly that. Next, requests run concurrently,
more than the cache holds, so the worker preempts some (`vllm:num_preemptions_total` moves)
and evicts and re-stores blocks while they run; afterwards every prompt is probed again one
at a time, and the rebuilt cache must still predict each hit exactly. Then the replay socket
must hand back every batch the subscription saw. Prints one line per test and `N passed, M failed`.
"""

import random
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import msgpack
import zmq
from openai import OpenAI

from harness import main, test

BASE, MODEL, PUB, REPLAY, TOPIC = sys.argv[1:6]
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.connect(f"tcp://127.0.0.1:{PUB}")
sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
time.sleep(0.5)  # ZMQ's slow joiner: let the subscription reach the publisher

SEEN = []  # (seq, payload) in arrival order
HU64 = 2**64


class Cache:
    """The worker's prefix cache as the events describe it: hash -> (parent, tokens)."""

    def __init__(self):
        self.blocks = {}
        self.block_size = None
        self.stored = self.removed = 0

    def apply(self, batch):
        ts, events, rank = batch  # vLLM's KVEventBatch, positional
        assert isinstance(ts, float) and rank == 0, batch
        for e in events:
            kind = e[0]
            if kind == "BlockStored":
                hashes, parent, tokens, bs, lora_id, medium, lora_name = e[1:8]
                assert medium == "GPU" and lora_id is None and lora_name is None, e
                assert len(tokens) == len(hashes) * bs, e
                self.block_size = bs
                for i, h in enumerate(hashes):
                    assert 0 <= h < HU64
                    self.blocks[h] = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
                    parent = h
                self.stored += len(hashes)
            elif kind == "BlockRemoved":
                for h in e[1]:
                    assert h in self.blocks, f"removed {h}, never stored"
                    del self.blocks[h]
                self.removed += len(e[1])
            elif kind == "AllBlocksCleared":
                self.blocks.clear()
            else:
                raise AssertionError(f"unknown event {e}")

    def predicted_hit(self, prompt):
        """Tokens the worker will serve from its cache: whole blocks chained from block 0,
        at most all but the last token (which is always recomputed)."""
        bs = self.block_size
        if bs is None:
            return 0
        by_parent = {(p, t): h for h, (p, t) in self.blocks.items()}
        parent, n = None, 0
        while (n + 1) * bs <= len(prompt) - 1:
            h = by_parent.get((parent, tuple(prompt[n * bs:(n + 1) * bs])))
            if h is None:
                break
            parent, n = h, n + 1
        return n * bs


CACHE = Cache()


def drain(quiet=0.3):
    """Applies every batch that arrives until none has for `quiet` seconds."""
    while sub.poll(int(quiet * 1000)):
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode(), topic
        assert len(seq) == 8
        seq = int.from_bytes(seq, "big")
        assert seq == len(SEEN), f"sequence {seq} after {len(SEEN)} batches"
        SEEN.append((seq, payload))
        CACHE.apply(msgpack.unpackb(payload))


def metric(name):
    with urllib.request.urlopen(BASE + "/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}")


def hits():
    return metric("vllm:prefix_cache_hits_total")


def probe(prompt, label):
    """One request alone: the worker's prefix hit must be what the rebuilt cache predicts."""
    drain()
    want = CACHE.predicted_hit(prompt)
    before = hits()
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length"
    got = hits() - before
    assert got == want, f"{label}: the worker hit {got} tokens, the events predict {want}"
    return want


@test
def the_rebuilt_cache_predicts_every_prefix_hit_through_evictions():
    rng = random.Random(7)
    systems = [[rng.randrange(1000, 30000) for _ in range(48)] for _ in range(3)]
    checked = hit_requests = 0
    for i in range(24):
        prompt = rng.choice(systems) + [rng.randrange(1000, 30000) for _ in range(rng.randrange(5, 40))]
        want = probe(prompt, f"request {i}")
        checked += 1
        hit_requests += want > 0
    drain()
    assert checked == 24 and hit_requests >= 6, hit_requests
    assert CACHE.stored > 0 and CACHE.removed > 0, (CACHE.stored, CACHE.removed)


@test
def the_rebuilt_cache_follows_preemptions():
    rng = random.Random(11)
    systems = [[rng.randrange(1000, 30000) for _ in range(64)] for _ in range(2)]
    prompts = [
        rng.choice(systems) + [rng.randrange(1000, 30000) for _ in range(rng.randrange(20, 60))]
        for _ in range(8)
    ]
    preempted = metric("vllm:num_preemptions_total")
    removed = CACHE.removed

    def run(prompt):
        # ~13 blocks each by the end, 8 at once: far more than the 24 blocks there are.
        r = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=90, temperature=0, extra_body={"ignore_eos": True}
        )
        return r.choices[0].finish_reason, r.usage.completion_tokens

    with ThreadPoolExecutor(len(prompts)) as pool:
        # Drain while they run: the publisher's queue is never the only copy.
        futures = [pool.submit(run, p) for p in prompts]
        while not all(f.done() for f in futures):
            drain(quiet=0.05)
        results = [f.result() for f in futures]
    assert results == [("length", 90)] * len(prompts), results
    assert metric("vllm:num_preemptions_total") > preempted, "no request was preempted"
    drain()
    assert CACHE.removed > removed
    hit_requests = sum(probe(p, f"probe {i} after preemption") > 0 for i, p in enumerate(prompts))
    # The shared system prompts come back from the cache for most of the probes.
    assert hit_requests >= 4, hit_requests


@test
def replay_returns_every_batch_published():
    drain()  # the last request's batches
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{REPLAY}")
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    while True:
        assert dealer.poll(5000), "the replay socket went quiet"
        empty, seq, payload = dealer.recv_multipart()
        assert empty == b""
        seq = int.from_bytes(seq, "big")
        if seq == HU64 - 1:
            assert payload == b""
            break
        replayed.append((seq, payload))
    assert replayed == SEEN, (len(replayed), len(SEEN))
    # From the middle on: only the later batches.
    mid = len(SEEN) // 2
    dealer.send_multipart([b"", mid.to_bytes(8, "big")])
    tail = []
    while True:
        empty, seq, payload = dealer.recv_multipart()
        seq = int.from_bytes(seq, "big")
        if seq == HU64 - 1:
            break
        tail.append((seq, payload))
    assert tail == SEEN[mid:], (len(tail), len(SEEN) - mid)


main()
