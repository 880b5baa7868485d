// The chat page in Debian's headless Chromium, driven by playwright-core: load `/`, pick the
// model, send a message and watch the answer grow token by token (with its speed shown), stop
// a long answer and see the server free its sequence, keep the API key, the conversation and
// the sampling settings across reloads (until "New chat"), send the temperature, sampling
// settings and system prompt set on the page, render markdown and highlight code with nothing
// of a model's HTML left to run, fetch nothing from anywhere but the server (the libraries
// are vendored), show an error, and save a screenshot to bench/out/chat-page.png. Run by
// scripts/server-tests.sh (SMELT_BASE_URL set).
import assert from "node:assert/strict";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const base = process.env.SMELT_BASE_URL;
if (!base) throw new Error("SMELT_BASE_URL is not set: run scripts/server-tests.sh");
const executablePath = process.env.SMELT_CHROMIUM || "/usr/bin/chromium";
const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const screenshot = join(root, "bench/out/chat-page.png");

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function metric(name) {
  const text = await (await fetch(base + "/metrics")).text();
  const lines = text.split("\n").filter((l) => l.startsWith(name + "{") || l.startsWith(name + " "));
  assert.ok(lines.length > 0, `/metrics has no ${name}`);
  return lines.reduce((sum, l) => sum + Number(l.trim().split(/\s+/).pop()), 0);
}

async function waitFor(what, pred, ms) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await pred()) return;
    await sleep(100);
  }
  assert.fail(`timed out after ${ms} ms waiting for ${what}`);
}

/** Polls the last assistant answer until the status line leaves "generating…"; returns the
 * distinct lengths seen, in order. */
async function watchAnswer(page, stopAfterChars) {
  const answer = page.locator("li.assistant .content").last();
  const lengths = [];
  const deadline = Date.now() + 240_000;
  for (;;) {
    assert.ok(Date.now() < deadline, "the answer did not finish within 240 s");
    // The answer as streamed (its markdown rendering may shrink while a `**` is still open).
    const text = (await answer.getAttribute("data-raw")) ?? "";
    if (lengths.length === 0 || lengths[lengths.length - 1] !== text.length) lengths.push(text.length);
    if (stopAfterChars !== undefined && text.length >= stopAfterChars) return lengths;
    const status = (await page.locator("#status").textContent()) ?? "";
    if (!status.startsWith("generating")) return lengths;
    await sleep(30);
  }
}

const userDataDir = mkdtempSync(join(tmpdir(), "smelt-chromium-"));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
  viewport: { width: 1000, height: 760 },
});
let failed = false;
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  // Every request the page makes, to show it needs nothing outside the server (no CDN).
  const fetched = [];
  context.on("request", (r) => fetched.push(r.url()));

  await page.goto(base + "/");
  assert.equal(await page.title(), "smelt chat");

  // The picker lists exactly the models of /v1/models.
  const models = (await (await fetch(base + "/v1/models")).json()).data.map((m) => m.id);
  assert.ok(models.length > 0, "the server lists no model");
  await waitFor("the model picker", async () => (await page.locator("#model option").count()) === models.length, 10_000);
  assert.deepEqual(await page.locator("#model option").evaluateAll((os) => os.map((o) => o.value)), models);
  await page.selectOption("#model", models[0]);

  // 1. A message streams in: the answer is seen at several growing lengths before it ends.
  // Sampling runs at the server's default temperature, so bound each answer's length.
  await page.fill("#max-tokens", "48");
  await page.fill("#prompt", "Write two sentences about the ocean.");
  await page.click("#send");
  await waitFor("the user turn", async () => (await page.locator("li.user").count()) === 1, 5_000);
  assert.equal(await page.locator("#stop").isEnabled(), true, "Stop is not enabled while generating");
  const lengths = await watchAnswer(page);
  const status = await page.locator("#status").textContent();
  assert.match(status, /^done \((stop|length), \d+ tokens, [\d.]+ tok\/s\)$/, `status after the answer: ${status}`);
  const grew = lengths.filter((n) => n > 0);
  assert.ok(grew.length >= 3, `the answer did not appear piece by piece; lengths seen: ${lengths}`);
  for (let i = 1; i < lengths.length; i++) assert.ok(lengths[i] > lengths[i - 1], `text shrank: ${lengths}`);
  assert.equal(await page.locator("#error").isVisible(), false);
  const firstAnswer = await page.locator("li.assistant .content").last().textContent();
  assert.ok(firstAnswer.trim().length > 0, "empty answer");
  console.log(`streamed answer seen at ${grew.length} lengths: ${JSON.stringify(firstAnswer.slice(0, 80))}…`);

  // 2. Stop a long answer: the page ends the fetch and the server frees the sequence.
  await page.fill("#max-tokens", "3000");
  await page.fill("#prompt", "Now write a very long story about a dragon and a lighthouse, at least two thousand words.");
  await page.click("#send");
  await watchAnswer(page, 40);
  assert.ok((await metric("smelt_running_sequences")) >= 1, "the long answer is not running on the server");
  await page.click("#stop");
  await waitFor("status 'stopped'", async () => (await page.locator("#status").textContent()) === "stopped", 10_000);
  assert.equal(await page.locator("#send").isEnabled(), true);
  const stoppedAt = (await page.locator("li.assistant .content").last().textContent()).length;
  await sleep(500);
  assert.equal((await page.locator("li.assistant .content").last().textContent()).length, stoppedAt, "text grew after Stop");
  await waitFor("running sequences to drop to 0 after Stop", async () => (await metric("smelt_running_sequences")) === 0, 15_000);
  assert.equal(await page.locator("li.turn").count(), 4, "the conversation should hold 2 user and 2 assistant turns");

  await page.fill("#prompt", "Thanks!");
  mkdirSync(dirname(screenshot), { recursive: true });
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`screenshot: ${screenshot}`);

  // 3. The API key is kept in localStorage and sent as a Bearer token.
  await page.fill("#api-key", "e2e-key");
  await page.dispatchEvent("#api-key", "change");
  await page.reload();
  assert.equal(await page.inputValue("#api-key"), "e2e-key");
  await waitFor("the model picker after reload", async () => (await page.locator("#model option").count()) === models.length, 10_000);
  // The conversation is kept in the browser: the two exchanges above are back.
  assert.equal(await page.locator("li.turn").count(), 4, "the conversation was not kept across the reload");
  assert.equal(await page.locator("li.assistant .content").first().textContent(), firstAnswer, "the kept first answer differs");
  // Settings, sampling ones included, set on the page reach the request.
  await page.fill("#max-tokens", "8");
  await page.fill("#temperature", "0");
  await page.click("#settings summary");
  await page.fill("#system-prompt", "Answer in French.");
  await page.fill("#top-p", "0.9");
  await page.fill("#top-k", "40");
  await page.fill("#seed", "42");
  for (const id of ["#max-tokens", "#temperature", "#system-prompt", "#top-p", "#top-k", "#seed"]) {
    await page.dispatchEvent(id, "change");
  }
  const sent = page.waitForRequest((r) => r.url().endsWith("/v1/chat/completions"));
  await page.fill("#prompt", "Hi");
  await page.click("#send");
  const request = await sent;
  assert.equal(request.headers()["authorization"], "Bearer e2e-key");
  const body = JSON.parse(request.postData());
  assert.equal(body.temperature, 0);
  assert.equal(body.top_p, 0.9);
  assert.equal(body.top_k, 40);
  assert.equal(body.seed, 42);
  assert.equal(body.min_p, undefined, "an empty setting is left to the server");
  assert.deepEqual(body.messages[0], { role: "system", content: "Answer in French." });
  assert.equal(body.messages.filter((m) => m.role === "system").length, 1);
  // The kept turns went with it: system, 2 x (user, assistant), the new question.
  assert.equal(body.messages.length, 6, JSON.stringify(body.messages));
  await watchAnswer(page);
  await page.fill("#api-key", "");
  await page.dispatchEvent("#api-key", "change");
  assert.equal(await page.evaluate(() => localStorage.getItem("smelt.apiKey")), null);
  // A reload keeps the settings and all three exchanges; "New chat" forgets the conversation
  // (not the settings), also across a reload.
  await page.reload();
  assert.equal(await page.locator("li.turn").count(), 6);
  assert.equal(await page.inputValue("#temperature"), "0");
  assert.equal(await page.inputValue("#seed"), "42");
  assert.equal(await page.inputValue("#system-prompt"), "Answer in French.");
  await page.click("#clear");
  await page.reload();
  assert.equal(await page.locator("li.turn").count(), 0, "New chat did not forget the conversation");
  assert.equal(await page.evaluate(() => localStorage.getItem("smelt.conversation")), null);
  assert.equal(await page.inputValue("#seed"), "42");
  await waitFor("the model picker after New chat", async () => (await page.locator("#model option").count()) === models.length, 10_000);

  // 4. Markdown renders as HTML, code is highlighted (highlight.js), and a model's HTML
  // cannot run (DOMPurify), in a code block neither.
  const html = await page.evaluate(() => {
    const d = document.createElement("div");
    renderMarkdown(d, "**bold** and `code`\n\n```rust\nfn main() { let x = \"hi\"; }\n```\n\n" +
      "```html\n<script>alert(3)</script>\n```\n\n<img src=x onerror=alert(1)><script>alert(2)</script>");
    return d.innerHTML;
  });
  assert.match(html, /<strong>bold<\/strong>/);
  assert.match(html, /<code>code<\/code>/);
  assert.match(html, /<pre><code class="language-rust hljs"/, html);
  assert.match(html, /<span class="hljs-keyword">fn<\/span>/, html);
  assert.match(html, /<span class="hljs-string">"hi"<\/span>/, html);
  assert.match(html, /&lt;script&gt;|hljs-tag">&lt;/, html);
  assert.doesNotMatch(html, /onerror|<script/i, html);
  // Highlighted code has colour of its own.
  const keywordColour = await page.evaluate(() => {
    const d = document.createElement("div");
    d.className = "content";
    const li = document.createElement("li");
    li.className = "turn assistant";
    li.append(d);
    document.getElementById("conversation").append(li);
    renderMarkdown(d, "```rust\nfn f() {}\n```");
    const colour = getComputedStyle(d.querySelector(".hljs-keyword")).color;
    const plain = getComputedStyle(d.querySelector("code")).color;
    li.remove();
    return [colour, plain];
  });
  assert.notEqual(keywordColour[0], keywordColour[1], "keywords are not coloured");

  // 5. Errors are shown: a prompt longer than the server's context answers 400.
  await page.fill("#prompt", "word ".repeat(6000));
  await page.click("#send");
  await waitFor("the error line", () => page.locator("#error").isVisible(), 30_000);
  assert.match(await page.locator("#error").textContent(), /^HTTP 400: /);
  assert.equal(await page.locator("#send").isEnabled(), true);

  assert.deepEqual(pageErrors, [], "JavaScript errors on the page");
  const outside = fetched.filter((u) => !u.startsWith(base + "/"));
  assert.deepEqual(outside, [], "the page fetched something from outside the server");
  for (const lib of ["/vendor/marked.js", "/vendor/purify.js", "/vendor/highlight.js"]) {
    assert.ok(fetched.includes(base + lib), `${lib} was not loaded from the server: ${fetched}`);
  }
  console.log("chat page: all checks passed");
} catch (err) {
  failed = true;
  console.error("chat page test FAILED:", err);
  try {
    const page = context.pages()[0];
    console.error("page state:", await page.evaluate(() => ({
      status: document.getElementById("status").textContent,
      error: document.getElementById("error").textContent,
      model: document.getElementById("model").value,
      turns: [...document.querySelectorAll("li.turn")].map((li) => li.textContent.slice(0, 60)),
    })));
  } catch (_) {
    // The page itself is gone; the error above says why.
  }
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
