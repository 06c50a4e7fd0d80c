// How a URL is shown in messages (the rule qformat.redact follows in Python): scheme://host[:port]/path,
// without user-info (user:password@ is a credential), without the query (a signed URL's ?sig=...,
// ?X-Amz-Signature=..., ?token=... is one too; a literal "?..." says there was a query) and without
// the fragment.  Callers that must show the whole URL ask for it (the showSecrets options).

/**
 * `url` as messages show it: scheme://host[:port]/path, plus "?..." when it had a query.
 * @param {string|URL} url @returns {string}
 */
export function redactUrl(url) {
  const text = String(url);
  let u;
  try {
    u = new URL(text);
  } catch {
    return redactText(text);
  }
  if (u.host === "" && u.protocol !== "file:") return redactText(text);  // an opaque URL (mailto:, data:): nothing of it is shown safely
  return `${u.protocol}//${u.host}${u.pathname}${u.search ? "?..." : ""}`;
}

/**
 * What cannot be parsed as a URL, redacted by its text: the user-info (up to the last '@' before
 * the path) and everything from the first '?' or '#' are left out.
 * @param {string} text
 */
function redactText(text) {
  const q = text.search(/[?#]/);
  let head = q < 0 ? text : text.slice(0, q);
  const scheme = /^(?:[a-z][a-z0-9+.-]*:)?\/\//i.exec(head);
  const from = scheme ? scheme[0].length : 0;
  const slash = head.indexOf("/", from);
  const authorityEnd = slash < 0 ? head.length : slash;
  const at = head.lastIndexOf("@", authorityEnd);
  if (at >= from) head = head.slice(0, from) + head.slice(at + 1);
  return head + (q >= 0 && text[q] === "?" && q + 1 < text.length && text[q + 1] !== "#" ? "?..." : "");
}

const URL_IN_TEXT = /\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>`]+/gi;

/**
 * `text` (a message from fetch or a server) with every URL in it redacted by redactUrl.
 * @param {string} text @returns {string}
 */
export function redactUrlsIn(text) {
  return String(text).replace(URL_IN_TEXT, (m) => {
    // a URL quoted in prose ends before trailing punctuation
    const tail = /[).,;:\]]+$/.exec(m)?.[0] ?? "";
    return redactUrl(m.slice(0, m.length - tail.length)) + tail;
  });
}
