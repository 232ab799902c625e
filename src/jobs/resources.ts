/**
 * One rule for resources, wherever a job runs: a job (or a task of one) that
 * needs more GPUs than any machine it can run on has is refused before it is
 * recorded or built, in the same words here (this machine) and on a server
 * (its workers that match the job's labels), so the same job fails the same
 * way in both places. Pure: the callers count the GPUs.
 */

/** What a job asks, as the local spec and the server's spec both hold it. */
export interface ResourceAsk {
  resources: { gpus: number };
  tasks?: { name: string; spec: { resources: { gpus: number } } }[];
}

/**
 * The refusal line, or null when the job fits somewhere. `places` holds the
 * GPU count of each machine the job can run on (one: this machine; on a
 * server, each worker matching its labels, offline ones too: they may come
 * back). With no place at all there is nothing to say here: other rules do.
 */
export function gpuRefusal(job: ResourceAsk, places: number[]): string | null {
  if (!places.length) return null;
  const most = Math.max(...places);
  const asks = job.tasks ? job.tasks.map((t) => [`task ${t.name}`, t.spec.resources.gpus] as const) : [["job", job.resources.gpus] as const];
  for (const [what, gpus] of asks) {
    if (gpus > most) return `${what} refused: it needs ${gpus} GPU${gpus === 1 ? "" : "s"}; no machine it can run on has more than ${most}`;
  }
  return null;
}

/** Whether a job asks for any GPU (only then are the machine's GPUs counted: nvidia-smi is not run for nothing). */
export function asksForGpus(job: ResourceAsk): boolean {
  return job.tasks ? job.tasks.some((t) => t.spec.resources.gpus > 0) : job.resources.gpus > 0;
}
