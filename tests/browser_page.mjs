// Opens one page in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core)
// and prints, as one JSON line, what the page logged and which errors it raised, once it has
// logged `expect` lines or `timeout` ms have passed.  Used by tests/browser.py.
//   node browser_page.mjs PLAYWRIGHT_DIR URL EXPECT TIMEOUT_MS [SCREENSHOT.png]
import { createRequire } from "node:module";
import { join } from "node:path";

const [dir, url, expect, timeout, shot] = process.argv.slice(2);
const { chromium } = createRequire(join(dir, "noop.js"))("playwright-core");
// The flags this machine needs: no sandbox as root, and no background networking (the closed
// network would refuse each of Chromium's own connections).
const browser = await chromium.launch({
  executablePath: process.env.QFORMAT_CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const out = { console: [], errors: [] };
try {
  const page = await browser.newPage();
  page.on("console", (m) => out.console.push(m.text()));
  page.on("pageerror", (e) => out.errors.push(String(e)));
  await page.goto(url);
  const until = Date.now() + Number(timeout);
  while (out.console.length < Number(expect) && out.errors.length === 0 && Date.now() < until) await page.waitForTimeout(50);
  if (shot) await page.screenshot({ path: shot, fullPage: true });
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
