// A file read by URL with HTTP range requests (fetch: Node 18 and later, browsers).  Each
// response is checked before its bytes are used: a 206 for exactly the range asked, a body of
// exactly that length (read into a buffer sized from the request, never from the response), the
// same total size and validators (ETag, Last-Modified) as the first response, so a file that
// changes between two requests is refused instead of being read half old, half new.

import { QFormatError, error } from "./errors.js";

/** The first request asks for this much: the 8-byte length and, usually, the whole header. */
export const PROBE_BYTES = 65536;

/**
 * @typedef {object} UrlOptions
 * @property {typeof fetch} [fetch]  the fetch to use (default: globalThis.fetch)
 * @property {number} [retries]  further attempts after a network error or a 5xx (default 3)
 * @property {number} [backoffMs]  the first retry's delay, doubled for each next one (default 200)
 * @property {number} [probeBytes]  the first request's length (default PROBE_BYTES)
 * @property {Record<string,string>} [headers]  extra request headers (authorization, ...)
 */

/** @param {number} ms */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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
 * Read a response body of exactly `want` bytes into a buffer allocated from `want`.
 * @param {Response} res @param {number} want @param {string} url
 */
async function exactBody(res, want, url) {
  const short = (/** @type {number} */ got) => error("REMOTE_RANGE_INVALID", `${url}: expected ${want} bytes in the response, got ${got}`);
  const declared = res.headers.get("content-length");
  if (declared !== null && declared.trim() !== String(want)) {
    discard(res);
    throw error("REMOTE_RANGE_INVALID", `${url}: expected ${want} bytes in the response, its Content-Length is ${declared}`);
  }
  const out = new Uint8Array(want);
  if (!res.body) {
    const all = new Uint8Array(await res.arrayBuffer());
    if (all.length !== want) throw short(all.length);
    return all;
  }
  const reader = res.body.getReader();
  let got = 0;
  for (;;) {
    let step;
    try {
      step = await reader.read();
    } catch (e) {  // the connection closed before Content-Length bytes came
      throw error("REMOTE_RANGE_INVALID", `${url}: the response ended after ${got} of ${want} bytes (${/** @type {Error} */ (e).message})`);
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
 * the Python reader's for its remote files (qformat/tables/errors.json).
 * @param {string|URL} url @param {UrlOptions} [opts]
 * @returns {Promise<import("./source.js").AsyncByteSource & {url: string, requests: number, etag: string|null, lastModified: string|null}>}
 */
export async function urlSource(url, opts = {}) {
  const href = String(url);
  // messages name the URL without its query (a signed URL's query is a credential)
  const shown = href.split(/[?#]/)[0];
  const origin = new URL(href, /** @type {any} */ (globalThis).location?.href).origin;
  const doFetch = opts.fetch ?? globalThis.fetch;
  const retries = opts.retries ?? 3;
  const backoff = opts.backoffMs ?? 200;
  /** @type {{etag: string|null, lastModified: string|null, size: number|null}} */
  const seen = { etag: null, lastModified: null, size: null };

  /**
   * One GET of a range.  Where a redirect is readable (redirect: "manual" in Node, Deno, Bun), one
   * to another origin is refused before that origin is contacted; a browser hides it (an
   * "opaqueredirect" response), so there it is asked again, followed, and refused by the final
   * URL (checkCommon).
   * @param {number} off @param {number} len
   */
  async function get(off, len) {
    let at = href;
    // no-store: a cached range would hide a change of the file from the validator checks
    const init = (/** @type {RequestRedirect} */ redirect) => ({ headers: { ...opts.headers, Range: `bytes=${off}-${off + len - 1}` }, cache: /** @type {RequestCache} */ ("no-store"), redirect });
    for (let hops = 0; ; hops++) {
      const res = await doFetch(at, init("manual"));
      if (res.type === "opaqueredirect") return doFetch(at, init("follow"));
      if (![301, 302, 303, 307, 308].includes(res.status)) return res;
      discard(res);
      const to = new URL(res.headers.get("location") ?? "", at);
      if (to.origin !== origin) throw error("REMOTE_REDIRECT_REFUSED", `${shown} redirected to another origin (${to.origin}): refused`);
      if (hops >= 5) throw error("REMOTE_HTTP_ERROR", `${shown}: too many redirects`);
      at = to.href;
    }
  }

  /** One range request, retried on network errors and 5xx. @param {number} off @param {number} len */
  async function request(off, len) {
    for (let attempt = 0; ; attempt++) {
      let res;
      try {
        res = await get(off, len);
      } catch (e) {
        if (e instanceof QFormatError) throw e;
        if (attempt < retries) {
          await sleep(backoff * 2 ** attempt);
          continue;
        }
        throw error("REMOTE_UNREACHABLE", `${shown}: ${/** @type {Error} */ (e).message} (after ${retries} retries)`);
      }
      if (res.status >= 500 && attempt < retries) {
        discard(res);
        await sleep(backoff * 2 ** attempt);
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
      const res = /** @type {Response} */ (await request(off, len));
      checkCommon(res);
      if (res.status === 200) {
        // a changed file is the more useful report where the 200 shows one
        if (res.headers.get("etag") !== seen.etag || res.headers.get("last-modified") !== seen.lastModified) checkSame(res, /** @type {number} */ (seen.size));
        discard(res);
        throw error("REMOTE_RANGE_IGNORED", `${shown} answered 200 (the whole file) to a range request: the server does not serve ranges`);
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
      const body = await exactBody(res, len, shown);
      src.bytesFetched += len;
      return body;
    },
  };

  // the probe: the file's first bytes, its size (Content-Range's total) and its validators
  const want = opts.probeBytes ?? PROBE_BYTES;
  src.requests++;
  const res = /** @type {Response} */ (await request(0, want));
  checkCommon(res);
  const cr = contentRange(res.headers.get("content-range"));
  if (res.status === 416) {
    // only an empty file cannot satisfy bytes=0-...; its size is in "bytes */0"
    const m = /^\s*bytes\s+\*\/(\d+)\s*$/i.exec(res.headers.get("content-range") ?? "");
    discard(res);
    if (!m || m[1] !== "0") throw error("REMOTE_HTTP_ERROR", `${shown}: HTTP 416 for its first bytes`);
    Object.assign(seen, { etag: res.headers.get("etag"), lastModified: res.headers.get("last-modified"), size: Number(m[1]) });
  } else if (res.status === 200) {
    discard(res);
    throw error("REMOTE_RANGE_IGNORED", `${shown} answered 200 (the whole file) to a range request: the server does not serve ranges`);
  } else if (res.status !== 206) {
    discard(res);
    throw error("REMOTE_HTTP_ERROR", `${shown}: HTTP ${res.status}`);
  } else {
    if (!cr || cr.total === null || !Number.isSafeInteger(cr.total) || cr.a !== 0 || cr.b !== Math.min(want, cr.total) - 1) {
      discard(res);
      throw error("REMOTE_RANGE_INVALID", `${shown}: asked for bytes 0-${want - 1}, the response is for ${res.headers.get("content-range")}`);
    }
    Object.assign(seen, { etag: res.headers.get("etag"), lastModified: res.headers.get("last-modified"), size: cr.total });
    src.prefix = await exactBody(res, cr.b + 1, shown);
    src.bytesFetched += cr.b + 1;
  }
  src.size = /** @type {number} */ (seen.size);
  src.etag = seen.etag;
  src.lastModified = seen.lastModified;
  return src;
}
