import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { isAbsolute, join, resolve } from "node:path";
import { ExitCode, UsageError, UserError } from "../errors.ts";
import { sleep } from "../core/sleep.ts";
import { type Engine, type EngineEnv, engineExec, engineMessage } from "./engine.ts";
import { gpuArgs } from "./gpu.ts";
import { StartFailure } from "./start-failure.ts";

export { type ContainerSettings, containerSettings } from "./container-settings.ts";

export interface RunContainerOptions {
  engine: Engine;
  /** An image id (sha256:..., from ensureImage) or a reference already on the machine; never pulled here. */
  image: string;
  /** Mounted at the same path in the container and used as its working directory. */
  workdir: string;
  env: Record<string, string>;
  /** A string runs with /bin/sh -c; a list is the command as is. The image's ENTRYPOINT, if any, still applies. */
  command: string[] | string;
  /** The container's name: unique on the machine; stop() and cleanup use it. */
  name: string;
  /** A count, or device ids/UUIDs. */
  gpus?: number | string[];
  /** From containerSettings(). */
  network: string;
  extraOptions: string[];
  /** Environment of the engine's CLI itself (DOCKER_HOST, CONTAINER_HOST...). */
  engineEnv: EngineEnv;
  /** More folders to mount (an image env, read-only). */
  mounts?: { host: string; target: string; readOnly: boolean }[];
  onStdout?(chunk: Uint8Array): void;
  onStderr?(chunk: Uint8Array): void;
}

export interface RunningContainer {
  name: string;
  /** The engine CLI's pid (`docker run` / `podman run`), not the container's. */
  pid: number;
  /** The command's exit code (the engine's own 125-127 when it could not start it). */
  exited: Promise<number>;
  /** `<engine> stop -t GRACE NAME` (SIGTERM, then SIGKILL after grace), then wait for the exit. */
  stop(graceSeconds?: number): Promise<void>;
}

const NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$/;
const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 };

/** Build the `run` arguments (exported for tests and for the bench). */
export async function containerRunArgs(opts: RunContainerOptions, envFile: string | null, passThrough: string[]): Promise<string[]> {
  const { network, extraOptions: extra } = opts;
  const command = typeof opts.command === "string" ? ["/bin/sh", "-c", opts.command] : opts.command;
  if (!command.length) throw new UsageError("the container's command is empty");
  const gpus = opts.gpus === undefined ? [] : await gpuArgs(opts.engine, opts.gpus, opts.engineEnv);
  return [
    "run",
    "--rm",
    "--pull",
    "never",
    "--name",
    opts.name,
    "--label",
    "gpulayer.managed=true",
    "--network",
    network,
    "--volume",
    `${opts.workdir}:${opts.workdir}`,
    "--workdir",
    opts.workdir,
    ...(opts.mounts ?? []).flatMap((m) => ["--volume", `${m.host}:${m.target}${m.readOnly ? ":ro" : ""}`]),
    ...(envFile ? ["--env-file", envFile] : []),
    ...passThrough.flatMap((k) => ["--env", k]),
    ...gpus,
    ...extra,
    opts.image,
    ...command,
  ];
}

/**
 * Start the command in a new container and stream its output. The job's
 * env travels in a private env file (never on the command line, where `ps`
 * shows it); a value with a newline, which env files cannot hold, is passed
 * by name from the CLI's environment.
 */
export async function runContainer(opts: RunContainerOptions): Promise<RunningContainer> {
  if (!NAME.test(opts.name)) throw new UsageError(`not a container name: ${JSON.stringify(opts.name)} (letters, digits, _ . -)`);
  const workdir = resolve(opts.workdir);
  if (!isAbsolute(opts.workdir) || workdir === "/") throw new UsageError(`the container's workdir must be an absolute path other than /: ${opts.workdir}`);
  try {
    if (!statSync(workdir).isDirectory()) throw new Error("not a directory");
  } catch {
    throw new UsageError(`the container's workdir is not a directory: ${workdir}`);
  }
  for (const k of Object.keys(opts.env)) if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new UsageError(`not an environment variable name: ${JSON.stringify(k)}`);
  const inFile = Object.entries(opts.env).filter(([, v]) => !/[\n\r\0]/.test(v));
  const passThrough = Object.keys(opts.env).filter((k) => /[\n\r]/.test(opts.env[k]!));
  let tmp: string | null = null;
  let envFile: string | null = null;
  if (inFile.length) {
    tmp = mkdtempSync(join(tmpdir(), "gpulayer-env-"));
    envFile = join(tmp, "env");
    writeFileSync(envFile, inFile.map(([k, v]) => `${k}=${v}\n`).join(""), { mode: 0o600 });
    chmodSync(envFile, 0o600);
  }
  const cleanup = () => {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    tmp = null;
  };
  let proc: Bun.Subprocess<"ignore", "pipe", "pipe">;
  try {
    const args = await containerRunArgs({ ...opts, workdir }, envFile, passThrough);
    const cliEnv: Record<string, string | undefined> = { ...(opts.engineEnv) };
    for (const k of passThrough) cliEnv[k] = opts.env[k];
    proc = Bun.spawn([opts.engine.bin, ...args], { env: cliEnv, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  } catch (error) {
    cleanup();
    if (error instanceof UserError) throw error;
    throw new UserError(`cannot start ${opts.engine.name}: ${(error as Error).message}`);
  }
  const pump = async (stream: ReadableStream<Uint8Array>, sink?: (c: Uint8Array) => void) => {
    for await (const chunk of stream) sink?.(chunk);
  };
  let ended = false;
  // The engine's own failure to start the command, said as gpulayer says a host command's (start-failure.ts).
  const failure = new StartFailure((c) => opts.onStderr?.(c));
  const exited = (async () => {
    try {
      await Promise.all([
        pump(proc.stdout, (c) => {
          failure.started();
          opts.onStdout?.(c);
        }),
        pump(proc.stderr, (c) => failure.stderr(c)),
      ]);
      await proc.exited;
      const signal = proc.signalCode;
      const code = proc.exitCode ?? ExitCode.signalBase + (signal ? (SIGNALS[signal] ?? 0) : 0);
      const line = failure.end(code);
      if (line) opts.onStderr?.(new TextEncoder().encode(`gpulayer: ${line}\n`));
      return code;
    } finally {
      ended = true;
      cleanup();
    }
  })();

  const stop = async (graceSeconds = 10) => {
    if (ended) return;
    const grace = Math.max(0, Math.round(graceSeconds));
    const started = Date.now();
    for (;;) {
      const r = await engineExec(opts.engine, ["stop", "-t", String(grace), opts.name], { env: opts.engineEnv, timeoutMs: (grace + 30) * 1000 });
      if (r.code === 0 || ended) break;
      const message = engineMessage(`${r.stderr}\n${r.stdout}`);
      // Not created yet (stop came right after start): try again for a while.
      if (/no such container|no container with name or id/i.test(message) && Date.now() - started < 15_000) {
        await sleep(200);
        continue;
      }
      proc.kill("SIGKILL");
      await engineExec(opts.engine, ["rm", "-f", opts.name], { env: opts.engineEnv, timeoutMs: 30_000 });
      break;
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = await Promise.race([exited.then(() => false), new Promise<boolean>((r) => (timer = setTimeout(() => r(true), (grace + 15) * 1000)))]);
    clearTimeout(timer);
    if (timedOut) {
      proc.kill("SIGKILL");
      await removeContainer(opts.engine, opts.name, opts.engineEnv);
    }
  };

  return { name: opts.name, pid: proc.pid, exited, stop };
}

/** Force-remove a container by name (after a runner died); no error when it is already gone. */
export async function removeContainer(engine: Engine, name: string, env: EngineEnv): Promise<void> {
  await engineExec(engine, ["rm", "-f", name], { env, timeoutMs: 30_000 });
}

/** Is a container of this name still there (running or not)? */
export async function containerExists(engine: Engine, name: string, env: EngineEnv): Promise<boolean> {
  const r = await engineExec(engine, ["container", "inspect", name], { env, timeoutMs: 30_000 });
  return r.code === 0;
}
