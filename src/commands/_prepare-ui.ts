import { InstallError, UserError } from "../errors.ts";
import type { PrepareHooks } from "../env/prepare.ts";
import { formatSeconds, type Output, shortKey } from "../ui/output.ts";

/** Progress of a prepare on stderr: each step with its time; the installer's lines with --verbose. */
export function prepareHooks(out: Output): PrepareHooks {
  const started = performance.now();
  const elapsed = () => formatSeconds((performance.now() - started) / 1000);
  return {
    onResolved: (r) => out.debug(() => `key ${r.key} (${r.summary}) python ${r.interpreter.path} ${r.isolated ? "isolated installer config" : "machine pip config counted in key"}`),
    onWait: (m) => out.progress(`… ${m}`),
    onStep: (step, detail) => out.progress(`[${elapsed()}] ${step} ${detail}`),
    onStepDone: (step, s) => out.debug(() => `${step} took ${formatSeconds(s)}`),
    onOutput: (line) => out.tool(line),
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
