// Hostile URLs and servers (issue 40): URLs shown redacted, every read within a deadline, sizes
// past what an array (or a Number) holds refused with a code before anything is fetched.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { encodeSafetensors, openFile, openUrl, urlSource, redactUrl, redactUrlsIn, DEADLINE_MS, MIN_BYTES_PER_SECOND, MAX_ARRAY_LENGTH } from "../src/index.js";
import { cmpCodePoints } from "../src/errors.js";
import { rawFile } from "./helpers.mjs";

const servers = [];
after(() => servers.forEach((s) => {
  s.closeAllConnections?.();
  s.close();
}));

/**
 * A server of a file that exists only as its header: bytes past the header are zeros made on
 * request, so the file may claim any size.  `state.total` overrides the size Content-Range
 * gives; `state.dripMs` sends the body one byte per that many ms; `state.drop` closes every
 * connection unanswered; it records each request's range and Authorization header.
 */
async function serveHeader(head, size) {
  const state = { head, size, total: null, dripMs: 0, drop: false, status: 0, requests: [] };
  const server = createServer((req, res) => {
    state.requests.push({ range: req.headers.range ?? null, authorization: req.headers.authorization ?? null });
    if (state.drop) return req.socket.destroy();
    if (state.status) {
      res.writeHead(state.status);
      return res.end();
    }
    const m = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "");
    const a = Number(m[1]);
    const b = Math.min(Number(m[2]), state.size - 1);
    const body = new Uint8Array(b + 1 - a);
    if (a < state.head.length) body.set(state.head.subarray(a, b + 1));
    res.writeHead(206, { "Content-Range": `bytes ${a}-${b}/${state.total ?? state.size}`, "Content-Length": body.length });
    if (!state.dripMs) return res.end(body);
    let i = 0;
    const t = setInterval(() => {
      if (i >= body.length) {
        clearInterval(t);
        return res.end();
      }
      res.write(body.subarray(i, ++i));
    }, state.dripMs);
    res.on("close", () => clearInterval(t));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  state.base = `127.0.0.1:${server.address().port}`;
  servers.push(server);
  return state;
}

const small = () => encodeSafetensors([["w", { dtype: "float32", shape: [4], data: Float32Array.of(1, 2, 3, 4) }]]);
const failure = async (p) => p.then(() => null, (e) => e);
const FAST = { retries: 1, backoffMs: 5 };

test("redactUrl: scheme://host[:port]/path, no user-info, '?...' for a query, no fragment", () => {
  const cases = [
    ["https://alice:s3cret@example.org:8443/models/m.safetensors?sig=ABC&se=1#frag", "https://example.org:8443/models/m.safetensors?..."],
    ["http://user@host/a", "http://host/a"],
    ["https://bucket.s3.amazonaws.com/k/m.safetensors?X-Amz-Signature=DEAD&X-Amz-Credential=AKIA", "https://bucket.s3.amazonaws.com/k/m.safetensors?..."],
    ["http://127.0.0.1:9/x?token=T", "http://127.0.0.1:9/x?..."],
    ["http://[::1]:8080/p#only-a-fragment", "http://[::1]:8080/p"],
    ["https://example.org/plain", "https://example.org/plain"],
    ["https://example.org/empty-query?", "https://example.org/empty-query"],
    ["not a url:pw@x?token=T", "x?..."],
    ["m.safetensors?token=T", "m.safetensors?..."],
    ["//user:pw@host/p?q", "//host/p?..."],
  ];
  for (const [url, shown] of cases) assert.equal(redactUrl(url), shown, url);
  assert.equal(redactUrlsIn("fetch of http://a:b@h/p?sig=S failed (see https://x.org/y?t=1)."), "fetch of http://h/p?... failed (see https://x.org/y?...).");
});

test("messages name a URL redacted; user-info goes as Basic authorization, never in the URL fetched; showSecrets shows it whole", async () => {
  const s = await serveHeader(small(), small().length);
  s.status = 403;
  for (const secret of ["sig=SIGSECRET", "X-Amz-Signature=AMZSECRET&X-Amz-Credential=AKIASECRET", "token=TOKSECRET"]) {
    const url = `http://alice:PWSECRET@${s.base}/m.safetensors?${secret}#FRAGSECRET`;
    const e = await failure(openUrl(url, { ...FAST, headers: { "X-Other": "HEADERSECRET" } }));
    assert.equal(e.code, "REMOTE_HTTP_ERROR");
    assert.ok(e.message.includes(`http://${s.base}/m.safetensors?...`), e.message);
    assert.doesNotMatch(e.message, /SECRET|alice/, e.message);
  }
  assert.equal(s.requests.at(-1).authorization, `Basic ${Buffer.from("alice:PWSECRET").toString("base64")}`);
  // an explicit Authorization header wins over the URL's user-info, and is never shown either
  const e = await failure(openUrl(`http://bob:x@${s.base}/m.safetensors`, { ...FAST, headers: { Authorization: "Bearer BEARERSECRET" } }));
  assert.equal(s.requests.at(-1).authorization, "Bearer BEARERSECRET");
  assert.doesNotMatch(e.message, /SECRET|bob/);
  const whole = await failure(openUrl(`http://alice:PW@${s.base}/m.safetensors?sig=S`, { ...FAST, showSecrets: true }));
  assert.ok(whole.message.includes(`http://alice:PW@${s.base}/m.safetensors?sig=S`), whole.message);
  // a network failure's own text (fetch quotes URLs in some) is redacted too
  s.status = 0;
  s.drop = true;
  const down = await failure(openUrl(`http://alice:PWSECRET@${s.base}/m.safetensors?token=TOKSECRET`, FAST));
  assert.equal(down.code, "REMOTE_UNREACHABLE");
  assert.doesNotMatch(down.message, /SECRET|alice/, down.message);
});

test("a read has a total deadline: a dripping body, and retries with their backoff, end in REMOTE_UNREACHABLE", async () => {
  assert.equal(DEADLINE_MS, 60000);
  assert.equal(MIN_BYTES_PER_SECOND, 65536);
  const bytes = small();
  const s = await serveHeader(bytes, bytes.length);
  s.dripMs = 1000;  // a byte a second: the probe's few bytes would take a minute and more
  let t = Date.now();
  let e = await failure(urlSource(`http://${s.base}/m.safetensors?sig=S`, { ...FAST, deadlineMs: 300 }));
  assert.equal(e?.code, "REMOTE_UNREACHABLE");
  assert.match(e.message, /deadline of 1\.3 s/, e.message);  // 300 ms + 65536 bytes at 65536 bytes/s
  assert.ok(Date.now() - t < 20000, `${Date.now() - t} ms`);
  // the deadline counts every retry and backoff: 1000 retries of a dropped connection stop at it
  s.dripMs = 0;
  s.drop = true;
  const before = s.requests.length;
  t = Date.now();
  e = await failure(urlSource(`http://${s.base}/m.safetensors`, { retries: 1000, backoffMs: 100, deadlineMs: 800, minBytesPerSecond: 1e12 }));
  assert.equal(e?.code, "REMOTE_UNREACHABLE");
  assert.match(e.message, /deadline of 0\.8 s \(\d+ tries/, e.message);
  assert.ok(s.requests.length - before < 20 && Date.now() - t < 20000);
  // a fetch that ignores the abort signal cannot outlive the deadline either
  const never = () => new Promise(() => {});
  e = await failure(urlSource("http://example.invalid/m.safetensors", { fetch: never, deadlineMs: 200, minBytesPerSecond: 1e12 }));
  assert.equal(e?.code, "REMOTE_UNREACHABLE");
  // reads after the open have their own deadline, sized by their length
  s.drop = false;
  const src = await urlSource(`http://${s.base}/m.safetensors`, { ...FAST, deadlineMs: 300, probeBytes: 8 });
  s.dripMs = 1000;
  e = await failure(src.read(8, 16));
  assert.equal(e?.code, "REMOTE_UNREACHABLE");
});

test("a file past 2^53 bytes, or a tensor past what an array holds, is refused with a code before it is fetched", async () => {
  // the server claims 2^60 bytes: offsets are Numbers, exact below 2^53 only
  const bytes = small();
  const s = await serveHeader(bytes, bytes.length);
  s.total = 2n ** 60n;
  let e = await failure(openUrl(`http://${s.base}/huge.safetensors`, FAST));
  assert.equal(e?.code, "FILE_UNREADABLE");
  assert.match(e.message, /1152921504606846976 bytes, past 2\^53/);
  // a file of 2^53 - 1 bytes whose header declares a tensor of nearly all of them
  const n = Number.MAX_SAFE_INTEGER - 8 - 160;  // bytes after the header (its padded length below is 160)
  const head = rawFile(JSON.stringify({ small: { dtype: "F32", shape: [1], data_offsets: [0, 4] }, big: { dtype: "U8", shape: [n - 4], data_offsets: [4, n] } }).padEnd(160));
  assert.equal(head.length, 168);
  const t = await serveHeader(head, Number.MAX_SAFE_INTEGER);
  const f = await openUrl(`http://${t.base}/big.safetensors`, FAST);
  const fetched = t.requests.length;
  e = await failure(f.getTensor("big"));
  assert.equal(e?.code, "SHAPE_UNREPRESENTABLE");
  assert.equal(e.tensor, "big");
  assert.equal(t.requests.length, fetched, "nothing was fetched for the refused tensor");
  assert.deepEqual([...(await f.getTensor("small")).data], [0, 0, 0, 0]);
  // maxArrayLength: a caller's own bound, applied the same way (here below the platform's)
  const g = await openUrl(`http://${t.base}/big.safetensors`, { ...FAST, maxArrayLength: 2 });
  e = await failure(g.getTensor("small"));
  assert.equal(e?.code, "SHAPE_UNREPRESENTABLE");
  assert.ok(MAX_ARRAY_LENGTH >= 2 ** 31);
});

test("headers whose offsets or sizes pass 2^53 get container codes, not RangeErrors", () => {
  const codeOf = (text) => {  // header text: JSON.stringify would round the integers
    try {
      openFile(rawFile(text));
      return "ok";
    } catch (e) {
      return e.code ?? `${e.constructor.name}: ${e.message}`;
    }
  };
  const entry = (dtype, shape, a, b) => `{"t":{"dtype":"${dtype}","shape":[${shape}],"data_offsets":[${a},${b}]}}`;
  assert.equal(codeOf(entry("U8", 2n ** 60n, 0, 2n ** 60n)), "DATA_TRUNCATED");
  assert.equal(codeOf(entry("F32", 2n ** 58n, 0, 2n ** 60n)), "DATA_TRUNCATED");
  assert.equal(codeOf(entry("U8", 9007199254740993n, 0, 9007199254740993n)), "DATA_TRUNCATED");  // 2^53 + 1: not a Number
  assert.equal(codeOf(entry("U8", 4, 2n ** 60n, 2n ** 60n + 4n)), "OFFSETS_INVALID");
  assert.equal(codeOf(entry("F64", 2n ** 62n, 0, 2n ** 64n)), "SIZE_OVERFLOW");
});

test("cmpCodePoints orders by code point as the iterator comparison does, surrogates included", () => {
  const reference = (a, b) => {
    const x = [...a].map((c) => c.codePointAt(0));
    const y = [...b].map((c) => c.codePointAt(0));
    for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    return Math.sign(x.length - y.length);
  };
  const units = [0x41, 0x7a, 0xd7ff, 0xd800, 0xdbff, 0xdc00, 0xdfff, 0xe000, 0xfffd, 0xffff];
  let seed = 7;
  const rnd = (n) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const word = () => String.fromCharCode(...Array.from({ length: rnd(5) }, () => units[rnd(units.length)]));
  for (let k = 0; k < 100000; k++) {
    const a = word();
    const b = word();
    assert.equal(cmpCodePoints(a, b), reference(a, b), JSON.stringify([a, b]));
  }
});
