/**
 * The tasks of a job and what each needs: one check for a job file
 * (jobs/spec.ts) and for a job a server is sent (server/jobs-api.ts), so
 * both refuse the same jobs with the same words. Linear in tasks and needs:
 * a server runs it on whatever a request holds.
 */

export interface TaskGraphProblem {
  /** Where: `tasks`, or `tasks.NAME.needs`. */
  at: string;
  problem: string;
}

/** Names unique, every need another task of the job, no cycle of needs; null when all hold. */
export function taskGraphProblem(tasks: { name: string; needs: string[] }[]): TaskGraphProblem | null {
  const names = new Set<string>();
  for (const t of tasks) {
    if (names.has(t.name)) return { at: "tasks", problem: `two tasks are named ${t.name}` };
    names.add(t.name);
  }
  for (const t of tasks) {
    for (const n of t.needs) {
      if (n === t.name) return { at: `tasks.${t.name}.needs`, problem: "a task cannot need itself" };
      if (!names.has(n)) return { at: `tasks.${t.name}.needs`, problem: `no task named ${n} (tasks: ${[...names].join(", ")})` };
    }
  }
  const cycle = needsCycle(tasks);
  return cycle ? { at: "tasks", problem: `a cycle of needs: ${cycle.join(" → ")}` } : null;
}

/** A cycle of needs among tasks (its names, the first repeated at the end), or null. Depth-first without recursion: a chain of any length. */
function needsCycle(tasks: { name: string; needs: string[] }[]): string[] | null {
  const needs = new Map(tasks.map((t) => [t.name, t.needs]));
  const state = new Map<string, "visiting" | "done">();
  for (const root of tasks) {
    if (state.has(root.name)) continue;
    // The path being walked, and how far each of its tasks' needs have been looked at.
    const path: string[] = [root.name];
    const next: number[] = [0];
    state.set(root.name, "visiting");
    while (path.length) {
      const top = path.length - 1;
      const own = needs.get(path[top]!) ?? [];
      if (next[top]! >= own.length) {
        state.set(path.pop()!, "done");
        next.pop();
        continue;
      }
      const m = own[next[top]!++]!;
      if (state.get(m) === "visiting") return [...path.slice(path.indexOf(m)), m];
      if (state.has(m) || !needs.has(m)) continue;
      state.set(m, "visiting");
      path.push(m);
      next.push(0);
    }
  }
  return null;
}
