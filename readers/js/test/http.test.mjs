// The range source (src/http.js) and the lazy path (src/lazy.js) against a loopback HTTP server
// that serves ranges and misbehaves on request: each refusal with its code.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { openFile, openUrl, openBlob, openBytesAsync, checkAsync, urlSource, bufferSource, check, encodeSafetensors } from "../src/index.js";

/** A file of `n` float32 tensors t0..t{n-1} of 4 values each (plain safetensors). */
function plainFile(n) {
  const t = [];
  for (let i = 0; i < n; i++) t.push([`t${i}`, { dtype: "float32", shape: [4], data: Float32Array.of(i, i + 0.5, -i, 1 / (i + 1)) }]);
  return encodeSafetensors(t);
}

/**
 * A server of one file.  `state.faults` changes how it answers; it counts requests and the most
 * that were in flight at once.
 */
async function serve(bytes) {
  const state = { bytes, etag: '"v1"', faults: {}, requests: 0, inFlight: 0, maxInFlight: 0, ranges: [] };
  const server = createServer(async (req, res) => {
    const f = state.faults;
    const k = state.requests++;
    state.inFlight++;
    state.maxInFlight = Math.max(state.maxInFlight, state.inFlight);
    try {
      if (f.delayMs) await new Promise((r) => setTimeout(r, f.delayMs));
      if (f.dropFirst && k < f.dropFirst) return req.socket.destroy();
      if (f.status && (f.statusFirst === undefined || k < f.statusFirst)) {
        res.writeHead(f.status);
        return res.end("no");
      }
      if (f.redirectTo && req.url === "/f.safetensors") {  // other paths serve the file: a same-origin target
        res.writeHead(302, { Location: f.redirectTo });
        return res.end();
      }
      const etag = f.changeAfter !== undefined && k >= f.changeAfter ? '"v2"' : state.etag;
      const m = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "");
      if (!m || f.ignoreRange) {
        res.writeHead(200, { "Content-Length": state.bytes.length, ETag: etag });
        return res.end(state.bytes);
      }
      const a = Number(m[1]);
      const b = Math.min(Number(m[2]), state.bytes.length - 1);
      state.ranges.push([a, b + 1]);
      let body = state.bytes.subarray(a, b + 1);
      if (f.shortBy) body = body.subarray(0, body.length - f.shortBy);
      if (f.extra) body = Uint8Array.from([...body, ...new Uint8Array(f.extra)]);
      // chunked: no Content-Length, so only counting the body finds a wrong length
      res.writeHead(206, { "Content-Range": `bytes ${a}-${b}/${state.bytes.length}`, ...(f.chunked ? {} : { "Content-Length": body.length }), ETag: etag });
      res.end(body);
    } finally {
      state.inFlight--;
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  state.url = `http://127.0.0.1:${server.address().port}/f.safetensors`;
  servers.push(server);
  return state;
}
const servers = [];
after(() => servers.forEach((s) => {
  s.closeAllConnections?.();  // Node 18 keeps idle keep-alive sockets open past close()
  s.close();
}));

const codeOf = async (p) => {
  try {
    await p;
    return "ok";
  } catch (e) {
    return e.code ?? String(e);
  }
};
const FAST = { retries: 2, backoffMs: 5 };

test("a URL reads the same tensors as the bytes, fetching only the header and the ranges asked for", async () => {
  const bytes = plainFile(40);
  const s = await serve(bytes);
  const f = await openUrl(s.url, { ...FAST, probeBytes: 16 });
  const ref = openFile(bytes);
  assert.deepEqual(f.keys(), ref.keys());
  const header = f.bytesFetched;
  assert.equal(header, ref.header.dataStart);  // probe of 16, then the rest of the header
  assert.deepEqual((await f.getTensor("t7")).data, ref.getTensor("t7").data);
  assert.equal(f.bytesFetched, header + 16);
  assert.deepEqual((await f.getSlice("t9", [1, 3])).data, ref.getSlice("t9", [1, 3]).data);
  assert.equal(f.bytesFetched, header + 32, "the header and the two tensors' 16 bytes each, nothing else");
});

test("adjacent tensors are fetched in one request; separate ones with bounded parallelism", async () => {
  const bytes = plainFile(40);
  const s = await serve(bytes);
  const f = await openUrl(s.url, { ...FAST, probeBytes: 16 });
  const ref = openFile(bytes);
  let before = s.requests;
  await f.fetchTensors(["t1", "t2", "t3"]);  // stored one after another
  assert.equal(s.requests - before, 1);
  s.faults = { delayMs: 30 };
  before = s.requests;
  const apart = Array.from({ length: 12 }, (_, i) => `t${10 + 2 * i}`);  // every other tensor: 12 ranges
  await f.fetchTensors(apart);
  assert.equal(s.requests - before, 12);
  assert.ok(s.maxInFlight <= 4 && s.maxInFlight >= 2, `max in flight ${s.maxInFlight}`);
  for (const n of apart) assert.deepEqual((await f.getTensor(n)).data, ref.getTensor(n).data);
  assert.equal(s.requests - before, 12, "fetched tensors are not fetched again");
});

test("the refusals of the range source, each with its code", async () => {
  const bytes = plainFile(4);
  const s = await serve(bytes);
  s.faults = { ignoreRange: true };
  assert.equal(await codeOf(openUrl(s.url, FAST)), "REMOTE_RANGE_IGNORED");
  s.faults = { shortBy: 3 };
  assert.equal(await codeOf(openUrl(s.url, FAST)), "REMOTE_RANGE_INVALID");
  s.faults = { status: 404 };
  const n = s.requests;
  assert.equal(await codeOf(openUrl(s.url, FAST)), "REMOTE_HTTP_ERROR");
  assert.equal(s.requests - n, 1, "a 404 is not retried");
  s.faults = { status: 503 };
  assert.equal(await codeOf(openUrl(s.url, FAST)), "REMOTE_HTTP_ERROR");
  // the file changes (a new ETag) after it was opened: the next read is refused
  s.faults = {};
  const f = await openUrl(s.url, { ...FAST, probeBytes: 8 });
  s.faults = { changeAfter: 0 };
  assert.equal(await codeOf(f.getTensor("t1")), "REMOTE_CHANGED");
  // a range answered short after the open
  s.faults = {};
  const g = await openUrl(s.url, { ...FAST, probeBytes: 8 });
  s.faults = { shortBy: 1 };
  assert.equal(await codeOf(g.getTensor("t2")), "REMOTE_RANGE_INVALID");
  s.faults = { ignoreRange: true };
  assert.equal(await codeOf(g.getTensor("t2")), "REMOTE_RANGE_IGNORED");
  for (const faults of [{ chunked: true, shortBy: 2 }, { chunked: true, extra: 3 }, { extra: 1 }]) {
    s.faults = faults;
    assert.equal(await codeOf(g.getTensor("t3")), "REMOTE_RANGE_INVALID", JSON.stringify(faults));
  }
  s.faults = {};
  assert.deepEqual((await g.getTensor("t3")).data, openFile(bytes).getTensor("t3").data);
  // a signed URL's query is a credential: messages leave it out
  s.faults = { status: 403 };
  const e = await openUrl(s.url + "?token=SECRET", FAST).catch((x) => x);
  assert.equal(e.code, "REMOTE_HTTP_ERROR");
  assert.ok(!e.message.includes("SECRET") && e.message.includes("f.safetensors"), e.message);
});

test("network errors and 5xx are retried with backoff", async () => {
  const bytes = plainFile(3);
  const s = await serve(bytes);
  s.faults = { dropFirst: 2 };
  const f = await openUrl(s.url, FAST);
  assert.deepEqual((await f.getTensor("t2")).data, openFile(bytes).getTensor("t2").data);
  const s2 = await serve(bytes);
  s2.faults = { status: 502, statusFirst: 2 };
  assert.deepEqual((await openUrl(s2.url, FAST)).keys(), ["t0", "t1", "t2"]);
  const s3 = await serve(bytes);
  s3.faults = { dropFirst: 100 };
  assert.equal(await codeOf(openUrl(s3.url, FAST)), "REMOTE_UNREACHABLE");
  assert.equal(s3.requests, 3, "one try and two retries");
});

test("a redirect to another origin is refused", async () => {
  const bytes = plainFile(2);
  const other = await serve(bytes);
  const s = await serve(bytes);
  s.faults = { redirectTo: other.url.replace("127.0.0.1", "localhost") };
  assert.equal(await codeOf(openUrl(s.url, FAST)), "REMOTE_REDIRECT_REFUSED");
  s.faults = { redirectTo: other.url };  // another port is another origin too
  assert.equal(await codeOf(openUrl(s.url, FAST)), "REMOTE_REDIRECT_REFUSED");
  assert.equal(other.requests, 0, "the other origin is never contacted");
  s.faults = { redirectTo: s.url.replace("/f.safetensors", "/moved.safetensors") };  // same origin: followed
  const f = await openUrl(s.url, { ...FAST, probeBytes: 8 });
  assert.deepEqual((await f.getTensor("t1")).data, openFile(bytes).getTensor("t1").data);
});

test("an oversized header length is refused before anything more is fetched", async () => {
  const bytes = new Uint8Array(1 << 20);
  new DataView(bytes.buffer).setBigUint64(0, 1n << 40n, true);
  const s = await serve(bytes);
  const src = await urlSource(s.url, { ...FAST, probeBytes: 8 });
  assert.equal(await codeOf(checkAsync(src).then((p) => { throw p[0]; })), "HEADER_TOO_LARGE");
  assert.equal(src.bytesFetched, 8);
  assert.equal(s.requests, 1);
});

test("check through the lazy path reports what check(bytes) reports", async () => {
  const bytes = plainFile(3);
  const bad = bytes.slice(0, bytes.length - 2);  // DATA_TRUNCATED
  for (const b of [bytes, bad, new Uint8Array(3)]) {
    const want = check(b).map((e) => e.code);
    assert.deepEqual((await checkAsync(bufferSource(b))).map((e) => e.code), want);
    const s = await serve(b);
    assert.deepEqual((await checkAsync(await urlSource(s.url, FAST))).map((e) => e.code), want);
  }
  assert.deepEqual(check(bad).map((e) => e.code), ["DATA_TRUNCATED"]);
});

test("a Blob is read lazily by Blob.slice", async () => {
  const bytes = plainFile(30);
  const f = await openBlob(new Blob([bytes]));
  const ref = openFile(bytes);
  assert.deepEqual((await f.getTensor("t3")).data, ref.getTensor("t3").data);
  assert.equal(f.bytesFetched, ref.header.dataStart + 16);
  const g = await openBytesAsync(bytes);
  assert.deepEqual([...(await g.loadAll()).keys()], [...ref.loadAll().keys()]);
  assert.equal(await codeOf(g.getTensor("nope")), "TENSOR_NOT_FOUND");
});
