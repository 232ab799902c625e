/**
 * What gc works on. Every kind of cached thing (Python environments now,
 * container images later) is offered to the policy as GcEntry values by a
 * GcSource; the policy never knows how an entry is stored, measured, leased
 * or deleted. To add images: write src/gc/image-source.ts implementing
 * GcSource with kind "image" (sizes and last use from gpulayer's own image
 * records, in-use from leases of kind "image" and running containers,
 * remove() that untags/removes only images gpulayer pulled) and list it in
 * gcSources() in src/gc/sources.ts.
 */
export type GcKind = "env" | "image";

/**
 * ready: complete and usable; the LRU policy may remove it.
 * incomplete: remains of a build that failed or died (no ready marker, no
 *   build running): garbage, removed whatever the limit.
 * building: a build holds its lock right now: never touched.
 */
export type GcState = "ready" | "incomplete" | "building";

/** Why an entry is not removed: a code for scripts, a message for people. */
export interface SkipReason {
  code: "leased" | "locked" | "min-age" | "keep" | "changed";
  message: string;
}

export type RemoveOutcome = { removed: true; freedBytes: number } | { removed: false; reason: SkipReason };

export interface GcEntry {
  kind: GcKind;
  /** env key, or an image digest. */
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
