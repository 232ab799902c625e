import { mkdirSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { type Engine, type EngineEnv, type EngineName, engineExec, engineMessage } from "../docker/engine.ts";
import { inspectImage } from "../docker/image.ts";
import { type ImageEntry, listImageRecords, type RecordPaths, readRecord, recordPaths } from "../docker/inventory.ts";
import { liveLeases } from "../core/lease.ts";
import { isLocked, type Release, tryLock } from "../core/lock.ts";
import type { GcEntry, GcSource, RemoveOutcome, SkipReason } from "./types.ts";

/**
 * Container images in gpulayer's inventory (images-v1/), offered to the gc
 * policy beside the environments, by the same last use.
 *
 * One entry per engine and local image id: references that name the same
 * image (`img:1` and `img@sha256:...`) are one image on disk, counted and
 * removed together. Only images gpulayer's own pull brought onto the machine
 * (`pulledByGpulayer` in a record of the image) are counted or removed; the
 * others are reported, never touched. Removal goes through the engine's own
 * `rmi` of the references gpulayer pulled (never `prune`, never `-f`, never
 * a name someone else gave the image), so the engine itself refuses an image
 * a container uses, and keeps one that another name still holds.
 *
 * Listing never calls the engine: gc over a cache that needs no trimming, or
 * has no images, costs no engine call. The engine is asked only about
 * images the policy reaches.
 */
/** `env`: the engine CLI's environment. */
export function imageSource(layout: HomeLayout, env: EngineEnv): GcSource {
  return { kind: "image", list: async () => listImageEntries(layout, new Engines(env)) };
}

interface Rec {
  entry: ImageEntry;
  paths: RecordPaths;
}

/** The engines of one gc run: found once, and given up on for the run once one fails to answer. */
class Engines {
  private down = new Map<EngineName, SkipReason>();
  constructor(readonly env: EngineEnv) {}

  get(name: EngineName): Engine | SkipReason {
    const down = this.down.get(name);
    if (down) return down;
    const bin = Bun.which(name, { PATH: this.env.PATH ?? "" });
    if (!bin) return this.fail(name, "not installed (not found on PATH)");
    return { name, bin };
  }

  fail(name: EngineName, why: string): SkipReason {
    const reason: SkipReason = { code: "engine", message: `engine not available (${name}: ${why})` };
    this.down.set(name, reason);
    return reason;
  }
}

const isReason = (x: Engine | SkipReason): x is SkipReason => "code" in x;
const hex = (imageId: string) => imageId.replace(/^sha256:/, "");

function listImageEntries(layout: HomeLayout, engines: Engines): GcEntry[] {
  const groups = new Map<string, Rec[]>();
  for (const entry of listImageRecords(layout)) {
    const paths = recordPaths(layout, entry.engine, entry.ref);
    if (paths.id !== entry.id) continue; // not a record gpulayer wrote under this name
    const key = `${entry.engine}\0${entry.imageId}`;
    groups.set(key, [...(groups.get(key) ?? []), { entry, paths }]);
  }
  return [...groups.values()].map((recs) => imageEntry(layout, engines, recs));
}

function imageEntry(layout: HomeLayout, engines: Engines, recs: Rec[]): GcEntry {
  const first = recs[0]!.entry;
  const refs = recs.map((r) => r.entry.ref).sort();
  const lastUsedMs = Math.max(0, ...recs.map((r) => (r.entry.lastUsed ? Date.parse(r.entry.lastUsed) : 0)));
  const created = recs.map((r) => Date.parse(r.entry.firstSeen)).filter((ms) => Number.isFinite(ms));
  const ours = recs.some((r) => r.entry.pulledByGpulayer);
  const facts = { engine: first.engine, imageId: first.imageId, sizeBytes: Math.max(...recs.map((r) => r.entry.sizeBytes)) };
  return {
    kind: "image",
    id: first.imageId,
    state: "ready",
    sizeBytes: facts.sizeBytes,
    lastUsedMs,
    createdMs: created.length ? Math.min(...created) : lastUsedMs,
    summary: refs.join(", "),
    names: refs,
    image: { engine: first.engine, refs, digest: first.digest },
    excluded: ours ? undefined : { code: "not-pulled", message: "not pulled by gpulayer" },
    inUse: () => inUse(layout, engines, recs, facts),
    remove: () => removeImage(layout, engines, recs, facts),
  };
}

interface Facts {
  engine: EngineName;
  imageId: string;
  sizeBytes: number;
}

function leaseHolders(layout: HomeLayout, recs: Rec[]): string[] {
  return recs.flatMap((r) => liveLeases(layout, "image", r.paths.id));
}

const leased = (holders: string[], late = false): SkipReason => ({ code: "leased", message: `in use by ${holders.join(", ")}${late ? " (leased while gc was removing it; put back)" : ""}` });

/**
 * Containers started from the image (`ps -a --filter ancestor=ID`: also
 * those of images built on it), running or stopped: the engine refuses to
 * remove an image any of them uses. A failing `ps` means the engine does not
 * answer; it is not asked again in this run.
 */
async function containerReason(engines: Engines, facts: Facts): Promise<SkipReason | null> {
  const engine = engines.get(facts.engine);
  if (isReason(engine)) return engine;
  const r = await engineExec(engine, ["ps", "-a", "--filter", `ancestor=${hex(facts.imageId)}`, "--format", "{{.Names}}\t{{.Status}}"], { env: engines.env, timeoutMs: 30_000 });
  if (r.code !== 0) return engines.fail(facts.engine, engineMessage(`${r.stderr}\n${r.stdout}`) || `ps exited ${r.code}`);
  const containers = r.stdout
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const [name, status = ""] = l.split("\t");
      return { name: name!, running: /^up\b/i.test(status.trim()) };
    });
  if (!containers.length) return null;
  const running = containers.filter((c) => c.running);
  const pick = running.length ? running : containers;
  const names = pick.slice(0, 3).map((c) => c.name).join(", ") + (pick.length > 3 ? ` and ${pick.length - 3} more` : "");
  return { code: "container", message: running.length ? `used by running container ${names}` : `used by stopped container ${names} (remove it to free the image)` };
}

async function inUse(layout: HomeLayout, engines: Engines, recs: Rec[], facts: Facts): Promise<SkipReason[]> {
  const holders = leaseHolders(layout, recs);
  if (holders.length) return [leased(holders)];
  for (const r of recs) if (await isLocked(r.paths.lock)) return [{ code: "locked", message: `a pull of ${r.entry.ref} is in progress` }];
  const container = await containerReason(engines, facts);
  return container ? [container] : [];
}

/** What the engine says about a reference or an id: its id and tags, absent, or its error. */
async function lookup(engine: Engine, ref: string, env: EngineEnv): Promise<{ kind: "present"; id: string; tags: string[] } | { kind: "absent" } | { kind: "failed"; message: string }> {
  const r = await inspectImage(engine, ref, env);
  if (r.kind !== "present") return r;
  const tags = await engineExec(engine, ["image", "inspect", "--format", "{{json .RepoTags}}", ref], { env, timeoutMs: 60_000 });
  let list: string[] = [];
  try {
    list = (JSON.parse(tags.stdout.trim() || "null") as string[] | null) ?? [];
  } catch {
    // only used to tell a dangling image from a tagged one; unknown counts as tagged
    list = ["?"];
  }
  return { kind: "present", id: r.info.id, tags: list };
}

/**
 * Remove one image, never racing a pull, a job or a container:
 *   1. take the pull lock of each of its records, non-blocking (held: a pull
 *      or another removal is at work, skip);
 *   2. check the records are still what was listed, then the leases (a job
 *      leases before it looks at that lock, see ensure.ts), then the
 *      containers;
 *   3. rename the records into trash: from now on nobody finds them, and
 *      nobody finds half a record; check the leases again (put back if late);
 *   4. the engine's own `rmi` of each reference gpulayer pulled that still
 *      names this image (a tag moved elsewhere since, or a name gpulayer did
 *      not pull, is not gpulayer's to touch); the image goes with its last
 *      tag. Left dangling (its tags moved), it is removed by id. The engine
 *      refusing (a container just started from it) puts the records back;
 *   5. the image gone, the trashed records are deleted. Still there (someone
 *      tagged it under another name), it is no longer gpulayer's: 0 bytes freed.
 * A crash between 3 and 5 loses the records, never the image a job needs:
 * the image then stays, unrecorded, for the engine's owner to remove.
 */
async function removeImage(layout: HomeLayout, engines: Engines, recs: Rec[], facts: Facts): Promise<RemoveOutcome> {
  const releases: Release[] = [];
  const moved: { rec: Rec; trashed: string }[] = [];
  const putBack = (which = moved) => {
    for (const m of which) {
      try {
        renameSync(m.trashed, m.rec.paths.dir);
      } catch {
        rmSync(m.trashed, { recursive: true, force: true }); // a fresh record took its place meanwhile
      }
    }
  };
  try {
    for (const r of recs) {
      const release = await tryLock(r.paths.lock);
      if (!release) return { removed: false, reason: { code: "locked", message: `a pull of ${r.entry.ref} (or another removal) is in progress` } };
      releases.push(release);
    }
    for (const r of recs) {
      const now = readRecord(r.paths);
      if (!now || now.imageId !== facts.imageId || now.pulledByGpulayer !== r.entry.pulledByGpulayer) return { removed: false, reason: { code: "changed", message: `${r.entry.ref} changed since gc listed it` } };
    }
    const holders = leaseHolders(layout, recs);
    if (holders.length) return { removed: false, reason: leased(holders) };
    const engine = engines.get(facts.engine);
    if (isReason(engine)) return { removed: false, reason: engine };
    const container = await containerReason(engines, facts);
    if (container) return { removed: false, reason: container };

    mkdirSync(layout.trash, { recursive: true });
    for (const rec of recs) {
      const trashed = join(layout.trash, `image-${rec.paths.id}.${process.pid}.${Date.now()}`);
      renameSync(rec.paths.dir, trashed);
      moved.push({ rec, trashed });
    }
    const late = leaseHolders(layout, recs);
    if (late.length) {
      putBack();
      return { removed: false, reason: leased(late, true) };
    }

    const refused = (what: string, output: string, code: number, left: typeof moved): RemoveOutcome => {
      putBack(left);
      // Records of references already removed are stale now: they go.
      for (const m of moved) if (!left.includes(m)) rmSync(m.trashed, { recursive: true, force: true });
      const message = engineMessage(output) || `exited ${code}`;
      if (/container|in use|being used/i.test(message)) return { removed: false, reason: { code: "container", message: `${facts.engine} refused: ${message}` } };
      return { removed: false, reason: { code: "failed", message: `${facts.engine} rmi ${what} failed: ${message}` } };
    };
    for (let i = 0; i < moved.length; i++) {
      const { ref, pulledByGpulayer } = moved[i]!.rec.entry;
      if (!pulledByGpulayer) continue; // a name someone else gave it: theirs to remove, only its record goes
      const now = await lookup(engine, ref, engines.env);
      if (now.kind === "failed") {
        putBack(moved.slice(i));
        for (const m of moved.slice(0, i)) rmSync(m.trashed, { recursive: true, force: true });
        return { removed: false, reason: engines.fail(facts.engine, now.message) };
      }
      if (now.kind === "absent" || now.id !== facts.imageId) continue; // gone already, or the tag now names another image
      const r = await engineExec(engine, ["rmi", ref], { env: engines.env, timeoutMs: 120_000 });
      if (r.code !== 0) return refused(ref, `${r.stderr}\n${r.stdout}`, r.code, moved.slice(i));
    }
    const after = await lookup(engine, hex(facts.imageId), engines.env);
    if (after.kind === "present" && after.tags.length === 0) {
      // Dangling: gpulayer's tags were its last names (or moved away); the image is still gpulayer's pull.
      const r = await engineExec(engine, ["rmi", hex(facts.imageId)], { env: engines.env, timeoutMs: 120_000 });
      if (r.code !== 0) return refused(hex(facts.imageId), `${r.stderr}\n${r.stdout}`, r.code, moved);
    }
    const gone = after.kind !== "present" || after.tags.length === 0;
    for (const m of moved) rmSync(m.trashed, { recursive: true, force: true });
    return { removed: true, freedBytes: gone ? facts.sizeBytes : 0 };
  } catch (error) {
    putBack();
    throw error;
  } finally {
    for (const release of releases) await release();
  }
}
