/**
 * What gc works on. Every kind of cached thing (Python environments in
 * env-source.ts, container images in image-source.ts, a worker's bundle
 * copies in bundle-source.ts, the wheelhouse in wheel-source.ts, the bytecode
 * store in bytecode-source.ts) is offered to the
 * policy as GcEntry values by a GcSource; the policy never knows how an entry
 * is stored, measured, leased or deleted.
 */
export type GcKind = "env" | "image" | "bundle" | "wheel" | "bytecode";

/**
 * ready: complete and usable; the LRU policy may remove it.
 * incomplete: remains of a build that failed or died (no ready marker, no
 *   build running): garbage, removed whatever the limit.
 * building: a build holds its lock right now: never touched.
 */
export type GcState = "ready" | "incomplete" | "building";

/** Why an entry is not removed: a code for scripts, a message for people. */
export interface SkipReason {
  /**
   * leased: a running job holds it; locked: a build, a pull or a removal is at
   * work on it; min-age, keep: the policy protects it; changed: it changed
   * under gc (not reported). Images only: container: a container (running or
   * stopped) uses it; engine: its engine does not answer; not-pulled: gpulayer
   * did not pull it (never removed, never counted); failed: the engine refused
   * to remove it.
   */
  code: "leased" | "locked" | "min-age" | "keep" | "changed" | "container" | "engine" | "not-pulled" | "failed";
  message: string;
}

export type RemoveOutcome = { removed: true; freedBytes: number } | { removed: false; reason: SkipReason };

export interface GcEntry {
  kind: GcKind;
  /** env key, an image's local id (sha256:...), or a bundle's hash. */
  id: string;
  state: GcState;
  /** Bytes deleting it frees (unique bytes on disk, hard links once). */
  sizeBytes: number;
  /** Last use as recorded by gpulayer itself (never atime); 0 when unknown. */
  lastUsedMs: number;
  createdMs: number;
  /** One line for people: the request (`timm>=1, torchvision==0.20.1`) or the image reference. */
  summary: string;
  /** The size was measured again in this run (its files changed since, or --refresh-sizes). */
  sizeRefreshed?: boolean;
  /** Other names --keep matches by prefix, besides the id (an image's references). */
  names?: string[];
  /** Images: the engine that holds it and the references gpulayer recorded for it. */
  image?: { engine: string; refs: string[]; digest: string };
  /** Envs built on top of an image (docker/image-env.ts): that image's id; they go when it goes. */
  onImage?: string;
  /**
   * Never the policy's to remove, and not part of the cache's total (an
   * image gpulayer did not pull): reported as skipped with this reason.
   */
  excluded?: SkipReason;
  /**
   * Why it must not be removed now (held by a running job, being built).
   * Cheap and advisory, for planning and --dry-run; remove() checks again
   * under the entry's own lock.
   */
  inUse(): Promise<SkipReason[]>;
  /** Take it out of the cache safely, or say why not (it turned out to be in use). */
  remove(): Promise<RemoveOutcome>;
}

export interface ListOptions {
  /** Measure every entry again instead of trusting sizes recorded earlier. */
  refreshSizes: boolean;
  /** Store sizes measured again (off for --dry-run, which changes nothing). */
  persistSizes: boolean;
}

export interface GcSource {
  kind: GcKind;
  list(opts: ListOptions): Promise<GcEntry[]>;
}
