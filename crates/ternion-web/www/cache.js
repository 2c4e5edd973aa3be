// The page's model cache in the origin-private file system (OPFS). Each downloaded file
// is stored as `ternion-<hash of its URL>.bin`; a record `ternion-<hash>.json` ({ url,
// size, time }) is written once the copy is complete, so a half-written file is never
// used. The files survive reloads; listCache() and clearCache() back the page's panel.
// Running out of storage gives a QuotaError whose message names the size needed.

const PREFIX = "ternion-";
const mib = (x) => (x / 1048576).toFixed(1);

/** Not enough browser storage to cache a file (`name` is "QuotaExceeded"). */
export class QuotaError extends Error {
  constructor(message) {
    super(message);
    this.name = "QuotaExceeded";
  }
}

/** True when this browser offers OPFS. */
export function hasOpfs() {
  return !!(navigator.storage && navigator.storage.getDirectory);
}

async function key(url) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url));
  const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
  return PREFIX + hex.slice(0, 32);
}

async function estimate() {
  try { return await navigator.storage.estimate(); } catch (_) { return null; }
}

async function quotaError(url, need) {
  const e = await estimate();
  const room = e && e.quota ? `; ${mib(Math.max(0, e.quota - e.usage))} MiB are free ` +
    `(${mib(e.usage)} MiB used of a ${mib(e.quota)} MiB quota)` : "";
  return new QuotaError(`not enough browser storage to cache ${url}: it needs ` +
    `${need} bytes (${mib(need)} MiB)${room}. Clear the cache, or uncheck "Cache" to load without storing it.`);
}

const isQuota = (e) => e && (e.name === "QuotaExceededError" || e instanceof QuotaError);

// Downloads `url` into the file `name` of `root` with progress; returns the File.
async function download(root, url, name, resp, onProgress) {
  const total = Number(resp.headers.get("Content-Length")) || 0;
  const e = await estimate();
  if (total && e && e.quota && e.usage + total > e.quota) throw await quotaError(url, total);
  const handle = await root.getFileHandle(name + ".bin", { create: true });
  const out = await handle.createWritable();
  const reader = resp.body.getReader();
  let done = 0;
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      await out.write(value);
      done += value.length;
      if (onProgress) onProgress("download", done, total);
    }
    await out.close();
  } catch (err) {
    await out.abort().catch(() => {});
    await root.removeEntry(name + ".bin").catch(() => {});
    if (isQuota(err)) throw await quotaError(url, Math.max(total, done));
    throw err;
  }
  const record = await root.getFileHandle(name + ".json", { create: true });
  const w = await record.createWritable();
  await w.write(JSON.stringify({ url, size: done, time: Date.now() }));
  await w.close();
  return handle.getFile();
}

/**
 * The file at `url`: the OPFS copy when a complete one is there, else downloaded into
 * OPFS first. Resolves to `{ file, cached }`, to `{ file: null }` when `optional` and the
 * server has no such file (404), or to null when this browser has no OPFS.
 */
export async function cachedFile(url, onProgress, optional = false) {
  if (!hasOpfs()) return null;
  const root = await navigator.storage.getDirectory();
  const name = await key(url);
  try {
    await root.getFileHandle(name + ".json");
    return { file: await (await root.getFileHandle(name + ".bin")).getFile(), cached: true };
  } catch (_) { /* not cached yet */ }
  const resp = await fetch(url);
  if (optional && resp.status === 404) return { file: null };
  if (!resp.ok) throw new Error(`${url}: HTTP status ${resp.status}`);
  return { file: await download(root, url, name, resp, onProgress), cached: false };
}

/** The complete cached files: [{ url, size, time }], newest first. */
export async function listCache() {
  if (!hasOpfs()) return [];
  const root = await navigator.storage.getDirectory();
  const out = [];
  for await (const [name, handle] of root.entries()) {
    if (!name.startsWith(PREFIX) || !name.endsWith(".json")) continue;
    try { out.push(JSON.parse(await (await handle.getFile()).text())); } catch (_) { /* skip */ }
  }
  return out.sort((a, b) => b.time - a.time);
}

/** Removes every file this page cached (complete or not); resolves to how many. */
export async function clearCache() {
  if (!hasOpfs()) return 0;
  const root = await navigator.storage.getDirectory();
  const names = [];
  for await (const name of root.keys()) if (name.startsWith(PREFIX)) names.push(name);
  for (const name of names) await root.removeEntry(name);
  return names.length;
}

/** Bytes used and the quota of this origin's storage, when the browser says. */
export { estimate as storageEstimate };
