import { join } from "node:path";

/**
 * Every path under the home, named here and nowhere else. Versioned buckets (as uv's cache does): a layout change
 * bumps the bucket's suffix (`envs-v1` → `envs-v2`), never reinterprets old entries; the unsuffixed names are the
 * first version of their layout, kept as they are so that existing homes stay readable.
 */
export interface HomeLayout {
  root: string;
  envs: string;
  locks: string;
  leases: string;
  trash: string;
  interpreters: string;
  /** Stat caches of local inputs' content digests (path, size, mtime, inode → sha256), as git's index. */
  digests: string;
  tools: string;
  jobs: string;
  images: string;
  /** Wheels compiled without build isolation, by sdist and what their build saw (env/build/wheelhouse.ts). */
  wheelhouse: string;
  /** Modules' code compiled once per source content and interpreter, for every env's bytecode (env/build/bytecode.ts). */
  bytecode: string;
  /** Per build user (worker.run_as) caches, `<users>/<uid>/cache`. */
  users: string;
  /** A worker's (`gpulayer join`) own state: the folders and files below. */
  cluster: string;
  /** Remote tasks' working folders (a --run-as job user reaches them). */
  clusterWork: string;
  /** Copies of remote jobs' bundles, fetched and unpacked. */
  clusterBundles: string;
  /** Env artifacts packed here to be shared with the server. */
  clusterArtifacts: string;
  /** The worker's identities with servers, one file per server. */
  identity: string;
  /** Jobs' output and events waiting to reach the server (SQLite). */
  outbox: string;
  /** What `join` saved for later joins (--python). */
  workerSettings: string;
  /** The server's state: its token, its SQLite database, bundles and artifacts. */
  server: string;
  configFile: string;
}

/** `root` is the `home` setting (src/config/table.ts): GPULAYER_HOME, else $XDG_CACHE_HOME/gpulayer, else ~/.cache/gpulayer. */
export function homeLayout(root: string, configFile: string = join(root, "config.yaml")): HomeLayout {
  const cluster = join(root, "cluster");
  return {
    root,
    envs: join(root, "envs-v1"),
    locks: join(root, "locks"),
    leases: join(root, "leases"),
    trash: join(root, "trash"),
    interpreters: join(root, "interpreters-v1"),
    digests: join(root, "digests-v2"),
    tools: join(root, "tools"),
    jobs: join(root, "jobs"),
    images: join(root, "images-v1"),
    wheelhouse: join(root, "wheelhouse-v1"),
    bytecode: join(root, "bytecode-v1"),
    users: join(root, "users"),
    cluster,
    clusterWork: join(cluster, "work"),
    clusterBundles: join(cluster, "bundles"),
    clusterArtifacts: join(cluster, "artifacts"),
    identity: join(cluster, "identity"),
    outbox: join(cluster, "outbox.db"),
    workerSettings: join(root, "worker.json"),
    server: join(root, "server"),
    configFile,
  };
}

/** A worker's copy of one job bundle: as fetched, unpacked, its last use (mtime), and the lock its fetch and gc share. */
export interface BundlePaths {
  hash: string;
  file: string;
  dir: string;
  lastUsed: string;
  lock: string;
}

export function bundlePaths(layout: HomeLayout, hash: string): BundlePaths {
  const root = layout.clusterBundles;
  return { hash, file: join(root, `${hash}.tar.gz`), dir: join(root, hash), lastUsed: join(root, `${hash}.last-used`), lock: join(layout.locks, `bundle-${hash}`) };
}
