import { closeSync, existsSync, openSync, readSync } from "node:fs";
import { reconcile } from "./detach.ts";
import { FINAL_STATES } from "./model.ts";
import type { JobRecord, JobStore } from "./store.ts";
import { sleep } from "../core/sleep.ts";

/** Read a job's log from the start; with follow, keep reading until the job has ended and the log is drained. */
export async function followLog(store: JobStore, id: string, follow: boolean, write: (chunk: Uint8Array) => void): Promise<void> {
  const path = store.logPath(id);
  let offset = 0;
  const buf = new Uint8Array(64 * 1024);
  const drain = () => {
    if (!existsSync(path)) return;
    const fd = openSync(path, "r");
    try {
      for (;;) {
        const n = readSync(fd, buf, 0, buf.length, offset);
        if (n <= 0) break;
        offset += n;
        write(buf.slice(0, n));
      }
    } finally {
      closeSync(fd);
    }
  };
  drain();
  if (!follow) return;
  for (;;) {
    const job = reconcile(store, store.get(id)!);
    drain();
    if (FINAL_STATES.includes(job.state)) return;
    await sleep(100);
  }
}

/** A job once it has ended (a job of tasks records its end after its tasks'). */
export async function jobEnd(store: JobStore, id: string): Promise<JobRecord> {
  for (;;) {
    const job = reconcile(store, store.get(id)!);
    if (FINAL_STATES.includes(job.state)) return job;
    await sleep(100);
  }
}
