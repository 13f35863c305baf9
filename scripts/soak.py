#!/usr/bin/env python3
"""Soak test of `tokenmill serve` under faults (issue 21). Python 3.11 standard library only.

Starts its own server with a small KV cache (so preemption really happens), then for
--duration seconds runs mixed well-formed traffic from --clients threads while other threads
inject faults: clients that disconnect at random points, malformed requests, slow-loris
connections, and every --wave-interval seconds a burst of disconnects after which the script
pauses traffic and checks (via /metrics) that the engine is idle and the KV cache is back to
its baseline. It samples the server's RSS, and ends with a SIGTERM drain check and a restart.

Usage: scripts/soak.py --bin target/release/tokenmill --model models/X.gguf
                       [--duration 300] [--port P] [--seed S] [--clients 4] [--json-out F]
Exit status: 0 when every assertion holds, 1 when one is violated (each is printed), 2 on a
setup error.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

# ---------------------------------------------------------------------------------------------
# shared state


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = Counter()  # generic counters
        self.kinds = Counter()  # well-formed requests by kind
        self.kind_ok = Counter()
        self.status = Counter()  # status codes of well-formed requests
        self.disconnects = Counter()  # by mode
        self.malformed = defaultdict(Counter)  # case -> status -> count
        self.violations = []  # (time, message)
        self.by_thread = Counter()  # violations per thread (threading.get_ident())
        self.notes = []
        self.latencies = defaultdict(list)

    def inc(self, counter, key, n=1):
        with self.lock:
            counter[key] += n

    def violate(self, msg):
        with self.lock:
            if len(self.violations) < 500:
                self.violations.append((round(time.time() - T0, 1), msg))
            self.c["violations"] += 1
            self.by_thread[threading.get_ident()] += 1
        log(f"VIOLATION: {msg}")

    def note(self, msg):
        with self.lock:
            if len(self.notes) < 200:
                self.notes.append((round(time.time() - T0, 1), msg))


T0 = time.time()
STATS = Stats()
VERBOSE = False


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


class Gate:
    """Lets workers be paused between requests, and counts requests in flight."""

    def __init__(self):
        self.cv = threading.Condition()
        self.paused = False
        self.inflight = 0
        self.stop = False

    def enter(self):
        with self.cv:
            while self.paused and not self.stop:
                self.cv.wait(0.2)
            if self.stop:
                return False
            self.inflight += 1
            return True

    def leave(self):
        with self.cv:
            self.inflight -= 1
            self.cv.notify_all()

    def pause(self, timeout):
        with self.cv:
            self.paused = True
            end = time.time() + timeout
            while self.inflight > 0 and time.time() < end:
                self.cv.wait(0.2)
            return self.inflight

    def resume(self):
        with self.cv:
            self.paused = False
            self.cv.notify_all()

    def shutdown(self):
        with self.cv:
            self.stop = True
            self.cv.notify_all()


GATE = Gate()

# ---------------------------------------------------------------------------------------------
# server process


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, binary, model, port, extra, log_path):
        self.binary, self.model, self.port, self.extra = binary, model, port, extra
        self.log_path = log_path
        self.proc = None

    def start(self, timeout=120):
        cmd = [self.binary, "serve", "--model", self.model, "--port", str(self.port)] + self.extra
        self.cmd = cmd
        self.logf = open(self.log_path, "ab")
        self.logf.write(("\n=== " + " ".join(cmd) + "\n").encode())
        self.logf.flush()
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT)
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up; see {self.log_path}")
            try:
                st, _, _ = request("GET", "/health", port=self.port, timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server not healthy after {timeout}s; see {self.log_path}")

    def rss_kib(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


PORT = None
MODEL_NAME = None


def request(method, path, body=None, headers=None, port=None, timeout=60):
    """One request on a fresh connection. Returns (status, headers-dict, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port or PORT, timeout=timeout)
    try:
        h = {"Connection": "close"}
        if body is not None:
            if not isinstance(body, (bytes, bytearray)):
                body = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def metrics():
    st, _, data = request("GET", "/metrics", timeout=10)
    if st != 200:
        raise RuntimeError(f"/metrics answered {st}")
    out = {}
    for line in data.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
        if not m:
            continue
        name, labels, val = m.group(1), m.group(2) or "", m.group(3)
        fr = re.search(r'finished_reason="([^"]+)"', labels)
        key = name + (f"[{fr.group(1)}]" if fr else "")
        if "_bucket" in name:
            continue
        try:
            out[key] = out.get(key, 0.0) + float(val)
        except ValueError:
            pass
    return out


# ---------------------------------------------------------------------------------------------
# well-formed traffic

WORDS = ("river stone lantern orchard violet harbor meadow copper thistle ember willow falcon "
         "granite cedar marble sparrow canyon glacier saffron quartz maple juniper cobalt "
         "tundra prairie heron basalt lotus cypress amber").split()


def make_text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


# one long prefix every "prefix" request shares (prefix-cache hits); ~130 tokens
SHARED_PREFIX = ("You are a careful archivist. The following catalogue lists objects found in "
                 "an old house, one per line, each with its room and its condition. "
                 + make_text(random.Random(1234), 90) + ". Now continue the catalogue: ")


def build_request(rng):
    """Returns (kind, path, body, expect) for a random well-formed request."""
    chat = rng.random() < 0.4
    stream = rng.random() < 0.5
    flavour = rng.choices(["short", "long", "prefix", "n", "stop"], [3, 1, 2, 2, 1])[0]
    max_tokens = rng.randint(8, 32)
    n = 1
    body = {"model": MODEL_NAME, "max_tokens": max_tokens, "temperature": rng.choice([0.0, 0.7, 1.0]),
            "seed": rng.randint(0, 1 << 30)}
    if flavour == "short":
        text = make_text(rng, rng.randint(2, 12))
    elif flavour == "long":
        text = make_text(rng, rng.randint(120, 200))
    elif flavour == "prefix":
        text = SHARED_PREFIX + make_text(rng, rng.randint(1, 6))
    elif flavour == "n":
        n = rng.randint(2, 3)
        text = make_text(rng, rng.randint(3, 30))
    else:
        text = "Count from one to twenty, separated by commas: one, two, three,"
    if flavour == "stop":
        body["stop"] = rng.choice([[","], ["."], [" four", "\n"]])
        body["temperature"] = 0.0
    else:
        body["ignore_eos"] = True
    body["n"] = n
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = text
        path = "/v1/completions"
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    kind = ("chat" if chat else "cmpl") + "/" + flavour + ("/stream" if stream else "")
    return kind, path, body, {"max_tokens": max_tokens, "n": n, "stop": flavour == "stop", "chat": chat}


def check_choices(kind, finishes, texts, usage, exp, chunks=None):
    """finishes/texts: dict index -> value. Returns error text or None."""
    n, mt = exp["n"], exp["max_tokens"]
    if sorted(finishes) != list(range(n)):
        return f"{kind}: expected choices 0..{n - 1}, got {sorted(finishes)}"
    if usage is None:
        return f"{kind}: no usage"
    ct = usage.get("completion_tokens")
    if not exp["stop"]:
        bad = {i: f for i, f in finishes.items() if f != "length"}
        if bad:
            return f"{kind}: ignore_eos request finished with {bad} instead of length"
        if ct != mt * n:
            return f"{kind}: usage.completion_tokens {ct} != max_tokens {mt} x n {n}"
        if chunks is not None:
            for i, c in chunks.items():
                if c > mt:
                    return f"{kind}: choice {i} streamed {c} content chunks > max_tokens {mt}"
                if c != mt:  # legitimate when a token ends inside a UTF-8 character
                    STATS.inc(STATS.c, "stream_chunk_count_below_tokens")
                    STATS.note(f"{kind}: choice {i} streamed {c} content chunks for {mt} tokens: {texts.get(i)!r}")
    else:
        for i, f in finishes.items():
            if f not in ("stop", "length"):
                return f"{kind}: finish_reason {f!r}"
        if ct is None or ct > mt * n or ct < 1:
            return f"{kind}: usage.completion_tokens {ct} out of range (max_tokens {mt} x n {n})"
        if all(f == "length" for f in finishes.values()) and ct != mt * n:
            return f"{kind}: finished by length but completion_tokens {ct} != {mt * n}"
    return None


def run_nonstream(kind, path, body, exp, timeout=180):
    st, hdr, data = request("POST", path, body, timeout=timeout)
    if st != 200:
        return st, f"{kind}: status {st}: {data[:300]!r}"
    j = json.loads(data)
    finishes, texts = {}, {}
    for ch in j.get("choices", []):
        finishes[ch["index"]] = ch.get("finish_reason")
        texts[ch["index"]] = ch["message"]["content"] if exp["chat"] else ch["text"]
    err = check_choices(kind, finishes, texts, j.get("usage"), exp)
    if not err and exp["stop"]:
        for s in body["stop"]:
            if any(s in (t or "") for t in texts.values()):
                err = f"{kind}: stop string {s!r} appears in the output"
    return st, err


def run_stream(kind, path, body, exp, timeout=180, on_first=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Connection": "close"})
        r = conn.getresponse()
        if r.status != 200:
            data = r.read()
            return r.status, f"{kind}: status {r.status}: {data[:300]!r}"
        finishes, texts, chunks = {}, defaultdict(str), Counter()
        usage, done, first = None, False, True
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            ev = json.loads(payload)
            if "error" in ev:
                STATS.inc(STATS.c, "stream_clean_errors")
                STATS.note(f"{kind}: stream ended with error event {ev['error']}")
                return 200, None
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                i = ch["index"]
                t = (ch.get("delta") or {}).get("content") if exp["chat"] else ch.get("text")
                if t:
                    texts[i] += t
                    chunks[i] += 1
                    if first and on_first:
                        on_first()
                        first = False
                if ch.get("finish_reason"):
                    finishes[i] = ch["finish_reason"]
        if not done:
            return 200, f"{kind}: stream closed without [DONE] (truncated)"
        err = check_choices(kind, finishes, texts, usage, exp, chunks=dict(chunks))
        if not err and exp["stop"]:
            for s in body["stop"]:
                if any(s in t for t in texts.values()):
                    err = f"{kind}: stop string {s!r} appears in the output"
        return 200, err
    finally:
        conn.close()


def do_wellformed(kind, path, body, exp, phase="run", on_first=None):
    t = time.time()
    STATS.inc(STATS.kinds, kind)
    try:
        if body.get("stream"):
            st, err = run_stream(kind, path, body, exp, on_first=on_first)
        else:
            st, err = run_nonstream(kind, path, body, exp)
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
            http.client.IncompleteRead, ConnectionAbortedError) as e:
        STATS.inc(STATS.c, "unexpected_resets")
        STATS.violate(f"{kind} ({phase}): connection reset/closed by server: {type(e).__name__}: {e}")
        return None
    except socket.timeout:
        STATS.inc(STATS.c, "hangs")
        STATS.violate(f"{kind} ({phase}): no answer within the client timeout (hang)")
        return None
    except ConnectionRefusedError:
        STATS.violate(f"{kind} ({phase}): connection refused")
        return None
    except (ValueError, KeyError, TypeError) as e:
        STATS.violate(f"{kind} ({phase}): malformed response: {type(e).__name__}: {e}")
        return None
    STATS.inc(STATS.status, st)
    if st >= 500:
        STATS.inc(STATS.c, "5xx")
        STATS.violate(f"{kind} ({phase}): 5xx: {err}")
    elif err:
        if st == 200:
            STATS.inc(STATS.c, "wrong_results")
        STATS.violate(err)
    else:
        STATS.inc(STATS.kind_ok, kind)
        if body.get("stream"):
            STATS.inc(STATS.c, "streamed_ok")
        with STATS.lock:
            STATS.latencies[kind.split("/")[0]].append(time.time() - t)
    return st


def client_worker(seed):
    rng = random.Random(seed)
    while GATE.enter():
        try:
            kind, path, body, exp = build_request(rng)
            do_wellformed(kind, path, body, exp)
        finally:
            GATE.leave()


# ---------------------------------------------------------------------------------------------
# faults: disconnects


def raw_connect(timeout=30):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    return s


def hard_close(s, rng):
    if rng.random() < 0.5:  # RST instead of FIN
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def http_head(method, path, length, extra=""):
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


DISCONNECT_MODES = ["mid_stream", "after_send", "mid_body", "during_nonstream", "after_head"]


def do_disconnect(rng, mode=None):
    mode = mode or rng.choice(DISCONNECT_MODES)
    kind, path, body, exp = build_request(rng)
    body["max_tokens"] = rng.randint(16, 32)
    body.pop("stop", None)
    if mode == "mid_stream":
        body["stream"] = True
    elif mode == "during_nonstream":
        body.pop("stream", None)
        body.pop("stream_options", None)
    data = json.dumps(body).encode()
    try:
        s = raw_connect()
        if mode == "after_head":
            s.sendall(http_head("POST", path, len(data)))
            time.sleep(rng.uniform(0, 0.3))
        elif mode == "mid_body":
            s.sendall(http_head("POST", path, len(data)) + data[: rng.randint(1, len(data) - 1)])
            time.sleep(rng.uniform(0, 0.3))
        elif mode == "after_send":
            s.sendall(http_head("POST", path, len(data)) + data)
        elif mode == "during_nonstream":
            s.sendall(http_head("POST", path, len(data)) + data)
            time.sleep(rng.uniform(0.05, 1.5))
        elif mode == "mid_stream":
            s.sendall(http_head("POST", path, len(data)) + data)
            want, got, buf = rng.randint(1, 10), 0, b""
            head_seen = False
            while got < want:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
                if not head_seen and b"\r\n\r\n" in buf:
                    head_seen = True
                    status = int(buf.split(b" ", 2)[1])
                    if status != 200:
                        STATS.note(f"disconnect mid_stream: status {status}")
                        if status >= 500:
                            STATS.inc(STATS.c, "5xx")
                            STATS.violate(f"disconnect client got {status}: {buf[:300]!r}")
                        break
                got = buf.count(b"data:")
                if b"[DONE]" in buf:
                    break
        hard_close(s, rng)
        STATS.inc(STATS.disconnects, mode)
    except OSError as e:
        STATS.note(f"disconnect {mode}: {type(e).__name__}: {e}")
        STATS.inc(STATS.disconnects, mode + "_oserror")


def disconnect_worker(seed, rate_s):
    rng = random.Random(seed)
    while GATE.enter():
        try:
            do_disconnect(rng)
        finally:
            GATE.leave()
        time.sleep(rng.uniform(0.3, 2 * rate_s))


# ---------------------------------------------------------------------------------------------
# faults: malformed requests


def malformed_cases(max_body):
    M = MODEL_NAME
    j = lambda o: json.dumps(o).encode()
    return [
        ("bad_json", "POST", "/v1/completions", b'{"model": "%s", "prompt": "hi",' % M.encode()),
        ("bad_json_chat", "POST", "/v1/chat/completions", b'{"model": "%s", "messages": [{"role": "user", "content": "x"}' % M.encode()),
        ("not_object", "POST", "/v1/completions", b"[1, 2, 3]"),
        ("empty_body", "POST", "/v1/completions", b""),
        ("invalid_utf8", "POST", "/v1/completions", b'{"model": "\xff\xfe", "prompt": "a"}'),
        ("max_tokens_string", "POST", "/v1/completions", j({"model": M, "prompt": "a", "max_tokens": "ten"})),
        ("max_tokens_negative", "POST", "/v1/completions", j({"model": M, "prompt": "a", "max_tokens": -3})),
        ("max_tokens_too_big", "POST", "/v1/completions", j({"model": M, "prompt": "a", "max_tokens": 10 ** 7})),
        ("temperature_string", "POST", "/v1/completions", j({"model": M, "prompt": "a", "temperature": "hot"})),
        ("top_p_out_of_range", "POST", "/v1/completions", j({"model": M, "prompt": "a", "top_p": 2.5})),
        ("n_zero", "POST", "/v1/completions", j({"model": M, "prompt": "a", "n": 0})),
        ("stream_not_bool", "POST", "/v1/completions", j({"model": M, "prompt": "a", "stream": "yes"})),
        ("prompt_missing", "POST", "/v1/completions", j({"model": M, "max_tokens": 4})),
        ("prompt_wrong_type", "POST", "/v1/completions", j({"model": M, "prompt": {"a": 1}})),
        ("messages_not_list", "POST", "/v1/chat/completions", j({"model": M, "messages": "hello"})),
        ("messages_bad_role", "POST", "/v1/chat/completions", j({"model": M, "messages": [{"role": "wizard", "content": "x"}]})),
        ("messages_missing", "POST", "/v1/chat/completions", j({"model": M})),
        ("unknown_model", "POST", "/v1/completions", j({"model": "no-such-model", "prompt": "a"})),
        ("stop_wrong_type", "POST", "/v1/completions", j({"model": M, "prompt": "a", "stop": 5})),
        ("unknown_route", "GET", "/v1/nope", None),
        ("unknown_route_post", "POST", "/v2/completions", j({"model": M, "prompt": "a"})),
        ("wrong_method", "GET", "/v1/completions", None),
        ("oversize_body", "POST", "/v1/completions", None),  # built on the fly: max_body + 64 KiB
    ]


def send_malformed(name, method, path, body, max_body, rng):
    """Sends one malformed request over a raw socket; returns (status or None, body, error)."""
    if name == "oversize_body":
        filler = "x" * (max_body + 65536)
        body = json.dumps({"model": MODEL_NAME, "prompt": filler}).encode()
    s = raw_connect(timeout=30)
    try:
        if body is None:
            s.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        else:
            s.sendall(http_head(method, path, len(body), "Connection: close\r\n"))
            try:
                for i in range(0, len(body), 65536):
                    s.sendall(body[i:i + 65536])
            except (BrokenPipeError, ConnectionResetError):
                if name != "oversize_body":
                    raise
                # the server may answer 413 and close before the whole body is sent: read it
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                if b"\r\n\r\n" in buf:
                    break
                raise
            if not chunk:
                break
            buf += chunk
            if b"\r\n\r\n" in buf:
                head, rest = buf.split(b"\r\n\r\n", 1)
                m = re.search(rb"content-length:\s*(\d+)", head, re.I)
                if m and len(rest) >= int(m.group(1)):
                    break
        if not buf:
            return None, b"", "connection closed with no response"
        head, _, rest = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if re.search(rb"transfer-encoding:\s*chunked", head, re.I):
            rest = dechunk(rest)
        return status, rest, None
    finally:
        s.close()


def dechunk(b):
    out = b""
    while b:
        line, _, b = b.partition(b"\r\n")
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        out += b[:n]
        b = b[n + 2:]
    return out


def do_malformed(rng, cases, max_body):
    name, method, path, body = rng.choice(cases)
    try:
        st, data, err = send_malformed(name, method, path, body, max_body, rng)
    except (ConnectionResetError, BrokenPipeError) as e:
        st, data, err = None, b"", f"{type(e).__name__}: {e}"
    except socket.timeout:
        st, data, err = None, b"", "timeout (hang)"
    if st is None:
        STATS.inc(STATS.malformed[name], "reset")
        STATS.violate(f"malformed {name}: no HTTP answer: {err}")
        return
    STATS.inc(STATS.malformed[name], st)
    if not (400 <= st < 500):
        if st >= 500:
            STATS.inc(STATS.c, "5xx")
        STATS.violate(f"malformed {name}: expected a 4xx, got {st}: {data[:200]!r}")
        return
    try:
        j = json.loads(data)
        ok = isinstance(j.get("error"), dict) and isinstance(j["error"].get("message"), str)
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        STATS.violate(f"malformed {name}: {st} without an OpenAI-style error body: {data[:200]!r}")


def malformed_worker(seed, max_body):
    rng = random.Random(seed)
    cases = malformed_cases(max_body)
    # every case at least once, then random ones
    order = list(cases)
    rng.shuffle(order)
    while GATE.enter():
        try:
            if order:
                c = order.pop()
                do_malformed(random.Random(rng.random()), [c], max_body)
            else:
                do_malformed(rng, cases, max_body)
        finally:
            GATE.leave()
        time.sleep(rng.uniform(0.2, 1.5))


# ---------------------------------------------------------------------------------------------
# faults: slow loris


class SlowLoris:
    def __init__(self, header_timeout, max_hold):
        self.header_timeout = header_timeout  # None: the server has no such flag
        self.max_hold = max_hold
        self.results = []  # (closed_by_server, seconds held)
        self.lock = threading.Lock()

    def one(self, rng):
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"X-Padding: " + b"a" * 200 + b"\r\n")
        t = time.time()
        closed_by_server = False
        try:
            s = raw_connect(timeout=2)
        except OSError as e:
            STATS.violate(f"slow-loris: could not connect: {e}")
            return
        s.settimeout(0.05)
        try:
            i = 0
            while time.time() - t < self.max_hold and not GATE.stop:
                try:
                    s.send(head[i % len(head): i % len(head) + 1])
                except (BrokenPipeError, ConnectionResetError):
                    closed_by_server = True
                    break
                i += 1
                try:
                    s.recv(4096)  # EOF or an answer (e.g. 408): either way the server ended it
                    closed_by_server = True
                    break
                except socket.timeout:
                    pass
                except ConnectionResetError:
                    closed_by_server = True
                    break
                time.sleep(rng.uniform(0.3, 0.7))
        finally:
            s.close()
        held = time.time() - t
        with self.lock:
            self.results.append((closed_by_server, round(held, 2)))
        cut_short = GATE.stop and held <= 2 * (self.header_timeout or 0) + 1
        if self.header_timeout is not None and not cut_short:
            if not closed_by_server:
                STATS.violate(f"slow-loris: connection not closed by the server after {held:.1f}s "
                              f"(--http-header-timeout {self.header_timeout})")
            elif held > 2 * self.header_timeout + 1:
                STATS.violate(f"slow-loris: closed only after {held:.1f}s > 2 x {self.header_timeout}s")

    def worker(self, seed, concurrent):
        rng = random.Random(seed)
        threads = []
        while not GATE.stop:
            threads = [t for t in threads if t.is_alive()]
            while len(threads) < concurrent and not GATE.stop:
                th = threading.Thread(target=self.one, args=(random.Random(rng.random()),), daemon=True)
                th.start()
                threads.append(th)
                time.sleep(rng.uniform(0.5, 2))
            time.sleep(0.5)
        for th in threads:
            th.join(5)


# ---------------------------------------------------------------------------------------------
# monitors


class RssSampler:
    def __init__(self, server):
        self.server = server
        self.samples = []  # (t, kib)
        self.quiet = []  # samples taken when the server was idle (after each wave check)
        self.stop = False

    def run(self):
        while not self.stop:
            v = self.server.rss_kib()
            if v:
                self.samples.append((round(time.time() - T0, 1), v))
            time.sleep(1.0)


def wait_quiescent(baseline_kv, timeout):
    """Polls /metrics until running == waiting == 0 and kv usage <= baseline. Returns
    (ok, seconds, last metrics)."""
    t = time.time()
    m = {}
    while time.time() - t < timeout:
        try:
            m = metrics()
        except OSError as e:
            STATS.note(f"/metrics failed: {e}")
            time.sleep(0.5)
            continue
        if (m.get("vllm:num_requests_running", 1) == 0 and m.get("vllm:num_requests_waiting", 1) == 0
                and m.get("vllm:kv_cache_usage_perc", 1) <= baseline_kv + 1e-9):
            return True, time.time() - t, m
        time.sleep(0.25)
    return False, time.time() - t, m


# ---------------------------------------------------------------------------------------------
# drain and restart


def drain_check(server, drain_timeout, rng):
    res = {"inflight": [], "during_drain": Counter(), "exit_code": None, "exit_s": None}
    n_long = 4
    started = threading.Semaphore(0)
    results = [None] * n_long

    def long_req(i):
        stream = i % 2 == 0
        chat = i % 3 == 0
        mt = 96
        body = {"model": MODEL_NAME, "max_tokens": mt, "ignore_eos": True, "temperature": 0.7, "seed": i}
        if chat:
            body["messages"] = [{"role": "user", "content": make_text(rng, 20)}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = make_text(rng, 20)
            path = "/v1/completions"
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        kind = ("chat" if chat else "cmpl") + "/drain" + ("/stream" if stream else "")
        exp = {"max_tokens": mt, "n": 1, "stop": False, "chat": chat}
        me = threading.get_ident()
        before = STATS.by_thread[me]
        if stream:
            st = do_wellformed(kind, path, body, exp, phase="drain", on_first=started.release)
        else:
            started.release()
            st = do_wellformed(kind, path, body, exp, phase="drain")
        results[i] = {"kind": kind, "status": st, "ok": st == 200 and STATS.by_thread[me] == before}

    ths = [threading.Thread(target=long_req, args=(i,)) for i in range(n_long)]
    for th in ths:
        th.start()
    for _ in range(n_long):
        started.acquire(timeout=60)
    # make sure every request is in the engine (running or waiting) before SIGTERM
    end = time.time() + 20
    while time.time() < end:
        m = metrics()
        if m.get("vllm:num_requests_running", 0) + m.get("vllm:num_requests_waiting", 0) >= n_long:
            break
        time.sleep(0.05)
    t_sig = time.time()
    server.proc.send_signal(signal.SIGTERM)
    log("drain: SIGTERM sent with %d long requests in flight" % n_long)
    # The signal is handled asynchronously: a request the server took before it saw SIGTERM
    # is served. New work is what arrives once /health says the server is draining.
    while server.proc.poll() is None and time.time() - t_sig < 10:
        try:
            if request("GET", "/health", timeout=5)[0] == 503:
                break
        except OSError:
            break
        time.sleep(0.01)
    # new requests while draining: 503 (or refused once the listener is closed)
    probe_rng = random.Random(rng.random())
    while server.proc.poll() is None and time.time() - t_sig < drain_timeout + 10:
        body = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 4}
        try:
            st, hdr, data = request("POST", "/v1/completions", body, timeout=10)
            res["during_drain"][str(st)] += 1
            if st != 503:
                STATS.violate(f"drain: a new request during drain got {st} instead of 503: {data[:200]!r}")
            else:
                try:
                    if not isinstance(json.loads(data).get("error"), dict):
                        raise ValueError
                except ValueError:
                    STATS.violate(f"drain: 503 without an OpenAI-style error body: {data[:200]!r}")
        except ConnectionRefusedError:
            res["during_drain"]["refused"] += 1
        except (ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError) as e:
            res["during_drain"]["reset"] += 1
            STATS.note(f"drain: new request reset: {e}")
        except socket.timeout:
            res["during_drain"]["timeout"] += 1
            STATS.violate("drain: a new request during drain hung")
        time.sleep(probe_rng.uniform(0.05, 0.2))
    try:
        server.proc.wait(timeout=max(1, drain_timeout + 10 - (time.time() - t_sig)))
    except subprocess.TimeoutExpired:
        pass
    res["exit_s"] = round(time.time() - t_sig, 2)
    res["exit_code"] = server.proc.poll()
    for th in ths:
        th.join(30)
    res["inflight"] = results
    if res["exit_code"] is None:
        STATS.violate(f"drain: server still running {res['exit_s']}s after SIGTERM (drain timeout {drain_timeout}s)")
        server.kill()
    elif res["exit_code"] != 0:
        STATS.violate(f"drain: server exited with {res['exit_code']} (expected 0)")
    elif res["exit_s"] > drain_timeout + 2:
        STATS.violate(f"drain: exit took {res['exit_s']}s > drain timeout {drain_timeout}s")
    for r in results:
        if not r or not r["ok"]:
            STATS.violate(f"drain: in-flight request did not complete with 200 and full tokens: {r}")
    if res["during_drain"]["reset"]:
        STATS.note(f"drain: {res['during_drain']['reset']} new requests reset during drain")
    res["during_drain"] = dict(res["during_drain"])
    return res


# ---------------------------------------------------------------------------------------------


def main():
    global PORT, MODEL_NAME, VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--wave-interval", type=float, default=15)
    ap.add_argument("--wave-size", type=int, default=10)
    ap.add_argument("--quiesce-timeout", type=float, default=60)
    ap.add_argument("--rss-growth", type=float, default=0.05)
    ap.add_argument("--rss-warmup", type=float, default=None,
                    help="seconds before the RSS baseline (default: a third of --duration, at least 20): "
                         "the allocator's arenas and the tokenizer's caches fill first")
    ap.add_argument("--kv-cache-memory", default="8MiB",
                    help="small, so that preemption happens (8MiB: 22 blocks of 16 tokens on SmolLM2-135M "
                         "in the default f16 cache)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--drain-timeout", type=int, default=30)
    ap.add_argument("--header-timeout", type=float, default=3)
    ap.add_argument("--slowloris", type=int, default=8, help="slow-loris connections held at once")
    ap.add_argument("--json-out")
    ap.add_argument("--log", help="server log file (default: a temp file)")
    ap.add_argument("--server-arg", action="append", default=[], help="extra flag for serve")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    PORT = args.port or free_port()
    MODEL_NAME = os.path.splitext(os.path.basename(args.model))[0]
    max_body = 1 << 20
    log_path = args.log or tempfile.mktemp(prefix="soak-server-", suffix=".log")
    help_text = subprocess.run([args.bin, "serve", "--help"], capture_output=True, text=True).stdout
    has_header_timeout = "--http-header-timeout" in help_text
    extra = ["--kv-cache-memory", args.kv_cache_memory, "--max-num-seqs", str(args.max_num_seqs),
             "--drain-timeout", str(args.drain_timeout), "--max-body-bytes", str(max_body)]
    if has_header_timeout:
        extra += ["--http-header-timeout", str(args.header_timeout)]
    extra += args.server_arg
    server = Server(args.bin, args.model, PORT, extra, log_path)
    log(f"starting {' '.join([args.bin, 'serve'] + extra)} on port {PORT}; log {log_path}")
    try:
        server.start()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    m0 = metrics()
    baseline_kv = m0.get("vllm:kv_cache_usage_perc", 0.0)
    log(f"healthy; baseline kv_cache_usage_perc={baseline_kv} blocks={m0.get('tokenmill_kv_cache_free_blocks')}")

    rss = RssSampler(server)
    threads = [threading.Thread(target=rss.run, daemon=True)]
    for i in range(args.clients):
        threads.append(threading.Thread(target=client_worker, args=(rng.random(),), daemon=True))
    threads.append(threading.Thread(target=disconnect_worker, args=(rng.random(), 2.0), daemon=True))
    threads.append(threading.Thread(target=malformed_worker, args=(rng.random(), max_body), daemon=True))
    loris = SlowLoris(args.header_timeout if has_header_timeout else None,
                      max_hold=(2 * args.header_timeout + 5) if has_header_timeout else 30)
    loris_thread = threading.Thread(target=loris.worker, args=(rng.random(), args.slowloris), daemon=True)
    for th in threads:
        th.start()
    loris_thread.start()

    waves = []
    t_start = time.time()
    next_wave = t_start + args.wave_interval
    wave_rng = random.Random(rng.random())
    health_probes = []
    while time.time() - t_start < args.duration:
        if server.proc.poll() is not None:
            STATS.violate(f"server died with exit code {server.proc.returncode}")
            break
        # probe that the server keeps serving everyone (slow-loris connections are held)
        tp = time.time()
        try:
            st, _, _ = request("GET", "/health", timeout=10)
            health_probes.append(time.time() - tp)
            if st != 200:
                STATS.violate(f"/health answered {st} during the run")
        except OSError as e:
            STATS.violate(f"/health failed during the run: {e}")
        if time.time() >= next_wave:
            w = {"index": len(waves) + 1, "t": round(time.time() - T0, 1)}
            bursts = [threading.Thread(target=do_disconnect,
                                       args=(random.Random(wave_rng.random()),
                                             wave_rng.choice(["mid_stream", "mid_stream", "after_send",
                                                              "during_nonstream", "mid_body"])))
                      for _ in range(args.wave_size)]
            for b in bursts:
                b.start()
            for b in bursts:
                b.join(60)
            left = GATE.pause(timeout=240)
            if left:
                STATS.violate(f"wave {w['index']}: {left} client requests still in flight after 240s")
            ok, secs, m = wait_quiescent(baseline_kv, args.quiesce_timeout)
            w.update(quiesced=ok, quiesce_s=round(secs, 2),
                     running=m.get("vllm:num_requests_running"), waiting=m.get("vllm:num_requests_waiting"),
                     kv=m.get("vllm:kv_cache_usage_perc"), rss_kib=server.rss_kib(),
                     preemptions=m.get("vllm:num_preemptions_total"))
            if ok:
                rss.quiet.append((w["t"], w["rss_kib"]))
            else:
                STATS.violate(f"wave {w['index']}: engine not back to idle within {args.quiesce_timeout}s: "
                              f"running={w['running']} waiting={w['waiting']} kv={w['kv']} (baseline {baseline_kv})")
            waves.append(w)
            log(f"wave {w['index']}: quiesced={ok} in {secs:.1f}s rss={w['rss_kib']} KiB "
                f"preemptions={w['preemptions']} violations so far={STATS.c['violations']}")
            GATE.resume()
            next_wave = time.time() + args.wave_interval
        time.sleep(1.0)

    # end of the run: stop traffic, final idle check
    log("stopping traffic")
    left = GATE.pause(timeout=240)
    if left:
        STATS.violate(f"end: {left} client requests still in flight after 240s")
    ok, secs, m_end = wait_quiescent(baseline_kv, args.quiesce_timeout)
    if not ok:
        STATS.violate(f"end: engine not idle within {args.quiesce_timeout}s: {m_end.get('vllm:num_requests_running')} running")
    else:
        rss.quiet.append((round(time.time() - T0, 1), server.rss_kib()))
    rss.stop = True
    GATE.shutdown()
    loris_thread.join(args.header_timeout * 2 + 40)
    log_text_mid = open(log_path, errors="replace").read()

    for th in threads[1:]:
        th.join(30)

    # drain (the workers are gone; the drain requests do not use the gate)
    drain = {}
    if server.proc.poll() is None:
        log("drain check")
        drain = drain_check(server, args.drain_timeout, random.Random(rng.random()))
        log(f"drain: exit code {drain['exit_code']} after {drain['exit_s']}s; new requests: {drain['during_drain']}")

    # restart
    restart = {"ok": False}
    try:
        server2 = Server(args.bin, args.model, PORT, extra, log_path)
        t = time.time()
        server2.start()
        restart["start_s"] = round(time.time() - t, 2)
        st = do_wellformed("cmpl/restart", "/v1/completions",
                           {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True},
                           {"max_tokens": 8, "n": 1, "stop": False, "chat": False}, phase="restart")
        restart["status"] = st
        restart["ok"] = st == 200
        server2.proc.send_signal(signal.SIGTERM)
        try:
            restart["exit_code"] = server2.proc.wait(timeout=args.drain_timeout + 5)
        except subprocess.TimeoutExpired:
            server2.kill()
            restart["exit_code"] = None
        if restart["exit_code"] != 0:
            STATS.violate(f"restart: idle server exited with {restart['exit_code']} on SIGTERM")
    except RuntimeError as e:
        restart["error"] = str(e)
    if not restart["ok"]:
        STATS.violate(f"restart: the server did not serve again: {restart}")

    # server log: panics
    log_text = open(log_path, errors="replace").read()
    panics = [l for l in log_text.splitlines() if "panicked" in l or "PANIC" in l]
    for p in panics[:5]:
        STATS.violate(f"server log: {p.strip()[:300]}")

    # RSS
    post = [v for (t, v) in rss.samples if not waves or t >= waves[0]["t"]]
    warmup = args.rss_warmup if args.rss_warmup is not None else max(20.0, args.duration / 3)
    quiet = [v for (t, v) in rss.quiet if v and t >= warmup]
    rss_rep = {}
    if rss.samples:
        allv = [v for _, v in rss.samples]
        rss_rep = {"samples": len(allv), "min_kib": min(allv), "max_kib": max(allv),
                   "first_kib": allv[0], "last_kib": allv[-1]}
    if post:
        rss_rep.update(after_warmup_first_kib=post[0], after_warmup_last_kib=post[-1],
                       after_warmup_min_kib=min(post), after_warmup_max_kib=max(post))
    if len(quiet) >= 2:
        growth = (quiet[-1] - quiet[0]) / quiet[0]
        rss_rep.update(idle_samples_kib=quiet, idle_growth=round(growth, 4), warmup_s=warmup)
        if growth > args.rss_growth:
            STATS.violate(f"RSS grew {growth * 100:.1f}% between idle points after the {warmup:.0f} s "
                          f"warm-up ({quiet[0]} -> {quiet[-1]} KiB), over {args.rss_growth * 100:.0f}%")
    else:
        rss_rep["idle_growth"] = None
        STATS.note("RSS: fewer than two idle samples after warm-up; run longer for the RSS check")

    mdelta = lambda k: round(m_end.get(k, 0) - m0.get(k, 0), 3)
    preempt = mdelta("vllm:num_preemptions_total")
    if preempt <= 0:
        STATS.violate("no preemption happened: the KV cache is too large for this traffic")
    lo = loris.results
    report = {
        "duration_s": args.duration,
        "wall_s": round(time.time() - T0, 1),
        "seed": args.seed,
        "clients": args.clients,
        "server": {"cmd": " ".join(server.cmd), "log": log_path, "http_header_timeout_flag": has_header_timeout},
        "requests_by_kind": dict(sorted(STATS.kinds.items())),
        "ok_by_kind": dict(sorted(STATS.kind_ok.items())),
        "statuses": {str(k): v for k, v in sorted(STATS.status.items())},
        "streamed_ok": STATS.c["streamed_ok"],
        "stream_choices_with_fewer_chunks_than_tokens": STATS.c["stream_chunk_count_below_tokens"],
        "stream_clean_errors": STATS.c["stream_clean_errors"],
        "disconnects": dict(STATS.disconnects),
        "malformed": {k: {str(s): n for s, n in v.items()} for k, v in sorted(STATS.malformed.items())},
        "malformed_sent": sum(sum(v.values()) for v in STATS.malformed.values()),
        "slowloris": {"connections": len(lo), "closed_by_server": sum(1 for c, _ in lo if c),
                      "never_closed": sum(1 for c, _ in lo if not c),
                      "max_held_s": max((h for _, h in lo), default=None),
                      "held_s_closed_by_server": sorted(h for c, h in lo if c)[:20]},
        "health_probe_max_s": round(max(health_probes, default=0), 3),
        "waves": waves,
        "metrics_delta": {
            "preemptions": preempt,
            "prefix_cache_queries": mdelta("vllm:prefix_cache_queries_total"),
            "prefix_cache_hits": mdelta("vllm:prefix_cache_hits_total"),
            "prompt_tokens": mdelta("vllm:prompt_tokens_total"),
            "generation_tokens": mdelta("vllm:generation_tokens_total"),
            "finished_length": mdelta("vllm:request_success_total[length]"),
            "finished_stop": mdelta("vllm:request_success_total[stop]"),
            "finished_abort": mdelta("vllm:request_success_total[abort]"),
            "rejected_all_reasons": mdelta("tokenmill_rejected_requests_total"),
        },
        "rss": rss_rep,
        "drain": drain,
        "restart": restart,
        "counters": dict(STATS.c),
        "latency_s": {k: {"n": len(v), "p50": round(sorted(v)[len(v) // 2], 3), "max": round(max(v), 3)}
                      for k, v in STATS.latencies.items() if v},
        "notes": STATS.notes[:50],
        "violations": [f"[{t}s] {m}" for t, m in STATS.violations],
    }
    report["passed"] = not STATS.violations
    print_report(report)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["passed"] else 1


def print_report(r):
    p = lambda *a: print(*a, flush=True)
    p("=" * 78)
    p(f"tokenmill soak report: duration {r['duration_s']}s, wall {r['wall_s']}s, seed {r['seed']}, clients {r['clients']}")
    p(f"server: {r['server']['cmd']}")
    p(f"requests by kind (sent / ok):")
    for k, v in r["requests_by_kind"].items():
        p(f"  {k:28s} {v:5d} / {r['ok_by_kind'].get(k, 0)}")
    p(f"statuses of well-formed requests: {r['statuses']}   streamed ok: {r['streamed_ok']}"
      f"   (stream choices with fewer chunks than tokens: {r['stream_choices_with_fewer_chunks_than_tokens']})")
    p(f"disconnects: {r['disconnects']}")
    p(f"malformed sent: {r['malformed_sent']}")
    for k, v in r["malformed"].items():
        p(f"  {k:24s} {v}")
    s = r["slowloris"]
    p(f"slow-loris: {s['connections']} connections, closed by server {s['closed_by_server']}, "
      f"never closed {s['never_closed']} (header-timeout flag: {r['server']['http_header_timeout_flag']}), "
      f"max held {s['max_held_s']}s; /health max latency during run {r['health_probe_max_s']}s")
    p(f"waves: {len(r['waves'])}")
    for w in r["waves"]:
        p(f"  wave {w['index']:2d} at {w['t']:6.1f}s: idle={w['quiesced']} in {w['quiesce_s']}s "
          f"running={w['running']} waiting={w['waiting']} kv={w['kv']} rss={w['rss_kib']} KiB")
    md = r["metrics_delta"]
    p(f"engine: preemptions {md['preemptions']}, prefix-cache hits {md['prefix_cache_hits']} / "
      f"queries {md['prefix_cache_queries']} tokens, finished length {md['finished_length']} "
      f"stop {md['finished_stop']} abort {md['finished_abort']}, generated {md['generation_tokens']} tokens")
    rs = r["rss"]
    p(f"RSS KiB: min {rs.get('min_kib')} max {rs.get('max_kib')} first {rs.get('first_kib')} last {rs.get('last_kib')}; "
      f"after warm-up first {rs.get('after_warmup_first_kib')} last {rs.get('after_warmup_last_kib')} "
      f"max {rs.get('after_warmup_max_kib')}; idle growth {rs.get('idle_growth')}")
    d = r["drain"]
    if d:
        p(f"drain: exit code {d['exit_code']} after {d['exit_s']}s; in-flight: "
          + ", ".join(f"{x['kind']}={x['status']}{'' if x['ok'] else ' BAD'}" for x in d["inflight"] if x)
          + f"; new requests during drain: {d['during_drain']}")
    p(f"restart: {r['restart']}")
    p(f"latency: {r['latency_s']}")
    if r["notes"]:
        p(f"notes ({len(r['notes'])}):")
        for t, n in r["notes"][:15]:
            p(f"  [{t}s] {n}")
    if r["violations"]:
        p(f"FAILED: {len(r['violations'])} violated assertion(s):")
        for v in r["violations"][:60]:
            p(f"  {v}")
    else:
        p("PASSED: every assertion held")
    p("=" * 78)


if __name__ == "__main__":
    sys.exit(main())
