import { ExitCode, InstallError, UserError } from "../errors.ts";

/**
 * A prepare's time limit (prepare_timeout) and its cancel as one signal, and the one line each stop becomes:
 * the same for a host env (env/prepare.ts) and an image's (docker/image-env.ts), so a limit is kept and said alike.
 */
export interface PrepareLimit {
  /** Aborted by the limit or the cancel; undefined when there is neither. */
  signal?: AbortSignal;
  /** When the signal stopped it: the error it becomes, `step` saying what was running; else null. */
  stopped(step: string): UserError | null;
}

export function prepareLimit(timeoutMs: number | undefined, cancel?: AbortSignal): PrepareLimit {
  const limit = timeoutMs ? AbortSignal.timeout(timeoutMs) : undefined;
  const signals = [limit, cancel].filter((s): s is AbortSignal => Boolean(s));
  const signal = signals.length ? AbortSignal.any(signals) : undefined;
  return {
    signal,
    stopped(step) {
      if (!signal?.aborted) return null;
      if (limit?.aborted) return new InstallError(`timed out after ${formatLimit(timeoutMs!)} while ${step} (prepare_timeout; nothing was kept)`, "");
      return new UserError(`stopped while ${step} (nothing was kept)`, ExitCode.cancelled);
    },
  };
}

const formatLimit = (ms: number) => (ms % 1000 === 0 ? `${ms / 1000} s` : `${(ms / 1000).toFixed(1)} s`);
