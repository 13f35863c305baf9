"""An independent OTLP/HTTP receiver for `tokenmill serve --otlp-traces-endpoint` with
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`: a plain HTTP server on the port given,
decoding every `POST /v1/traces` body with OpenTelemetry's own Python protobuf classes
(`opentelemetry-proto` from PyPI), while the official `openai` client sends the requests.

Usage: python test_otlp.py BASE_URL MODEL RECEIVER_PORT

Checks: a chat request sent under a `traceparent` comes back as an `llm_request` span of
that trace with the client's span as parent and vLLM's attributes, tiled by `queue`,
`prefill` and `decode` children; a stream the client abandons ends as an error span
("aborted"); the `tracestate` is carried. Prints one line per test and `N passed, M failed`.
"""

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai import OpenAI
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from harness import main, test

BASE, MODEL, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)

SPANS = []  # (resource attributes, span)
LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        assert self.path == "/v1/traces", self.path
        assert self.headers["Content-Type"] == "application/x-protobuf", self.headers
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        with LOCK:
            for rs in req.resource_spans:
                res = {kv.key: value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    SPANS.extend((res, s) for s in ss.spans)
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", PORT), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()


def attrs(span):
    return {kv.key: value(kv.value) for kv in span.attributes}


def request_spans(request_id, n=1, timeout=60):
    """Waits for `n` `llm_request` spans of `request_id`."""
    t = time.time()
    while True:
        with LOCK:
            got = [(r, s) for r, s in SPANS
                   if s.name == "llm_request" and attrs(s).get("gen_ai.request.id") == request_id]
        if len(got) >= n or time.time() - t > timeout:
            return got
        time.sleep(0.1)


def children(span):
    with LOCK:
        kids = [s for _, s in SPANS if s.parent_span_id == span.span_id]
    return sorted(kids, key=lambda s: s.start_time_unix_nano)


@test
def a_chat_request_continues_the_clients_trace():
    trace_id, parent = "5bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7"
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
        extra_headers={
            "traceparent": f"00-{trace_id}-{parent}-01",
            "tracestate": "vendor=abc",
            "x-request-id": "py-chat",
        },
    )
    got = request_spans("py-chat")
    assert len(got) == 1, got
    res, span = got[0]
    assert res["service.name"] == "tokenmill", res
    assert span.trace_id.hex() == trace_id and span.parent_span_id.hex() == parent
    assert span.trace_state == "vendor=abc", span.trace_state
    assert span.kind == Span.SPAN_KIND_SERVER
    assert span.status.code == Status.STATUS_CODE_OK
    a = attrs(span)
    assert a["gen_ai.response.model"] == MODEL
    assert a["gen_ai.usage.prompt_tokens"] == r.usage.prompt_tokens
    assert a["gen_ai.usage.completion_tokens"] == r.usage.completion_tokens == 6
    assert a["gen_ai.request.temperature"] == 0.0 and a["gen_ai.request.top_p"] == 1.0
    assert a["gen_ai.response.finish_reasons"] == "length"
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"]
    assert a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    kids = children(span)
    assert [k.name for k in kids] == ["queue", "prefill", "decode"], kids
    assert kids[0].start_time_unix_nano == span.start_time_unix_nano
    assert kids[-1].end_time_unix_nano == span.end_time_unix_nano
    for a_, b_ in zip(kids, kids[1:]):
        assert a_.end_time_unix_nano == b_.start_time_unix_nano
    assert all(k.trace_id == span.trace_id for k in kids)
    assert attrs(kids[2])["gen_ai.usage.completion_tokens"] == 6


@test
def an_abandoned_stream_ends_as_an_aborted_span():
    stream = client.completions.create(
        model=MODEL,
        prompt="Count: one, two, three,",
        max_tokens=200,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": "py-abandoned"},
    )
    seen = 0
    for _ in stream:
        seen += 1
        if seen == 3:
            break
    stream.close()  # the connection goes; the server aborts the request
    got = request_spans("py-abandoned")
    assert len(got) == 1, got
    _, span = got[0]
    assert span.parent_span_id == b"", "no traceparent came: a root span"
    assert span.status.code == Status.STATUS_CODE_ERROR, span.status
    assert span.status.message == "aborted", span.status
    a = attrs(span)
    assert "gen_ai.response.finish_reasons" not in a
    assert 0 < a["gen_ai.usage.completion_tokens"] < 200, a


main()
