/** The machine's GPUs, by index (and UUID, which CUDA_VISIBLE_DEVICES takes when there is one). */
export interface LocalGpu {
  index: number;
  uuid: string | null;
}

/**
 * The GPUs of this machine a job started here may use: inside a Slurm
 * allocation (sbatch, srun, salloc), only those Slurm gave it, never more.
 * nvidia-smi lists every GPU of the node whatever the allocation, so its list
 * is bounded by what the allocation names:
 * - CUDA_VISIBLE_DEVICES (Slurm sets it for a job or step with GPUs; a user may
 *   too): indexes or UUIDs (a unique prefix is enough for CUDA); empty, "-1" or
 *   "NoDevFiles": none;
 * - else, in a Slurm job: SLURM_STEP_GPUS, else SLURM_JOB_GPUS (the node's
 *   indexes); neither: the allocation has no GPU;
 * - else (no allocation): all of them.
 */
export function allocatedGpus<G extends LocalGpu>(gpus: G[], env: Record<string, string | undefined>): G[] {
  const visible = env.CUDA_VISIBLE_DEVICES;
  if (visible !== undefined) {
    const named = listed(visible);
    return gpus.filter((g) => named.some((n) => n === String(g.index) || (g.uuid !== null && n.length > 4 && g.uuid.startsWith(n))));
  }
  if (env.SLURM_JOB_ID === undefined) return gpus;
  const indexes = listed(env.SLURM_STEP_GPUS ?? env.SLURM_JOB_GPUS ?? "");
  return gpus.filter((g) => indexes.includes(String(g.index)));
}

function listed(value: string): string[] {
  const names = value.split(",").map((s) => s.trim()).filter(Boolean);
  return names.some((n) => n === "-1" || n === "NoDevFiles") ? [] : names;
}

/** The names the given GPUs go by, for CUDA_VISIBLE_DEVICES and a container engine alike: the UUID when known (the same inside any allocation or container), else the index. */
export function gpuDeviceIds(gpus: LocalGpu[], indexes: number[]): string[] {
  return indexes.map((i) => gpus.find((g) => g.index === i)?.uuid ?? String(i));
}

/** A job without tasks run here: the first `count` of the GPUs here (of the allocation), by id; undefined when it asks for none. */
export function firstGpuIds(gpus: LocalGpu[] | null, count: number): string[] | undefined {
  return gpus && count ? gpuDeviceIds(gpus, gpus.slice(0, count).map((g) => g.index)) : undefined;
}
