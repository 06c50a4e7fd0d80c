// A file read by URL with HTTP range requests (fetch: Node 18 and later, browsers).  Each
// response is checked before its bytes are used: a 206 for exactly the range asked, a body of
// exactly that length (read into a buffer sized from the request, never from the response), the
// same total size and validators (ETag, Last-Modified) as the first response, so a file that
// changes between two requests is refused instead of being read half old, half new.  Each read
// has a total deadline (its tries, backoff and body included), so a server that answers slowly
// or drips its body cannot hold a read forever.  Messages show the URL redacted (redact.js).

import { QFormatError, error } from "./errors.js";
import { redactUrl, redactUrlsIn } from "./redact.js";
import { allocate } from "./alloc.js";

/** The first request asks for this much: the 8-byte length and, usually, the whole header. */
export const PROBE_BYTES = 65536;
/** Each read's deadline: this many milliseconds ... */
export const DEADLINE_MS = 60000;
/** ... plus its length at this many bytes a second (Python's rule: 60 s + bytes / 64 KiB/s). */
export const MIN_BYTES_PER_SECOND = 65536;

/**
 * @typedef {object} UrlOptions
 * @property {typeof fetch} [fetch]  the fetch to use (default: globalThis.fetch)
 * @property {number} [retries]  further attempts after a network error or a 5xx (default 3)
 * @property {number} [backoffMs]  the first retry's delay, doubled for each next one (default 200)
 * @property {number} [probeBytes]  the first request's length (default PROBE_BYTES)
 * @property {Record<string,string>} [headers]  extra request headers (authorization, ...); their values are never shown
 * @property {number} [deadlineMs]  each read's deadline is deadlineMs + its length / minBytesPerSecond
 *   (default DEADLINE_MS, 60000; Infinity: none), every try, backoff and the body included; past it
 *   the read fails with REMOTE_UNREACHABLE
 * @property {number} [minBytesPerSecond]  see deadlineMs (default MIN_BYTES_PER_SECOND, 65536)
 * @property {boolean} [showSecrets]  messages show the URL whole (user-info and query); default:
 *   scheme://host[:port]/path and "?..." (redact.js)
 */

/** @param {number} ms */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A read's deadline: `signal` aborts the fetches (and so their bodies) when it passes; `race(p)`
 * settles as `p` does or rejects with the deadline's error, whichever comes first (a fetch that
 * ignores the signal cannot outlive it either).
 * @param {number} ms @param {() => QFormatError} makeError
 */
function deadline(ms, makeError) {
  const ctl = new AbortController();
  /** @type {any} */
  let timer = null;
  const state = { expired: false, error: /** @type {QFormatError|null} */ (null) };
  /** @type {Promise<never>} */
  const passed = new Promise((_, reject) => {
    if (!Number.isFinite(ms)) return;
    timer = setTimeout(() => {
      state.expired = true;
      state.error = makeError();
      reject(state.error);  // first: the race settles with this error, not with the abort's
      ctl.abort();
    }, Math.min(Math.max(0, ms), 2 ** 31 - 1));  // setTimeout fires at once past 2^31 - 1 ms (24.8 days)
  });
  passed.catch(() => {});
  return {
    signal: ctl.signal,
    state,
    /** @template T @param {Promise<T>} p @returns {Promise<T>} */
    race(p) {
      p.catch(() => {});  // the loser's later rejection is not an unhandled one
      return Promise.race([p, passed]);
    },
    done() {
      if (timer !== null) clearTimeout(timer);
    },
  };
}

/** Base64 of the UTF-8 bytes of `text` (btoa takes Latin-1 only). @param {string} text */
function base64Utf8(text) {
  let bin = "";
  for (const b of new TextEncoder().encode(text)) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** @param {string} s */
function decodeComponent(s) {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** @param {Response} res */
function discard(res) {
  // a refused response's body is not read: it may be the whole file
  res.body?.cancel().catch(() => {});
}

/** @param {string|null} v @returns {{a: number, b: number, total: number|null}|null} */
function contentRange(v) {
  const m = /^\s*bytes\s+(\d+)-(\d+)\/(\d+|\*)\s*$/i.exec(v ?? "");
  if (!m) return null;
  return { a: Number(m[1]), b: Number(m[2]), total: m[3] === "*" ? null : Number(m[3]) };
}

/**
 * Read a response body of exactly `want` bytes into a buffer allocated from `want`, within the
 * read's deadline.
 * @param {Response} res @param {number} want @param {string} url @param {ReturnType<typeof deadline>} dl
 */
async function exactBody(res, want, url, dl) {
  const short = (/** @type {number} */ got) => error("REMOTE_RANGE_INVALID", `${url}: expected ${want} bytes in the response, got ${got}`);
  const declared = res.headers.get("content-length");
  if (declared !== null && declared.trim() !== String(want)) {
    discard(res);
    throw error("REMOTE_RANGE_INVALID", `${url}: expected ${want} bytes in the response, its Content-Length is ${declared}`);
  }
  const out = allocate(Uint8Array, want, `bytes of ${url}`);
  if (!res.body) {
    const all = new Uint8Array(await dl.race(res.arrayBuffer()));
    if (all.length !== want) throw short(all.length);
    return all;
  }
  const reader = res.body.getReader();
  let got = 0;
  for (;;) {
    let step;
    try {
      step = await dl.race(reader.read());
    } catch (e) {
      if (dl.state.expired) {
        reader.cancel().catch(() => {});
        throw dl.state.error;
      }
      // the connection closed before Content-Length bytes came
      throw error("REMOTE_RANGE_INVALID", `${url}: the response ended after ${got} of ${want} bytes (${redactUrlsIn(/** @type {Error} */ (e).message)})`);
    }
    const { done, value } = step;
    if (done) break;
    if (got + value.length > want) {
      reader.cancel().catch(() => {});
      throw short(got + value.length);
    }
    out.set(value, got);
    got += value.length;
  }
  if (got !== want) throw short(got);
  return out;
}

/**
 * Open `url` for range reads: the first request fetches its first bytes and learns its size and
 * validators.  Refusals are QFormatErrors: REMOTE_HTTP_ERROR (an error status, 5xx after the retries),
 * REMOTE_RANGE_IGNORED (200 to a range request), REMOTE_RANGE_INVALID (a Content-Range for other
 * bytes, a body of the wrong length),
 * REMOTE_CHANGED (size, ETag or Last-Modified differ from the first response), REMOTE_REDIRECT_REFUSED (a
 * redirect to another origin), REMOTE_UNREACHABLE (the network failed on every try).  The codes are
 * the Python reader's for its remote files (qformat/tables/errors.json); a read past its deadline is
 * REMOTE_UNREACHABLE too.  A URL's user-info (user:password@) is sent as HTTP Basic
 * authorization (unless `headers` has an Authorization), never in the URL fetch sees.
 * @param {string|URL} url @param {UrlOptions} [opts]
 * @returns {Promise<import("./source.js").AsyncByteSource & {url: string, shown: string, requests: number, etag: string|null, lastModified: string|null}>}
 */
export async function urlSource(url, opts = {}) {
  const href = String(url);
  // messages name the URL redacted: user-info and a signed URL's query are credentials
  const shown = opts.showSecrets ? href : redactUrl(href);
  /** a cause's text (from fetch, which may quote the URL) as messages show it */
  const cause = (/** @type {any} */ e) => (opts.showSecrets ? String(e?.message ?? e) : redactUrlsIn(String(e?.message ?? e)));
  let target;
  try {
    target = new URL(href, /** @type {any} */ (globalThis).location?.href);
  } catch {
    throw error("REMOTE_UNREACHABLE", `${shown} is not a URL`);
  }
  if (target.protocol !== "http:" && target.protocol !== "https:") throw error("REMOTE_UNREACHABLE", `${shown}: only http and https URLs are read by range requests`);
  /** @type {Record<string, string>} */
  const auth = {};
  if (target.username || target.password) {
    if (!Object.keys(opts.headers ?? {}).some((k) => k.toLowerCase() === "authorization")) {
      auth.Authorization = `Basic ${base64Utf8(`${decodeComponent(target.username)}:${decodeComponent(target.password)}`)}`;
    }
    target.username = "";
    target.password = "";
  }
  const start = target.href;
  const origin = target.origin;
  const doFetch = opts.fetch ?? globalThis.fetch;
  const retries = opts.retries ?? 3;
  const backoff = opts.backoffMs ?? 200;
  const baseMs = opts.deadlineMs ?? DEADLINE_MS;
  const perByte = 1000 / (opts.minBytesPerSecond ?? MIN_BYTES_PER_SECOND);
  /** @type {{etag: string|null, lastModified: string|null, size: number|null}} */
  const seen = { etag: null, lastModified: null, size: null };

  /**
   * One GET of a range.  Where a redirect is readable (redirect: "manual" in Node, Deno, Bun), one
   * to another origin is refused before that origin is contacted; a browser hides it (an
   * "opaqueredirect" response), so there it is asked again, followed, and refused by the final
   * URL (checkCommon).
   * @param {number} off @param {number} len @param {ReturnType<typeof deadline>} dl
   */
  async function get(off, len, dl) {
    let at = start;
    // no-store: a cached range would hide a change of the file from the validator checks
    const init = (/** @type {RequestRedirect} */ redirect) => ({
      headers: { ...auth, ...opts.headers, Range: `bytes=${off}-${off + len - 1}` },
      cache: /** @type {RequestCache} */ ("no-store"),
      redirect,
      signal: dl.signal,
    });
    for (let hops = 0; ; hops++) {
      const res = await dl.race(doFetch(at, init("manual")));
      if (res.type === "opaqueredirect") return dl.race(doFetch(at, init("follow")));
      if (![301, 302, 303, 307, 308].includes(res.status)) return res;
      discard(res);
      const to = new URL(res.headers.get("location") ?? "", at);
      if (to.origin !== origin) throw error("REMOTE_REDIRECT_REFUSED", `${shown} redirected to another origin (${to.origin}): refused`);
      if (hops >= 5) throw error("REMOTE_HTTP_ERROR", `${shown}: too many redirects`);
      at = to.href;
    }
  }

  /**
   * A read's deadline: deadlineMs plus its length at minBytesPerSecond.
   * @param {number} off @param {number} len
   */
  function readDeadline(off, len) {
    const ms = baseMs + len * perByte;
    let tries = 0;
    const dl = deadline(ms, () => error("REMOTE_UNREACHABLE",
      `${shown}: bytes [${off}, ${off + len}) did not arrive within the read's deadline of ${(ms / 1000).toFixed(1)} s `
      + `(${tries} ${tries === 1 ? "try" : "tries"}; deadlineMs + length / minBytesPerSecond, raise deadlineMs to wait longer)`));
    return Object.assign(dl, { tried: () => tries++ });
  }

  /**
   * In a browser, a failed fetch is a TypeError whether the network failed or the server's answer
   * lacked CORS headers; a no-cors request tells them apart: it resolves (with an opaque answer)
   * only when the server did answer.  Outside a browser there is no CORS: false.
   */
  async function corsRefused() {
    if (typeof document === "undefined") return false;
    try {
      await doFetch(start, { method: "HEAD", mode: "no-cors", cache: "no-store", signal: AbortSignal.timeout(5000) });
      return true;
    } catch {
      return false;
    }
  }

  /**
   * One range request, retried on network errors and 5xx, all within `dl`.
   * @param {number} off @param {number} len @param {ReturnType<typeof readDeadline>} dl
   */
  async function request(off, len, dl) {
    for (let attempt = 0; ; attempt++) {
      let res;
      dl.tried();
      try {
        res = await get(off, len, dl);
      } catch (e) {
        if (dl.state.expired) throw dl.state.error;
        if (e instanceof QFormatError) throw e;
        if (attempt < retries) {
          await dl.race(sleep(backoff * 2 ** attempt));
          continue;
        }
        if (await corsRefused()) {
          throw error("REMOTE_UNREACHABLE", `${shown}: the server answered, but not to this page: a read from another origin needs `
            + "the server to send Access-Control-Allow-Origin and expose Content-Range (CORS); \"qformat serve DIR\" does");
        }
        throw error("REMOTE_UNREACHABLE", `${shown}: ${cause(e)}${e instanceof Error && e.cause ? ` (${cause(e.cause)})` : ""} (after ${retries} retries)`);
      }
      if (res.status >= 500 && attempt < retries) {
        discard(res);
        await dl.race(sleep(backoff * 2 ** attempt));
        continue;
      }
      return res;
    }
  }

  /** @param {Response} res */
  function checkCommon(res) {
    if (res.url && new URL(res.url).origin !== origin) {
      discard(res);
      throw error("REMOTE_REDIRECT_REFUSED", `${shown} redirected to another origin (${new URL(res.url).origin}): refused`);
    }
  }

  /** @param {Response} res @param {number} total */
  function checkSame(res, total) {
    const etag = res.headers.get("etag");
    const lm = res.headers.get("last-modified");
    const what = total !== seen.size ? `its size went from ${seen.size} to ${total} bytes`
      : etag !== seen.etag ? `its ETag went from ${seen.etag} to ${etag}`
      : lm !== seen.lastModified ? `its Last-Modified went from ${seen.lastModified} to ${lm}` : null;
    if (what) {
      discard(res);
      throw error("REMOTE_CHANGED", `${shown} changed while it was read: ${what}`);
    }
  }

  const src = {
    url: href,
    /** the URL as messages show it */
    shown,
    size: 0,
    bytesFetched: 0,
    requests: 0,
    etag: /** @type {string|null} */ (null),
    lastModified: /** @type {string|null} */ (null),
    /** the probe's bytes: the start of the file, already fetched */
    prefix: new Uint8Array(0),
    /** @param {number} off @param {number} len @returns {Promise<Uint8Array>} */
    async read(off, len) {
      if (!(Number.isSafeInteger(off) && Number.isSafeInteger(len) && off >= 0 && len >= 0 && off + len <= src.size)) {
        throw error("SLICE_INVALID", `bytes [${off}, ${off + len}) are not within ${shown} (${src.size} bytes)`);
      }
      if (len === 0) return new Uint8Array(0);
      src.requests++;
      const dl = readDeadline(off, len);
      try {
        const res = /** @type {Response} */ (await request(off, len, dl));
        checkCommon(res);
        if (res.status === 200) {
          // a changed file is the more useful report where the 200 shows one
          if (res.headers.get("etag") !== seen.etag || res.headers.get("last-modified") !== seen.lastModified) checkSame(res, /** @type {number} */ (seen.size));
          discard(res);
          throw error("REMOTE_RANGE_IGNORED", `${shown} answered 200 (the whole file) to a range request: the server does not serve ranges (a folder served with \"qformat serve DIR\" does; python -m http.server does not)`);
        }
        if (res.status !== 206) {
          discard(res);
          throw error("REMOTE_HTTP_ERROR", `${shown}: HTTP ${res.status} for bytes [${off}, ${off + len})`);
        }
        const cr = contentRange(res.headers.get("content-range"));
        const invalid = () => {
          discard(res);
          return error("REMOTE_RANGE_INVALID", `${shown}: asked for bytes ${off}-${off + len - 1}, the response is for ${res.headers.get("content-range")}`);
        };
        if (!cr || cr.total === null) throw invalid();
        checkSame(res, cr.total);
        if (cr.a !== off || cr.b !== off + len - 1) throw invalid();
        const body = await exactBody(res, len, shown, dl);
        src.bytesFetched += len;
        return body;
      } finally {
        dl.done();
      }
    },
  };

  // the probe: the file's first bytes, its size (Content-Range's total) and its validators
  const want = opts.probeBytes ?? PROBE_BYTES;
  src.requests++;
  const dl = readDeadline(0, want);
  try {
    const res = /** @type {Response} */ (await request(0, want, dl));
    checkCommon(res);
    const cr = contentRange(res.headers.get("content-range"));
    if (res.status === 416) {
      // only an empty file cannot satisfy bytes=0-...; its size is in "bytes */0"
      const m = /^\s*bytes\s+\*\/(\d+)\s*$/i.exec(res.headers.get("content-range") ?? "");
      discard(res);
      if (!m || m[1] !== "0") throw error("REMOTE_HTTP_ERROR", `${shown}: HTTP 416 for its first bytes`);
      Object.assign(seen, { etag: res.headers.get("etag"), lastModified: res.headers.get("last-modified"), size: 0 });
    } else if (res.status === 200) {
      discard(res);
      throw error("REMOTE_RANGE_IGNORED", `${shown} answered 200 (the whole file) to a range request: the server does not serve ranges (a folder served with \"qformat serve DIR\" does; python -m http.server does not)`);
    } else if (res.status !== 206) {
      discard(res);
      throw error("REMOTE_HTTP_ERROR", `${shown}: HTTP ${res.status}`);
    } else {
      if (cr && cr.total !== null && !Number.isSafeInteger(cr.total)) {
        // offsets are Numbers: past 2^53 - 1 they are no longer exact
        discard(res);
        throw error("FILE_UNREADABLE", `${shown}: the server gives its size as ${/\/\s*(\d+)/.exec(res.headers.get("content-range") ?? "")?.[1]} bytes, `
          + `past 2^53 - 1 (${Number.MAX_SAFE_INTEGER}), the largest offset this reader addresses exactly`);
      }
      if (!cr || cr.total === null || cr.a !== 0 || cr.b !== Math.min(want, cr.total) - 1) {
        discard(res);
        throw error("REMOTE_RANGE_INVALID", `${shown}: asked for bytes 0-${want - 1}, the response is for ${res.headers.get("content-range")}`);
      }
      Object.assign(seen, { etag: res.headers.get("etag"), lastModified: res.headers.get("last-modified"), size: cr.total });
      src.prefix = await exactBody(res, cr.b + 1, shown, dl);
      src.bytesFetched += cr.b + 1;
    }
  } finally {
    dl.done();
  }
  src.size = /** @type {number} */ (seen.size);
  src.etag = seen.etag;
  src.lastModified = seen.lastModified;
  return src;
}
