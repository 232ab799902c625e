import { InstallError, UserError } from "../errors.ts";
import type { PrepareHooks } from "../env/index-light.ts";
import { formatBytes, formatSeconds, type Output, shortKey } from "../ui/output.ts";

/**
 * Progress of a prepare on stderr (with --json too): each step with its time;
 * while installing, what the installer says it has done, at most every 2 s;
 * a line when it has said nothing for a minute; its own lines with --verbose.
 */
export function prepareHooks(out: Output): PrepareHooks {
  const started = performance.now();
  const elapsed = () => formatSeconds((performance.now() - started) / 1000);
  let step = "";
  let stepStarted = started;
  const progress = installerProgress();
  let shown = "";
  let shownAt = 0;
  return {
    onResolved: (r) => out.debug(() => `key ${r.key} (${r.summary}) python ${r.interpreter.path} ${r.isolated ? "isolated installer config" : "machine pip config counted in key"}`),
    onWait: (m) => out.phase(`… ${m}`),
    onHashing: (path, bytes) => out.phase(`[${elapsed()}] hashing ${path} (${formatBytes(bytes)}) for the key; once: later runs go by its stat`),
    onStep: (s, detail) => {
      step = s;
      stepStarted = performance.now();
      out.phase(`[${elapsed()}] ${s} ${detail}`);
    },
    onStepDone: (s, seconds) => out.debug(() => `${s} took ${formatSeconds(seconds)}`),
    onOutput: (line) => {
      out.tool(line);
      const now = progress.read(line);
      if (step === "installing" && now && now !== shown && performance.now() - shownAt >= 2_000) {
        shown = now;
        shownAt = performance.now();
        out.phase(`[${elapsed()}]   ${now}`);
      }
    },
    onQuiet: (tool, seconds) => out.phase(`[${elapsed()}] still ${step || "working"} after ${formatSeconds((performance.now() - stepStarted) / 1000)}; ${tool} has said nothing for ${formatSeconds(seconds)}`),
  };
}

/** What pip's and uv's own lines say was done: collected, downloaded (with bytes), resolved, prepared, installed. */
function installerProgress() {
  let collected = 0;
  let downloaded = 0;
  let bytes = 0;
  let summary = "";
  const UNITS: Record<string, number> = { kb: 1e3, mb: 1e6, gb: 1e9, kib: 1024, mib: 1024 ** 2, gib: 1024 ** 3, b: 1 };
  return {
    read(line: string): string {
      const t = line.trim();
      // pip says one of these per requirement it takes: from an index, from a local file (a find-links folder, a
      // file:// index, a path), an editable project.
      if (/^(Collecting|Processing|Obtaining) /.test(t)) collected++;
      const dl = /^Downloading \S+ \(([\d.]+) ?([kKMG]i?B|B)\)/.exec(t);
      if (dl) {
        downloaded++;
        bytes += Number(dl[1]) * (UNITS[dl[2]!.toLowerCase()] ?? 1);
      }
      const uv = /^(Resolved|Prepared|Installed|Audited) (\d+) packages?/.exec(t);
      if (uv) summary = `${uv[1]!.toLowerCase()} ${uv[2]} package(s)`;
      if (/^Installing collected packages:/.test(t)) summary = `installing ${t.split(":")[1]!.split(",").length} package(s)`;
      const parts = [collected && `${collected} collected`, downloaded && `${downloaded} downloaded (${formatBytes(bytes)})`, summary].filter(Boolean);
      return parts.join(", ");
    },
  };
}

/** An installer failure becomes one clear message with the installer's own words under it. */
export function prepareFailure(error: unknown): unknown {
  if (error instanceof InstallError) {
    const detail = error.detail ? `\n${error.detail.split("\n").map((l) => `  ${l}`).join("\n")}` : "";
    return new UserError(`${error.message}${detail}`, error.exitCode);
  }
  return error;
}

export { shortKey };

/** A uv project's shadowed worker packages, for people: the same words in `env prepare` (here or on a fleet) and `env show`. */
export function shadowsText(shadowed: readonly { name: string; worker: string; locked: string }[]): string {
  return shadowed.map((s) => `${s.name} ${s.worker} (the worker's) by ${s.locked} (the lock's)`).join(", ");
}

/** A job's prepared env or image, for people: the env by its short key, the image as the job names it. */
export function preparedLine(p: { status: string; seconds: number; key: string; kind: "env" | "image" }): string {
  return `task.prepare ${p.status} ${p.kind} ${p.kind === "env" ? shortKey(p.key) : p.key} in ${formatSeconds(p.seconds)}`;
}
