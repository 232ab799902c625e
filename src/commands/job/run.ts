import { defineCommand } from "citty";
import { commandContext, localGpus, localSlots, originText, runnerSettings } from "../_context.ts";
import { ExitError, jobEndCode, UsageError, UserError } from "../../errors.ts";
import { gpuRefusal } from "../../jobs/resources.ts";
import { startJob } from "../../jobs/runner.ts";
import { firstGpuIds } from "../../jobs/allocation.ts";
import { jobStdout, tasksIO, tasksSummary } from "../_tasks-ui.ts";
import { buildJobSpec } from "../../jobs/spec.ts";
import { JobStore } from "../../jobs/store.ts";
import { formatSeconds, Output } from "../../ui/output.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { afterDoubleDash, buildOutputArgs, installerArgs, labelArgs, projectFlags, rejectUnknownFlags, repeated, placeArgs } from "../_args.ts";
import { imageHooks } from "../_image-ui.ts";
import { preparedLine, prepareHooks } from "../_prepare-ui.ts";
import type { JobDryRunDoc, JobStateDoc, JobStatusDoc } from "../_json.ts";
import { onBrokenPipe, writeErr } from "../../ui/terminal.ts";
import { printable } from "../../ui/escape.ts";

function parseGpus(value: string): number {
  if (!/^\d{1,4}$/.test(value.trim())) throw new UsageError(`--gpus ${value}: expected a whole number of GPUs (0 or more)`);
  return Number(value.trim());
}

const args = {
  file: { type: "string", alias: "f", valueHint: "JOB_FILE", description: "A job file (YAML or JSON): command, workdir, env, environment (requirements, python or conda, ...), resources; or tasks: several, each with its own command and needs, the job's fields their defaults" },
  requirements: { type: "string", alias: "r", valueHint: "REQ_FILE", description: "Requirements file for the job's environment (overrides the file's)" },
  package: { type: "string", alias: "p", valueHint: "SPEC", description: "A requirement such as 'numpy<3' (repeatable; overrides the file's)" },
  ...installerArgs,
  workdir: { type: "string", valueHint: "DIR", description: "Working directory of the job (default: the job file's folder, else here)" },
  env: { type: "string", alias: "e", valueHint: "K=V", description: "An environment variable for the job (repeatable)" },
  image: { type: "string", valueHint: "REF", description: "Run in this container image" },
  name: { type: "string", description: "A name for the job" },
  gpus: { type: "string", valueHint: "N", description: "GPUs the job needs (overrides resources.gpus); with a server, only a worker with N free GPUs takes it" },
  detach: { type: "boolean", alias: "d", description: "Start in the background and print the job id" },
  "dry-run": { type: "boolean", description: "Print each task as it would run (command, environment and its key, variables by name, needs); run nothing, build nothing" },
  ...placeArgs,
  ...labelArgs,
  ...buildOutputArgs,
} as const;

export default defineCommand({
  meta: {
    name: "run",
    description: "Prepare the job's environment (task.prepare), then run it (task.run); exits with the job's own exit code. Command after --.",
  },
  args,
  async run({ args: a, rawArgs }) {
    const beforeDashes = rawArgs.includes("--") ? rawArgs.slice(0, rawArgs.indexOf("--")) : rawArgs;
    const command = afterDoubleDash(rawArgs);
    // A command without `--` (job run -p tqdm python -c 1): say where it goes before its own flags look unknown.
    const stray = (a._ as string[]).length > command.length ? beforeDashes.indexOf((a._ as string[])[0]!) : -1;
    if (stray !== -1) {
      // A misspelled flag before it (`--pyhton python3`) is the real problem: named first.
      rejectUnknownFlags(beforeDashes.slice(0, stray), args);
      throw new UsageError(`unexpected argument ${beforeDashes[stray]}: put the command after -- (gpulayer job run ${[...beforeDashes.slice(0, stray), "--", ...beforeDashes.slice(stray)].join(" ")})`);
    }
    rejectUnknownFlags(beforeDashes, args);
    // citty keeps the last of several; pip's way to several files is one file that names each.
    if (repeated(beforeDashes, ["-r", "--requirements"]).length > 1) throw new UsageError("-r is taken once (the last would win, the others dropped); for several files, write one that names each with -r");
    const out = new Output(a);
    const ctx = await commandContext({ python: a.python, server: a.server, token: a.token, token_file: a["token-file"], prepare_timeout: a["prepare-timeout"] });
    const { layout } = ctx;
    const spec = buildJobSpec(
      {
        file: a.file,
        requirementsFile: a.requirements,
        specs: repeated(rawArgs, ["-p", "--package"]),
        python: a.python,
        conda: a.conda,
        workdir: a.workdir,
        env: repeated(rawArgs, ["-e", "--env"]),
        image: a.image,
        indexUrl: a["index-url"],
        extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]),
        findLinks: repeated(rawArgs, ["--find-links"]),
        noBuildIsolation: repeated(rawArgs, ["--no-build-isolation-package"]),
        ...projectFlags(a.project, rawArgs, { jobFile: a.file !== undefined }),
        command,
        name: a.name,
        gpus: a.gpus === undefined ? undefined : parseGpus(a.gpus),
        // --prepare-timeout wins over the job file's environment.prepare_timeout; the variable and config file do not.
        prepareTimeoutMs: ctx.settings.origins.prepare_timeout.source === "flag" ? ctx.values.prepare_timeout : undefined,
      },
      ctx.cwd,
    );
    const remote = remoteTarget(ctx.settings, rawArgs, { local: a.local });
    if (a["dry-run"]) {
      if (remote) throw new UsageError(`--dry-run resolves the job on this machine; it does not go with a server (${originText(ctx, "server")} names one; --local runs here; each worker keys its own env)`);
      const [{ dryRunJob }, { dryRunLines }] = await Promise.all([import("../../jobs/dry-run.ts"), import("./_lines.ts")]);
      const plan: JobDryRunDoc = dryRunJob(layout, spec, runnerSettings(ctx));
      return out.result(plan, () => dryRunLines(plan));
    }
    if (remote) return (await import("../_remote/job.ts")).runRemoteJob(remote, spec, { rawArgs, detach: Boolean(a.detach), out, sendWorkdir: Boolean(a.file || a.workdir), reading: { env: ctx.childEnv, digestCache: layout.digests } });
    // The one rule for resources (jobs/resources.ts), as a server applies it: refused before anything is recorded or built.
    const gpus = await localGpus(ctx, spec);
    const refusal = gpus && gpuRefusal(spec, [gpus.length]);
    if (refusal) throw new UserError(refusal);
    const store = new JobStore(layout);
    const job = store.create(spec);
    if (a.detach) {
      (await import("../../jobs/detach.ts")).spawnDetachedRunner(job, ctx.childEnv, ctx.jobUmask);
      const doc: JobStateDoc = { id: job.id, state: "queued" };
      out.result(doc, () => job.id, true);
      return;
    }
    out.progress(`job ${job.id} (${printable(spec.name)})`);
    // With --json, stdout carries only the final document: the job's output goes to stderr.
    let stdoutGone = false;
    const toStdout = jobStdout(Boolean(a.json), () => stdoutGone);
    const running = spec.tasks
      ? (await import("../../jobs/job-tasks.ts")).startJobTasks(store, layout, job, { ...runnerSettings(ctx), slots: localSlots(ctx), gpus }, tasksIO(out, { stdout: toStdout }))
      : startJob(store, layout, job, runnerSettings(ctx), {
          onStdout: toStdout,
          onStderr: (c) => writeErr(c),
          prepareHooks: prepareHooks(out),
          imageHooks: imageHooks(out),
          onPrepared: (p) => out.progress(preparedLine(p)),
          onPrepareFailed: (m) => out.log.error(`task.prepare failed: ${m}`),
        }, firstGpuIds(gpus, spec.resources.gpus));
    // The reader of our stdout went away: the job is cancelled (as SIGPIPE ends a plain command), never orphaned.
    onBrokenPipe.handler = () => {
      stdoutGone = true;
      running.cancel("stdout closed");
    };
    const onSignal = (signal: string) => {
      // A SIGTERM that `job cancel` sent (it says so in the job's events first) is recorded as that.
      const byCancel = signal === "SIGTERM" && store.events(job.id).some((e) => e.type === "job.cancel.requested");
      out.progress(`\n${byCancel ? "job cancel" : signal}: cancelling job ${job.id}`);
      running.cancel(byCancel ? "job cancel" : `${signal} to gpulayer`);
    };
    // SIGHUP too: a closed terminal must not leave the job running on, orphaned in its own process group.
    const signals = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
    for (const s of signals) process.on(s, onSignal);
    const outcome = await running.done;
    for (const s of signals) process.off(s, onSignal);
    // Read only where it is shown (it scans /proc for what the job left running): a plain run ends on its exit line.
    const status: JobStatusDoc | null = spec.tasks || a.json ? (await import("../../jobs/status.ts")).jobStatus(store, store.get(job.id)!) : null;
    store.close();
    if (spec.tasks) out.progress(tasksSummary(status!));
    else if (outcome.runSeconds !== null) out.progress(`task.run exit ${outcome.exitCode} in ${formatSeconds(outcome.runSeconds)} (job ${job.id} ${outcome.state})`);
    if (a.json) out.result(status!, () => "");
    const code = jobEndCode(outcome.exitCode, outcome.state);
    if (code !== 0) throw new ExitError(code);
  },
});
