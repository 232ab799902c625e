/**
 * Where a job, or a task of a job, stands: the same words on one machine
 * (the SQLite job store) and on a fleet (the server's database), which keep
 * them as these strings.
 */

/** `skipped`: a task of a job that never started, because a task it needs failed or the job was cancelled first. */
export const JOB_STATES = ["queued", "preparing", "running", "succeeded", "failed", "cancelled", "skipped"] as const;
export type JobState = (typeof JOB_STATES)[number];

/** The states a job or task never leaves. */
export const FINAL_STATES: readonly JobState[] = ["succeeded", "failed", "cancelled", "skipped"];

/** Whether a state (as stored: any string) is one a job never leaves. */
export function isFinal(state: string): boolean {
  return (FINAL_STATES as readonly string[]).includes(state);
}
