import type { HomeLayout } from "../config/paths.ts";
import { UsageError, UserError } from "../errors.ts";
import type { Lease } from "../core/lease.ts";
import { acquireEntry } from "../env/index-light.ts";
import { isLocked } from "../core/lock.ts";
import { candidateEngine, detectEngine, type Engine, engineAnswered, type EngineEnv, type EngineHost, forgetEngine, probeEngine } from "./engine.ts";
import { podmanStoreStamp } from "./podman-store.ts";
import { type ImageInfo, type InspectOutcome, inspectImage, namesRegistry, validateRef } from "./image.ts";
import { type ImageRecord, readRecord, type RecordPaths, recordPaths, touchRecord, writeRecord } from "./inventory.ts";
import { type PullProgress, pullImage } from "./pull.ts";

/**
 * `missing` (the default): pull only when the engine does not have the
 * reference, `:latest` included (the engines' own `--pull missing`);
 * `always`: pull every time (the registry decides whether anything changed);
 * `never`: fail when it is not here.
 */
export type PullPolicy = "missing" | "always" | "never";
export const PULL_POLICIES: readonly PullPolicy[] = ["missing", "always", "never"];

export function parsePullPolicy(value: string | undefined, origin = "--pull"): PullPolicy {
  if (value === undefined || value === "") return "missing";
  if ((PULL_POLICIES as readonly string[]).includes(value)) return value as PullPolicy;
  throw new UsageError(`${origin} must be one of ${PULL_POLICIES.join(", ")}, not ${JSON.stringify(value)}`);
}

export interface EnsureHooks {
  /** A pull starts (after the lock, so a waiter that then reuses never sees this). */
  onPull?(ref: string, engine: Engine): void;
  onProgress?(progress: PullProgress): void;
  /** Every line the engine prints while pulling (for --verbose). */
  onLine?(line: string): void;
  onWait?(message: string): void;
}

export interface EnsureOptions extends EnsureHooks {
  pull?: PullPolicy;
  host: EngineHost;
  /** Take a lease on the record for a job (released by the caller when the job ends). */
  leaseHolder?: string;
}

export interface EnsureResult {
  /** The reference as asked for. */
  image: string;
  /** The registry's manifest digest (sha256:...), else the image id. */
  digest: string;
  /** The local image id: start containers from this, not from the tag (a tag may move meanwhile). */
  imageId: string;
  status: "pulled" | "reused";
  seconds: number;
  engine: Engine;
  sizeBytes: number;
  pulledByGpulayer: boolean;
  /** Layers and bytes of the pull, when there was one. */
  progress?: PullProgress;
  lease?: Lease;
}

/**
 * The engine's answer about an image, and the stamp of Podman's image store
 * taken just before it (podman-store.ts; null for Docker, whose daemon
 * answers in a millisecond through its socket). While the stamp stays the
 * same, the record written with it is Podman's answer, and no Podman starts.
 */
interface Look {
  inspect: InspectOutcome;
  stamp: string | null;
}

async function look(layout: HomeLayout, engine: Engine, ref: string, env: EngineEnv): Promise<Look> {
  // A short name (no registry) resolves through Podman's registries configuration too (its aliases, its search list): no stamp vouches for that.
  if (engine.name !== "podman" || !namesRegistry(ref)) return { inspect: await inspectImage(engine, ref, env), stamp: null };
  const stamp = await podmanStoreStamp(layout, engine, env);
  const record = stamp ? readRecord(recordPaths(layout, engine.name, ref)) : null;
  if (stamp && record?.storeStamp === stamp && record.imageId && record.digest) return { inspect: { kind: "present", info: { id: record.imageId, digest: record.digest, repoDigests: record.repoDigests, sizeBytes: record.sizeBytes } }, stamp };
  return { inspect: await inspectImage(engine, ref, env), stamp };
}

/** Find the engine and ask it about the image in one go; the warm path costs one engine call (Podman's, none while its store is unchanged). */
async function locate(layout: HomeLayout, ref: string, host: EngineHost): Promise<{ engine: Engine } & Look> {
  const { env } = host;
  const candidate = candidateEngine(layout, host);
  if (candidate) {
    const seen = await look(layout, candidate, ref, env);
    if (seen.inspect.kind !== "failed") {
      // A forced engine is not remembered: without the variable, detection stays docker-first.
      if (!host.forced) engineAnswered(layout, candidate, env);
      return { engine: candidate, ...seen };
    }
    if (host.forced) {
      const problem = await probeEngine(candidate, env);
      if (problem) throw new UserError(`container engine ${candidate.name} does not work: ${problem} (${host.forcedBy ?? "container.engine"} chose it)`);
      throw new UserError(`${candidate.name} image inspect ${ref} failed: ${seen.inspect.message}`);
    }
    forgetEngine(layout);
  }
  const engine = await detectEngine(layout, host, { fresh: true });
  const seen = await look(layout, engine, ref, env);
  if (seen.inspect.kind === "failed") throw new UserError(`${engine.name} image inspect ${ref} failed: ${seen.inspect.message}`);
  return { engine, ...seen };
}

function recordFor(engine: Engine, ref: string, info: ImageInfo, prev: ImageRecord | null, pulled: { before: string | null } | null, stamp: string | null): ImageRecord {
  const now = new Date().toISOString();
  const same = prev?.imageId === info.id;
  // Ours only when our pull brought this image id here (or it was already ours).
  const pulledByGpulayer = pulled ? pulled.before !== info.id || Boolean(same && prev?.pulledByGpulayer) : Boolean(same && prev?.pulledByGpulayer);
  return {
    schema: 1,
    engine: engine.name,
    ref,
    digest: info.digest,
    imageId: info.id,
    repoDigests: info.repoDigests,
    sizeBytes: info.sizeBytes,
    firstSeen: same && prev ? prev.firstSeen : now,
    lastPulled: pulled ? now : same ? prev?.lastPulled : undefined,
    pulledByGpulayer,
    ...(stamp ? { storeStamp: stamp } : {}),
  };
}

/** The image is here: keep the record in step with what the engine has (and the store's stamp), and mark the use. */
function reuse(paths: RecordPaths, engine: Engine, ref: string, info: ImageInfo, stamp: string | null): ImageRecord {
  const prev = readRecord(paths);
  if (prev && prev.imageId === info.id && prev.digest === info.digest && (prev.storeStamp ?? null) === stamp) {
    touchRecord(paths);
    return prev;
  }
  const record = recordFor(engine, ref, info, prev, null, stamp);
  writeRecord(paths, record);
  return record;
}

/**
 * Make sure an image is on this machine: pull it once per worker, then reuse
 * it. One pull per engine and reference at a time across processes: a
 * second request waits for the first and reuses what it pulled.
 */
export async function ensureImage(layout: HomeLayout, ref: string, opts: EnsureOptions): Promise<EnsureResult> {
  const started = performance.now();
  const startedIso = new Date().toISOString();
  const image = validateRef(ref);
  const policy = opts.pull ?? "missing";
  const env = opts.host.env;
  const located = await locate(layout, image, opts.host);
  const { engine } = located;
  let seen: Look = located;
  const paths = recordPaths(layout, engine.name, image);
  const done = (status: EnsureResult["status"], record: ImageRecord, progress?: PullProgress): Omit<EnsureResult, "lease"> => ({
    image,
    digest: record.digest,
    imageId: record.imageId,
    status,
    seconds: (performance.now() - started) / 1000,
    engine,
    sizeBytes: record.sizeBytes,
    pulledByGpulayer: record.pulledByGpulayer,
    progress,
  });
  const refuse = () => new UserError(`image ${image} is not on this machine (${engine.name}) and the pull policy is never`);
  // Whether the lock was held at the first look: then the image may be going (gc) or coming (a pull); look again holding it.
  let busy = false;
  const { entry, lease } = await acquireEntry({
    lease: opts.leaseHolder ? { layout, kind: "image", id: paths.id, holder: opts.leaseHolder } : undefined,
    lock: paths.lock,
    reuse: async ({ locked, waited }) => {
      if (!locked) {
        // One look before the lock, with what `locate` saw; after a wait, the next look is the one holding the lock.
        if (waited) return null;
        // The lease is down before the lock is looked at, and gc takes the lock before it checks leases:
        // while gc (or a pull) holds it, the image may be going, so wait for it and look again.
        const { inspect } = seen;
        busy = inspect.kind === "present" && (await isLocked(paths.lock));
        if (policy !== "always" && inspect.kind === "present" && !busy) return done("reused", reuse(paths, engine, image, inspect.info, seen.stamp));
        if (policy === "never" && !busy) throw refuse();
        return null;
      }
      if (!waited && !busy) return null;
      // The other process may have pulled it meanwhile: that pull counts as ours too.
      seen = await look(layout, engine, image, env);
      const { inspect } = seen;
      const prev = readRecord(paths);
      const fresh = prev?.lastPulled !== undefined && prev.lastPulled >= startedIso;
      if (inspect.kind === "present" && (policy !== "always" || fresh)) return done("reused", reuse(paths, engine, image, inspect.info, seen.stamp));
      if (policy === "never") throw refuse();
      return null;
    },
    build: async () => {
      const before = seen.inspect.kind === "present" ? seen.inspect.info.id : null;
      opts.onPull?.(image, engine);
      const pulled = await pullImage(engine, image, { env, onProgress: opts.onProgress, onLine: opts.onLine });
      if (!pulled.ok) throw new UserError(`cannot pull ${image} with ${engine.name}: ${pulled.message}`);
      // The store's stamp after the pull, then the engine's answer it vouches for.
      const stamp = engine.name === "podman" && namesRegistry(image) ? await podmanStoreStamp(layout, engine, env) : null;
      const after = await inspectImage(engine, image, env);
      if (after.kind !== "present") throw new UserError(`${engine.name} pulled ${image} but cannot inspect it: ${after.kind === "failed" ? after.message : "image not found after the pull"}`);
      const record = recordFor(engine, image, after.info, readRecord(paths), { before }, stamp);
      writeRecord(paths, record);
      return done("pulled", record, pulled.progress);
    },
    onWait: () => opts.onWait?.(`another process is pulling ${image}; waiting for it`),
  });
  return { ...entry, lease };
}
