import { UsageError } from "../errors.ts";
import { shellSplit } from "./shellwords.ts";

/** Settings of container runs: container.network and container.options (shell-split). */
export interface ContainerSettings {
  network: string;
  extraOptions: string[];
}

export function containerSettings(network: string, options: string): ContainerSettings {
  if (network.startsWith("-") || /\s/.test(network)) throw new UsageError(`container.network: not a network mode: ${JSON.stringify(network)}`);
  return { network, extraOptions: shellSplit(options, "container.options") };
}
