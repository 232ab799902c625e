import { satisfies } from "@renovatebot/pep440";
import type { RemoteSpec } from "../cluster/protocol.ts";
import { normalizeName } from "../env/index-light.ts";
import type { WorkerRow } from "./store.ts";
import { gpuRefusal, type ResourceAsk } from "../jobs/resources.ts";

/**
 * Matching, apart from everything else: what a job needs, whether a worker
 * could ever give it (labels, GPUs it has, frameworks it reported, a
 * container engine), and whether it can now (free slot, free GPUs).
 */

export interface Needs {
  gpus: number;
  frameworks: Record<string, string>;
  labels: Record<string, string>;
  image: boolean;
  /** The job relies on the worker's own Python (it names none). */
  workerPython: boolean;
  /** A conda environment the worker must have (by name, or by path: its prefix). */
  conda?: string;
}

export interface Load {
  running: number;
  usedGpus: Set<number>;
}

export function jobNeeds(spec: RemoteSpec, labels: Record<string, string>): Needs {
  const e = spec.environment;
  return { gpus: spec.resources.gpus, frameworks: spec.resources.frameworks, labels, image: Boolean(e.image), workerPython: !e.image && !e.python && !e.conda, ...(e.conda ? { conda: e.conda } : {}) };
}

export function labelsMatch(want: Record<string, string>, have: Record<string, string>): string | null {
  for (const [k, v] of Object.entries(want)) {
    if (!(k in have)) return `no label ${k}`;
    if (have[k] !== v) return `label ${k}=${have[k]}, not ${v}`;
  }
  return null;
}

/**
 * The one rule for resources (jobs/resources.ts) over the fleet: the places a job can run are the present
 * workers (offline ones too: they come back) whose labels match; refused in the same line as on one machine.
 */
export function fleetGpuRefusal(job: ResourceAsk, labels: Record<string, string>, workers: WorkerRow[]): string | null {
  return gpuRefusal(job, workers.filter((w) => !labelsMatch(labels, w.labels)).map((w) => w.probe.gpus.length));
}

/** Why this worker can never run the job, or null when it can (now or later). */
export function neverReason(needs: Needs, w: WorkerRow): string | null {
  const labels = labelsMatch(needs.labels, w.labels);
  if (labels) return labels;
  const gpus = w.probe.gpus.length;
  if (needs.gpus > gpus) return `has ${gpus} GPU${gpus === 1 ? "" : "s"}, the job needs ${needs.gpus}`;
  // With a conda environment, its packages are the base the frameworks are matched against.
  const conda = needs.conda ? (w.probe.conda ?? []).find((c) => (needs.conda!.includes("/") ? c.prefix === needs.conda : c.name === needs.conda)) : null;
  if (needs.conda && !conda) return `no conda environment ${needs.conda}`;
  const frameworks = conda ? conda.frameworks : w.probe.frameworks;
  for (const [name, spec] of Object.entries(needs.frameworks)) {
    const have = frameworks[normalizeName(name)];
    if (!have) return `${name} is not installed`;
    const range = spec.trim();
    if (range && range !== "*" && !safeSatisfies(have, range)) return `${name} ${have} does not satisfy ${range}`;
  }
  if (needs.image && !w.probe.engine) return "no working container engine (docker or podman)";
  if (needs.workerPython && !w.probe.python) return `its Python does not work (${w.probe.pythonError ?? "not probed"})`;
  return null;
}

/** Answers by version and range: dispatch asks the same few of every worker for every job, and pep440's parse is not cheap. */
const satisfied = new Map<string, boolean>();

function safeSatisfies(version: string, range: string): boolean {
  const key = `${version}\0${range}`;
  let answer = satisfied.get(key);
  if (answer === undefined) {
    try {
      answer = satisfies(version, range);
    } catch {
      answer = false;
    }
    if (satisfied.size >= 10_000) satisfied.clear();
    satisfied.set(key, answer);
  }
  return answer;
}

/** Whether a worker that could run the job can take it now: busyReason's question, without its words (asked of many workers per pass). */
export function hasRoom(needs: Needs, w: WorkerRow, load: Load): boolean {
  if (w.state === "draining" || load.running >= w.slots) return false;
  if (!needs.gpus) return true;
  let free = 0;
  for (const g of w.probe.gpus) if (!load.usedGpus.has(g.index)) free++;
  return free >= needs.gpus;
}

/** Why a worker that could run the job cannot take it now, or null. */
export function busyReason(needs: Needs, w: WorkerRow, load: Load): string | null {
  if (w.state === "draining") return "draining";
  if (load.running >= w.slots) return `${load.running === 1 ? "its slot is" : `all ${w.slots} slots are`} busy`;
  const free = w.probe.gpus.filter((g) => !load.usedGpus.has(g.index)).length;
  if (needs.gpus > free) return `${free} of ${w.probe.gpus.length} GPUs free, the job needs ${needs.gpus}`;
  return null;
}

/** The GPUs to give: the free ones with the lowest indices. */
export function pickGpus(needs: Needs, w: WorkerRow, load: Load): number[] {
  return w.probe.gpus
    .map((g) => g.index)
    .filter((i) => !load.usedGpus.has(i))
    .sort((a, b) => a - b)
    .slice(0, needs.gpus);
}

/** Of the workers known able to run the job (neverReason null), one that can take it now, by ranksBefore: one look at each (a pass's plan asks placer.ts, which chooses the same from a heap). */
export function chooseAmong(needs: Needs, able: WorkerRow[], loads: Map<string, Load>): WorkerRow | null {
  let best: WorkerRow | null = null;
  let bestLoad: Load | null = null;
  for (const w of able) {
    const load = loads.get(w.id)!;
    if (!hasRoom(needs, w, load)) continue;
    if (!best || ranksBefore(w, load, best, bestLoad!)) {
      best = w;
      bestLoad = load;
    }
  }
  return best;
}

/** The least loaded first, then the one with the fewest GPUs (the bigger ones kept for bigger jobs), then by name. Reads no GPU in use (placer.ts relies on it). */
export function ranksBefore(a: WorkerRow, la: Load, b: WorkerRow, lb: Load): boolean {
  return (la.running / a.slots - lb.running / b.slots || a.probe.gpus.length - b.probe.gpus.length || a.name.localeCompare(b.name)) < 0;
}

/** Names shown per reason; past them, a count (a fleet of 1,000 busy workers is one short line, not 30 KB). */
const NAMES_PER_REASON = 3;
/** Distinct reasons shown; past them, a count of the workers left. */
const REASONS_SHOWN = 5;

/**
 * One line over all workers, by reason, in the workers' order: "w1: torch is
 * not installed; w2, w3: has 0 GPUs, the job needs 1"; "sim-0000, sim-0001,
 * sim-0002 and 997 more: its slot is busy". Bounded by the reasons, not the
 * fleet, and the same while the same workers give the same reasons (a job's
 * waiting line is rewritten only when it changes).
 */
export function reasons(workers: WorkerRow[], why: (w: WorkerRow) => string | null): string {
  const byReason = new Map<string, string[]>();
  for (const w of workers) {
    const r = why(w);
    if (r) (byReason.get(r) ?? byReason.set(r, []).get(r)!).push(w.name);
  }
  const groups = [...byReason];
  const shown = groups.slice(0, REASONS_SHOWN).map(([r, names]) => {
    const more = names.length - NAMES_PER_REASON;
    return `${names.slice(0, NAMES_PER_REASON).join(", ")}${more > 0 ? ` and ${more} more` : ""}: ${r}`;
  });
  const rest = groups.slice(REASONS_SHOWN).reduce((n, [, names]) => n + names.length, 0);
  if (rest) shown.push(`${rest} other worker${rest === 1 ? "" : "s"} for other reasons`);
  return shown.join("; ");
}
