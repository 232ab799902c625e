import type { HomeLayout } from "../config/paths.ts";
import { UsageError, UserError } from "../errors.ts";
import type { Lease } from "../core/lease.ts";
import { acquireEntry } from "../env/index-light.ts";
import { isLocked } from "../core/lock.ts";
import { candidateEngine, detectEngine, type Engine, engineAnswered, type EngineHost, forgetEngine, probeEngine } from "./engine.ts";
import { type ImageInfo, type InspectOutcome, inspectImage, validateRef } from "./image.ts";
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

/** Find the engine and ask it about the image in one go; the warm path costs one engine call. */
async function locate(layout: HomeLayout, ref: string, host: EngineHost): Promise<{ engine: Engine; inspect: InspectOutcome }> {
  const { env } = host;
  const candidate = candidateEngine(layout, host);
  if (candidate) {
    const inspect = await inspectImage(candidate, ref, env);
    if (inspect.kind !== "failed") {
      // A forced engine is not remembered: without the variable, detection stays docker-first.
      if (!host.forced) engineAnswered(layout, candidate, env);
      return { engine: candidate, inspect };
    }
    if (host.forced) {
      const problem = await probeEngine(candidate, env);
      if (problem) throw new UserError(`container engine ${candidate.name} does not work: ${problem} (${host.forcedBy ?? "container.engine"} chose it)`);
      throw new UserError(`${candidate.name} image inspect ${ref} failed: ${inspect.message}`);
    }
    forgetEngine(layout);
  }
  const engine = await detectEngine(layout, host, { fresh: true });
  const inspect = await inspectImage(engine, ref, env);
  if (inspect.kind === "failed") throw new UserError(`${engine.name} image inspect ${ref} failed: ${inspect.message}`);
  return { engine, inspect };
}

function recordFor(engine: Engine, ref: string, info: ImageInfo, prev: ImageRecord | null, pulled: { before: string | null } | null): ImageRecord {
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
  };
}

/** The image is here: keep the record in step with what the engine has, and mark the use. */
function reuse(paths: RecordPaths, engine: Engine, ref: string, info: ImageInfo): ImageRecord {
  const prev = readRecord(paths);
  if (prev && prev.imageId === info.id && prev.digest === info.digest) {
    touchRecord(paths);
    return prev;
  }
  const record = recordFor(engine, ref, info, prev, null);
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
  let { engine, inspect } = await locate(layout, image, opts.host);
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
        busy = inspect.kind === "present" && (await isLocked(paths.lock));
        if (policy !== "always" && inspect.kind === "present" && !busy) return done("reused", reuse(paths, engine, image, inspect.info));
        if (policy === "never" && !busy) throw refuse();
        return null;
      }
      if (!waited && !busy) return null;
      // The other process may have pulled it meanwhile: that pull counts as ours too.
      inspect = await inspectImage(engine, image, env);
      const prev = readRecord(paths);
      const fresh = prev?.lastPulled !== undefined && prev.lastPulled >= startedIso;
      if (inspect.kind === "present" && (policy !== "always" || fresh)) return done("reused", reuse(paths, engine, image, inspect.info));
      if (policy === "never") throw refuse();
      return null;
    },
    build: async () => {
      const before = inspect.kind === "present" ? inspect.info.id : null;
      opts.onPull?.(image, engine);
      const pulled = await pullImage(engine, image, { env, onProgress: opts.onProgress, onLine: opts.onLine });
      if (!pulled.ok) throw new UserError(`cannot pull ${image} with ${engine.name}: ${pulled.message}`);
      const after = await inspectImage(engine, image, env);
      if (after.kind !== "present") throw new UserError(`${engine.name} pulled ${image} but cannot inspect it: ${after.kind === "failed" ? after.message : "image not found after the pull"}`);
      const record = recordFor(engine, image, after.info, readRecord(paths), { before });
      writeRecord(paths, record);
      return done("pulled", record, pulled.progress);
    },
    onWait: () => opts.onWait?.(`another process is pulling ${image}; waiting for it`),
  });
  return { ...entry, lease };
}
