/** YAML, loaded on first use: a job run without a job file (or without a podman GPU lookup) never pays for the parser's start-up (~3 ms). */
export function parseYaml(text: string): unknown {
  return (require("yaml") as typeof import("yaml")).parse(text);
}

/**
 * A job file: as parseYaml, but a variable of an `env` mapping (the job's, or a task's) is what the file says, as
 * written: `VERSION: 1.10` is "1.10" and `MODE: 0x1F` "0x1F", where YAML would read numbers (1.1, 31) that a shell
 * never would. The first error is thrown, as parse() throws it; warnings are not printed.
 */
export function parseJobYaml(text: string): unknown {
  const Y = require("yaml") as typeof import("yaml");
  const doc = Y.parseDocument(text);
  if (doc.errors.length) throw doc.errors[0];
  // An alias (`env: *common`, `V: *version`) stands for its anchor's node: read through it.
  const through = (node: unknown) => (Y.isAlias(node) ? node.resolve(doc) : node);
  const asWritten = (envNode: unknown) => {
    const env = through(envNode);
    if (!Y.isMap(env)) return;
    for (const pair of env.items) {
      const value = through(pair.value);
      // A new node for this variable: an anchored one may stand elsewhere too, as what YAML reads.
      if (Y.isScalar(value) && ["number", "boolean", "bigint"].includes(typeof value.value) && typeof value.source === "string") pair.value = new Y.Scalar(value.source);
    }
  };
  const top = doc.contents;
  if (Y.isMap(top)) {
    asWritten(top.get("env", true));
    const tasks = top.get("tasks", true);
    if (Y.isMap(tasks)) for (const task of tasks.items) if (Y.isMap(task.value)) asWritten(task.value.get("env", true));
  }
  return doc.toJS();
}
