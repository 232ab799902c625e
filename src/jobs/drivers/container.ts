import type { RunContainerOptions } from "../../docker/index.ts";
import { UserError } from "../../errors.ts";
import { CannotStart, type OutputSinks, type StartedTask, type TaskDriver } from "./driver.ts";

/**
 * The command in a new container of an image already on the machine
 * (docker/run.ts): the engine's CLI is the main process, its output the
 * command's; a stop is `<engine> stop` with the grace period.
 */
export function containerDriver(opts: Omit<RunContainerOptions, "onStdout" | "onStderr">, graceMs: number): TaskDriver {
  return {
    async start(output: OutputSinks): Promise<StartedTask> {
      // Loaded for an image only, as the prepare loads it (jobs/prepare.ts): a host job never pays for the container code.
      const { runContainer } = await import("../../docker/index.ts");
      const container = await runContainer({ ...opts, onStdout: output.stdout, onStderr: output.stderr }).catch((error: unknown) => {
        throw error instanceof UserError ? new CannotStart(error.message) : error;
      });
      let stopped = false;
      return {
        pid: container.pid,
        details: { container: container.name, engine: opts.engine.name },
        stop() {
          if (stopped) return;
          stopped = true;
          void container.stop(graceMs / 1000);
        },
        exited: container.exited.then((exitCode) => ({ exitCode })),
      };
    },
  };
}
