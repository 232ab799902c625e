/** YAML, loaded on first use: a job run without a job file (or without a podman GPU lookup) never pays for the parser's start-up (~3 ms). */
export function parseYaml(text: string): unknown {
  return (require("yaml") as typeof import("yaml")).parse(text);
}
