import type { HomeLayout } from "../config/paths.ts";
import { dryRunPrepare } from "../env/index-light.ts";
import { hostRequest } from "../env/index-light.ts";
import type { RunnerSettings } from "./runner.ts";
import type { JobSpec } from "./spec.ts";

/** One task as it would run: what `job run --dry-run` prints, resolved exactly as the runner would take it. */
export interface DryRunTask {
  name: string;
  command: string;
  workdir: string;
  needs: string[];
  /** The env's key and whether it is built already; an image job names its image (its env is keyed inside it). */
  environment: { key: string | null; would: "reuse" | "build" | null; summary: string; python: string | null; image: string | null; conda: string | null };
  /** Variable names only: values may be secrets. */
  env: string[];
  resources: { gpus: number; frameworks: Record<string, string> };
}

export interface DryRunJob {
  name: string;
  tasks: DryRunTask[];
}

/** The job's tasks (a job without `tasks:` is one, named after the job), each keyed, nothing built or locked. */
export function dryRunJob(layout: HomeLayout, spec: JobSpec, settings: RunnerSettings): DryRunJob {
  const tasks = spec.tasks ?? [{ name: spec.name, needs: [], spec }];
  return {
    name: spec.name,
    tasks: tasks.map(({ name, needs, spec: t }) => {
      const e = t.environment;
      const keyed = e.image ? null : dryRunPrepare(layout, hostRequest(settings, { request: e, workdir: t.workdir }));
      return {
        name,
        command: t.commandText,
        workdir: t.workdir,
        needs,
        environment: {
          key: keyed?.key ?? null,
          would: keyed?.would ?? null,
          summary: keyed?.summary ?? [...e.specs, ...(e.requirementsFile ? [e.requirementsFile] : [])].join(", "),
          python: keyed?.inputs.interpreter.path ?? null,
          image: e.image ?? null,
          conda: e.conda ?? null,
        },
        env: Object.keys(t.env).sort(),
        resources: t.resources,
      };
    }),
  };
}
