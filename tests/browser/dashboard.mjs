// Drives Debian's chromium headless over the DevTools protocol (Node's built-in WebSocket,
// no npm packages) against a running controller: the job appears on the page, its loss chart
// has points, and the page's stop button stops it.
// Usage: node --experimental-websocket tests/browser/dashboard.mjs BASE_URL JOB_ID
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [base, jobId] = process.argv.slice(2);
if (!base || !jobId) { console.error("usage: dashboard.mjs BASE_URL JOB_ID"); process.exit(2); }
const profile = mkdtempSync(join(tmpdir(), "granary-chromium-"));
const browser = spawn("chromium", [
  "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
  "--disable-dev-shm-usage", `--user-data-dir=${profile}`, "--remote-debugging-port=0",
  "about:blank"], { stdio: ["ignore", "ignore", "pipe"] });
const deadline = Date.now() + 120000;
function done(code, msg) {
  console.log(msg);
  browser.kill("SIGKILL");
  try { rmSync(profile, { recursive: true, force: true }); } catch (e) {}
  process.exit(code);
}
setTimeout(() => done(1, "FAIL: timed out"), 120000).unref();

const wsUrl = await new Promise((resolve, reject) => {
  let err = "";
  browser.stderr.on("data", d => {
    err += d.toString();
    const m = err.match(/DevTools listening on (ws:\/\/\S+)/);
    if (m) resolve(m[1]);
  });
  browser.on("exit", c => reject(new Error("chromium exited " + c + ": " + err)));
});

const ws = new WebSocket(wsUrl);
await new Promise((res, rej) => { ws.onopen = res; ws.onerror = rej; });
let nextId = 1;
const pending = new Map();
ws.onmessage = ev => {
  const m = JSON.parse(ev.data);
  if (m.id && pending.has(m.id)) {
    const { resolve, reject } = pending.get(m.id);
    pending.delete(m.id);
    m.error ? reject(new Error(JSON.stringify(m.error))) : resolve(m.result);
  }
};
function send(method, params = {}, sessionId) {
  const id = nextId++;
  ws.send(JSON.stringify({ id, method, params, sessionId }));
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}

const { targetId } = await send("Target.createTarget", { url: "about:blank" });
const { sessionId } = await send("Target.attachToTarget", { targetId, flatten: true });
await send("Page.enable", {}, sessionId);
await send("Page.navigate", { url: base + "/" }, sessionId);

async function evaluate(expr) {
  const r = await send("Runtime.evaluate", { expression: expr, returnByValue: true,
                                             awaitPromise: true }, sessionId);
  if (r.exceptionDetails) throw new Error(JSON.stringify(r.exceptionDetails));
  return r.result.value;
}
async function waitFor(what, expr) {
  while (Date.now() < deadline) {
    try { const v = await evaluate(expr); if (v) return v; } catch (e) {}
    await new Promise(r => setTimeout(r, 200));
  }
  done(1, "FAIL: " + what);
}

const row = `document.querySelector('tr[data-job-id="${jobId}"]')`;
await waitFor("the job is listed", `${row} !== null`);
const state = await waitFor("the job runs", `(() => { const s = ${row}.querySelector('.state');
  return s && s.textContent.startsWith('running') ? s.textContent : ''; })()`);
console.log("page: job " + jobId + " is " + state);
await evaluate(`${row}.click()`);
const points = await waitFor("the loss chart has two points or more", `(() => {
  const n = Number(document.getElementById('chart-loss').dataset.points || 0);
  return n >= 2 && document.querySelector('#chart-loss polyline') !== null ? n : 0; })()`);
console.log("page: loss chart has " + points + " points");
const shards = await waitFor("the rows-per-shard chart has a line per shard", `(() => {
  const svg = document.getElementById('chart-shard-rows');
  const n = Number(svg.dataset.shards || 0);
  return n >= 1 && svg.querySelectorAll('polyline').length === n ? n : 0; })()`);
console.log("page: rows-per-shard chart has " + shards + " shard line(s)");
await evaluate("window.confirm = () => true");
await waitFor("the stop button is there", `${row}.querySelector('button.stop') !== null`);
await evaluate(`${row}.querySelector('button.stop').click()`);
const final = await waitFor("the page shows the job stopped", `(() => {
  const s = document.querySelector('tr[data-job-id="${jobId}"] .state');
  return s && s.textContent === 'stopped' ? s.textContent : ''; })()`);
done(0, "page: job " + jobId + " is " + final + " after the page's stop button");
