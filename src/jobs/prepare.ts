import type { EngineHost, EnsureHooks, EnsureResult } from "../docker/index.ts";
import type { ImageEnvResult } from "../docker/image-env.ts";
import type { HomeLayout } from "../config/paths.ts";
import { condaActivation, refuseOnImage } from "../env/index-light.ts";
import type { PrepareHooks, PrepareResult } from "../env/index-light.ts";
import { prepareEnv } from "../env/index-light.ts";
import { type EnvSettings, environmentRequest, hostRequest, type RequestAt, requestDir } from "../env/index-light.ts";
import type { Shipping } from "../env/index-light.ts";

/**
 * The one prepare: what a request needs before its command can run, on a host
 * (its env, on a conda environment's Python when it names one) or in an image
 * (the image, and the env of its requirements on top of it). The local runner,
 * a worker's job and prepare tasks, and `env prepare` all call it, so one
 * request is the same env, by the same key, wherever it is prepared.
 */

/** The settings a prepare reads, resolved once at the top: the env's, and the container engine's for an image. */
export interface PrepareSettings extends EnvSettings {
  engine: EngineHost;
  container: { network: string };
}

export interface PrepareTarget extends RequestAt {
  /** The image pull policy (`--pull`); the default: pull when missing. */
  pull?: string;
  /** GPUs the run will ask the engine for: an image run checks now that the engine can give them, not after the start. */
  gpus?: number;
  /** A job's: leases on what it prepared (env, image), held until release(), so gc leaves them be. */
  holder?: string;
  /** A cancel: the running installer's process group is killed and nothing half-built is kept. */
  signal?: AbortSignal;
  /** A joined worker's env artifacts: fetched before a build, shared after one (env/store/shipping.ts). */
  shipping?: Shipping;
  /** For a run: the variables the command inherits (a conda environment's activation among them). */
  forRun?: boolean;
  hooks?: {
    env?: PrepareHooks;
    image?: EnsureHooks;
    /** The image is there (and can give the GPUs); what comes next is its env, when the request has requirements. */
    onImage?(image: EnsureResult, withEnv: boolean): void;
  };
}

/** A folder of this machine in the run's container. */
export interface Mount {
  host: string;
  target: string;
  readOnly: boolean;
}

/** What the run needs: the env (or the image and its env's mount), the variables it puts first, and the leases to let go of. */
export type Prepared =
  | {
      kind: "host";
      env: PrepareResult;
      /** With forRun: what the command inherits before its own variables (the settings' env, a conda activation). */
      inherited: Record<string, string>;
      /** The env's own, over the command's: its bin first on PATH, VIRTUAL_ENV. */
      vars: Record<string, string>;
      release(): void;
    }
  | {
      kind: "image";
      image: EnsureResult;
      env: ImageEnvResult | null;
      mounts: Mount[];
      vars: Record<string, string>;
      release(): void;
    };

/** True when the request asks for packages: an image alone is run as it is. */
export const hasRequirements = (request: RequestAt["request"]): boolean => Boolean(request.requirementsFile || request.specs.length || request.project !== undefined);

export async function prepare(layout: HomeLayout, settings: PrepareSettings, target: PrepareTarget): Promise<Prepared> {
  // A request from a server was refused by no job spec here: the same refusal, before anything is pulled.
  refuseOnImage(target.request);
  return target.request.image === undefined ? prepareHost(layout, settings, target) : prepareImage(layout, settings, target, target.request.image);
}

async function prepareHost(layout: HomeLayout, settings: PrepareSettings, target: PrepareTarget): Promise<Prepared> {
  const env = await prepareEnv(layout, { ...hostRequest(settings, target), signal: target.signal }, { hooks: target.hooks?.env, leaseHolder: target.holder, shipping: target.shipping });
  const release = () => env.lease?.release();
  try {
    let inherited: Record<string, string> = {};
    if (target.forRun) {
      for (const [k, val] of Object.entries(settings.env)) if (k !== "PYTHONHOME") inherited[k] = val;
      // As `conda activate` leaves a shell (its variables, its activate.d scripts); the env goes on top, as a venv's activation.
      if (env.conda) inherited = await condaActivation(env.conda, inherited);
    }
    const vars = { PATH: `${env.path}/bin:${inherited.PATH ?? "/usr/bin:/bin"}`, VIRTUAL_ENV: env.path };
    return { kind: "host", env, inherited, vars, release };
  } catch (error) {
    release();
    throw error;
  }
}

async function prepareImage(layout: HomeLayout, settings: PrepareSettings, target: PrepareTarget, ref: string): Promise<Prepared> {
  // Loaded for an image only: the container code (and the YAML parser it brings) costs a warm host prepare milliseconds.
  const { ensureImage, gpuArgs, parsePullPolicy } = await import("../docker/index.ts");
  const image = await ensureImage(layout, ref, { ...target.hooks?.image, pull: parsePullPolicy(target.pull), host: settings.engine, leaseHolder: target.holder });
  try {
    // A machine without the NVIDIA runtime/CDI fails here, in task.prepare, not after the run started.
    if (target.gpus) await gpuArgs(image.engine, target.gpus, settings.engine.env);
    const withEnv = hasRequirements(target.request);
    target.hooks?.onImage?.(image, withEnv);
    const env = withEnv ? await imageEnv(layout, settings, target, image) : null;
    const release = () => {
      env?.lease?.release();
      image.lease?.release();
    };
    if (!env) return { kind: "image", image, env, mounts: [], vars: {}, release };
    // The env first on the image's own PATH, as a venv's activation would put it.
    return { kind: "image", image, env, mounts: [{ host: env.path, target: env.mount, readOnly: true }], vars: { PATH: `${env.mount}/bin:${env.python.path}`, VIRTUAL_ENV: env.mount }, release };
  } catch (error) {
    image.lease?.release();
    throw error;
  }
}

/** The env on top of the image, for its own Python (docker/image-env.ts): the same request, read where a host build reads it. */
async function imageEnv(layout: HomeLayout, settings: PrepareSettings, target: PrepareTarget, image: EnsureResult): Promise<ImageEnvResult> {
  const { ensureImageEnv } = await import("../docker/image-env.ts");
  const dir = requestDir(target);
  const r = environmentRequest(target.request, dir);
  return ensureImageEnv(
    layout,
    { ref: image.image, imageId: image.imageId, engine: image.engine },
    // The image's own Python runs the env; the host's (the default) fetches the pinned uv and reads the pip configuration.
    { ...r, cwd: dir, confineTo: target.request.confineTo, env: settings.env, network: settings.container.network, uv: settings.uv, python: settings.defaultPython },
    // prepare_timeout (the request's, else the machine's) holds for the image's env as for a host's.
    { engineEnv: settings.engine.env, hooks: { onStep: target.hooks?.env?.onStep }, leaseHolder: target.holder, signal: target.signal, timeoutMs: r.prepareTimeoutMs ?? settings.prepareTimeoutMs },
  );
}
