import type { ArgsDef } from "citty";
import { buildOutputArgs, installerArgs, labelArgs, placeArgs } from "../_args.ts";

/** `env prepare`'s flags: the command's and its warm lane's one definition (the lane reads argv over it with plainArgs, held to citty's reading). */
export const prepareArgs = {
  requirements: { type: "positional", required: false, valueHint: "REQ_FILE", description: "A requirements file (pip's format: -r/-c includes, options, markers)" },
  package: { type: "string", alias: "p", valueHint: "SPEC", description: "A requirement such as 'numpy<3' (repeatable)" },
  image: { type: "string", valueHint: "REF", description: "Pull a container image ahead of jobs (Docker or Podman), or find it already here" },
  pull: { type: "string", valueHint: "missing|always|never", description: "With --image: pull only when missing (default), always, or never" },
  "dry-run": { type: "boolean", description: "Show the key, whether it would reuse or build, and every input the key covers; build nothing" },
  ...installerArgs,
  ...placeArgs,
  ...labelArgs,
  ...buildOutputArgs,
} as const satisfies ArgsDef;

/** `job run` names its file with -r; here it is the argument. */
export const FROM_JOB_RUN = Object.fromEntries(["-r", "--requirement"].map((f) => [f, "the requirements file is the argument here (gpulayer env prepare requirements.txt)"]));
