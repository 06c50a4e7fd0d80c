// Drives readers/js/web/index.html in headless Chromium (playwright-core) through one session
// of use and prints, as one JSON line, what the page showed at each step; screenshots go to
// SHOTS.  Used by tests/test_web_page.py.
//   node web_page.mjs PLAYWRIGHT_DIR PAGE_URL PLAN.json SHOTS_DIR
// PLAN: {a: URL of a qformat file, b: URL of a file with the same tensors, tensor: a tensor of a
//        to select, picked: path of a local file to open with the picker, truncated: URL,
//        dropped: path of a local file dropped (drag and drop) on slot B, gguf: path of a GGUF file,
//        redirected: URL redirecting to another origin, nocors: URL of a server that sends no CORS
//        headers; only: "a" stops after opening a and showing plan.tensor (a run that counts bytes)}
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const [dir, pageUrl, planPath, shots] = process.argv.slice(2);
const plan = JSON.parse(readFileSync(planPath, "utf8"));
const { chromium } = createRequire(join(dir, "noop.js"))("playwright-core");
const browser = await chromium.launch({
  executablePath: process.env.QFORMAT_CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const out = { errors: [], console: [], steps: {} };
const T = 30000;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.on("console", (m) => out.console.push(m.text()));
  page.on("pageerror", (e) => out.errors.push(String(e)));
  await page.goto(pageUrl);

  const state = () => page.evaluate(() => ({
    rows: [...document.querySelectorAll("#tensors tbody tr")].map((tr) => [...tr.children].map((td) => td.textContent)),
    problems: [...document.querySelectorAll("#problems li")].map((li) => ({ code: li.dataset.code ?? "", text: li.textContent })),
    statusA: document.querySelector("#slot-a .status").textContent,
    statusB: document.querySelector("#slot-b .status").textContent,
  }));
  /** Open `url` in `slot` by its URL field and wait until its table and check are shown. */
  const openUrl = async (slot, url) => {
    await page.fill(`#slot-${slot} form.url input`, url);
    await page.click(`#slot-${slot} form.url button`);
    await page.waitForSelector(`#slot-${slot}[data-state=done]`, { timeout: T });
    await page.waitForSelector("#problems[data-state=done]", { timeout: T });
  };

  // 0. which decoder the page loaded (libqformat as WebAssembly, or the JavaScript fallback)
  // (set once the module has loaded: the page's top-level await may finish after the load event)
  await page.waitForSelector("html[data-decoder]", { state: "attached", timeout: T });
  out.decoder = await page.evaluate(() => document.documentElement.dataset.decoder ?? null);

  // 1. a qformat checkpoint by URL: its table and check; one tensor selected: descriptor and histogram
  await openUrl("a", plan.a);
  await page.click(`#tensors tbody tr[data-name="${plan.tensor}"]`);
  await page.waitForSelector("#histogram[data-state=done]", { timeout: T });
  out.steps.a = {
    ...(await state()),
    descriptor: await page.textContent("#descriptor"),
    bars: await page.$$eval("#histogram svg rect.bar", (rs) => rs.map((r) => Number(r.dataset.count))),
    note: await page.textContent("#histogram-note"),
  };
  await page.screenshot({ path: join(shots, "1-table-histogram.png"), fullPage: true });
  if (plan.only === "a") throw new Error("stop");

  // 1b. the full check, on request (it reads every byte)
  await page.click("#run-check");
  await page.waitForSelector("#problems.ok[data-state=done] li:text('check passes')", { timeout: T });
  out.steps.checked = await state();

  // 2. a second file by URL: the SQNR chart of B against A
  await openUrl("b", plan.b);
  await page.waitForSelector("#sqnr[data-state=done]", { timeout: T });
  out.steps.b = {
    ...(await state()),
    sqnr: await page.$$eval("#sqnr svg rect.bar", (rs) => rs.map((r) => [r.dataset.label, r.dataset.value, Number(r.getAttribute("width"))])),
  };
  await page.screenshot({ path: join(shots, "2-sqnr.png"), fullPage: true });

  // 3. a local file by the file picker (read through Blob.slice): a refused tensor, check's code
  await page.setInputFiles("#slot-a .picker", plan.picked);
  await page.waitForSelector("#slot-a[data-state=done]", { timeout: T });
  await page.waitForSelector("#problems[data-state=done]", { timeout: T });
  out.steps.picked = await state();
  await page.screenshot({ path: join(shots, "3-picked-corrupt.png"), fullPage: true });

  // 4. a truncated file by URL: refused when opened, the code shown as check's problem
  await openUrl("a", plan.truncated);
  out.steps.truncated = await state();
  await page.screenshot({ path: join(shots, "4-truncated.png"), fullPage: true });

  // 5. a file dropped on slot B (a DataTransfer holding a File, as a drag from the desktop)
  const dt = await page.evaluateHandle((b64) => {
    const d = new DataTransfer();
    d.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], "dropped.safetensors"));
    return d;
  }, readFileSync(plan.dropped).toString("base64"));
  await page.dispatchEvent("#slot-b .drop", "drop", { dataTransfer: dt });
  await page.waitForSelector("#slot-b[data-state=done]", { timeout: T });
  await page.waitForSelector("#problems[data-state=done]", { timeout: T });
  out.steps.dropped = await state();

  // 6. a GGUF file by the picker: its tensors listed from its header, check's NOT_SAFETENSORS
  await page.setInputFiles("#slot-a .picker", plan.gguf);
  await page.waitForSelector("#slot-a[data-state=done]", { timeout: T });
  await page.waitForSelector("#problems[data-state=done]", { timeout: T });
  out.steps.gguf = await state();
  await page.screenshot({ path: join(shots, "5-gguf.png"), fullPage: true });

  // 7. a URL that redirects to another origin: refused, the code shown as check's problem
  await openUrl("b", plan.redirected);
  out.steps.redirected = await state();
  // how many tensors the WebAssembly path decoded for the histogram and the SQNR chart
  out.wasm = await page.evaluate(async () => (await import(new URL("../src/index.js", location.href).href)).wasmInfo());

  // 8. a relative URL (resolved against the page; the field is text, not type=url) and a server
  // without CORS headers: told apart from a network failure
  await openUrl("b", "no-such-file.safetensors");
  out.steps.relative = await state();
  await openUrl("b", plan.nocors);
  out.steps.nocors = await state();

  // 9. ?a=...&b=...: both slots open, and the SQNR chart compares them
  const both = new URL(pageUrl);
  both.searchParams.set("a", plan.a);
  both.searchParams.set("b", plan.b);
  await page.goto(both.href);
  await page.waitForSelector("#slot-a[data-state=done]", { timeout: T });
  await page.waitForSelector("#slot-b[data-state=done]", { timeout: T });
  await page.waitForSelector("#sqnr[data-state=done]", { timeout: T });
  out.steps.query = { ...(await state()), sqnr: await page.$$eval("#sqnr svg rect.bar", (rs) => rs.map((r) => r.dataset.label)) };
} catch (e) {
  if (!(plan.only && e instanceof Error && e.message === "stop")) out.errors.push(`driver: ${e && e.stack ? e.stack : e}`);
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
