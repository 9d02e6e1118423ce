/**
 * Moat's side of a sandbox supervisor (supervisor/main.py): the process that builds one
 * sandbox (its namespaces, file system and identities) and brings its roles to Moat. It runs as
 * the host's root outside the sandbox; its sandbox lives exactly as long as it does.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../process/index.js';
import type { AgentSocket } from './agent-socket.js';
import type { RoleConnection } from './role-connection.js';

export const PYTHON = '/usr/bin/python3';
const SUPERVISOR_DIR = path.join(packageRoot() ?? '.', 'src', 'runtime', 'supervisor');
export const SUPERVISOR = path.join(SUPERVISOR_DIR, 'main.py');
export const LAYER_TOOL = path.join(SUPERVISOR_DIR, 'layer_tool.py');
export const FLOW_LOG = path.join(SUPERVISOR_DIR, 'flow_log.py');
/** Lines a supervisor writes to Moat are a few hundred bytes; more is a broken supervisor. */
const MAX_LINE = 64 << 10;
const READY_TIMEOUT_MS = 30_000;
const REFILL_DELAY_MS = 50;

export type RoleKind = 'proc' | 'file';

/** How long a sandbox's roles may go without progress while Moat waits on them. */
export interface RolesDeadline {
  readonly ms: number;
  /** A role missed it (it is then ended and started again on next use). */
  readonly onMissed: (kind: RoleKind, user: string) => void;
  /** True while the sandbox is frozen (paused, or held still for a snapshot): no role misses it then. */
  readonly excused: () => boolean;
}

/** What the supervisor builds; see supervisor/main.py and sandbox_init.py for each field. */
export interface SupervisorConfig {
  readonly sandboxID: string;
  readonly mode: 'confined' | 'unconfined';
  readonly socket: string;
  readonly netns: string | null;
  readonly cgroups: readonly string[];
  readonly ids: { readonly host: number; readonly store: number; readonly count: number };
  /** Confined: the empty folder the sandbox's `/` is mounted on; unconfined: the sandbox's folder. */
  readonly root: string;
  /** An empty folder the supervisor mounts its scratch space on. */
  readonly scratch: string;
  readonly overlays: readonly {
    readonly target: string;
    readonly lowers: readonly { readonly path: string; readonly ids: 'host' | 'store' }[];
    readonly upper: string;
    readonly work: string;
  }[];
  /** Mounted read-only over the sandbox's /etc/ssl/certs/ca-certificates.crt (confined). */
  readonly trustBundle: string | null;
  readonly hostname: string;
  readonly shmBytes: number;
  readonly limits: { readonly nofile: number; readonly ptys: number };
  readonly users: Readonly<Record<string, { uid: number; gid: number; home: string }>>;
  readonly seccomp: boolean;
}

/** Why a supervisor cannot start here (no python3 at the path Moat runs), or undefined. */
export function supervisorProblem(): string | undefined {
  if (!existsSync(PYTHON)) {
    return `${PYTHON} is needed to start sandboxes (Debian package python3)`;
  }
  if (!existsSync(SUPERVISOR)) return `${SUPERVISOR} is missing from Moat's package`;
  return undefined;
}

/** What a supervisor does before its sandbox exists (see supervisor/main.py). */
export interface EarlyConfig {
  /** Cgroup folders to join (confined). */
  readonly cgroups: readonly string[];
  /** The sandbox's host ids, for its user namespaces (confined), or null. */
  readonly ids: { readonly host: number; readonly store: number; readonly count: number } | null;
  /** The sandbox's user namespace's own limits: /proc/sys/user file names and values. */
  readonly userLimits?: Readonly<Record<string, number>>;
}

/** A supervisor process, done with `early`, waiting for its sandbox's configuration on stdin. */
export function spawnSupervisor(early: EarlyConfig): ChildProcess {
  const child = spawn(PYTHON, ['-I', '-S', '-B', SUPERVISOR], {
    cwd: '/',
    env: {},
    // Its own process group: unconfined, the group holds every process of the sandbox.
    detached: true,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  child.on('error', () => undefined);
  child.stdin!.on('error', () => undefined);
  child.stdin!.write(`${JSON.stringify(early)}\n`);
  return child;
}

/**
 * One sandbox's supervisor made ahead of its sandbox: Python's start-up, the cgroup joins (the
 * kernel waits for an RCU grace period on each) and the user namespaces are paid before a
 * create asks, not during it. `make` gives the spare what it needs (a cgroup, a slot of ids);
 * `discard` takes that back from a spare nobody took.
 */
export class SupervisorSpares<T extends { readonly child: ChildProcess }> {
  private spare: Promise<T> | undefined;
  private stopped = false;

  constructor(
    private readonly make: () => Promise<T>,
    private readonly discard: (spare: T) => Promise<void>,
  ) {}

  /** The spare (or a new one where there is none, or it died); the next is made soon. */
  async take(): Promise<T> {
    const pending = this.spare;
    this.spare = undefined;
    // A little later: the sandbox that takes this one is starting its first command now.
    setTimeout(() => this.refill(), REFILL_DELAY_MS).unref();
    const spare = await pending?.catch(() => undefined);
    if (spare !== undefined && spare.child.exitCode === null && spare.child.signalCode === null) {
      return spare;
    }
    if (spare !== undefined) await this.discard(spare);
    return this.make();
  }

  refill(): void {
    if (this.spare === undefined && !this.stopped) this.spare = this.make();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    const spare = await this.spare?.catch(() => undefined);
    this.spare = undefined;
    if (spare === undefined) return;
    spare.child.kill('SIGKILL');
    await this.discard(spare);
  }
}

export class Supervisor {
  private readonly roles = new Map<string, Promise<RoleConnection>>();
  private readonly spawns = new Map<string, string>();
  private stderr = '';
  private failure: Error | undefined;
  private markReady: (pid: number) => void = () => undefined;
  private markFailed: (error: Error) => void = () => undefined;
  /** Resolves with the sandbox init's host pid once the sandbox is built. */
  readonly ready = new Promise<number>((resolve, reject) => {
    this.markReady = resolve;
    this.markFailed = reject;
  });
  private markExited: () => void = () => undefined;
  /** Resolves once the supervisor (and with it the sandbox's processes) is gone. */
  readonly exited = new Promise<void>((resolve) => (this.markExited = resolve));

  constructor(
    private readonly config: SupervisorConfig,
    private readonly agents: AgentSocket,
    /** A process from SupervisorSpares, not yet configured. */
    private readonly child: ChildProcess,
    private readonly deadline?: RolesDeadline,
  ) {
    this.ready.catch(() => undefined);
    const timer = setTimeout(
      () => this.fail(new Error(`not built within ${READY_TIMEOUT_MS / 1000} s`)),
      READY_TIMEOUT_MS,
    );
    void this.ready.finally(() => clearTimeout(timer)).catch(() => undefined);
    let pending = '';
    this.child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      pending += chunk;
      let newline: number;
      while ((newline = pending.indexOf('\n')) >= 0) {
        this.onLine(pending.slice(0, newline));
        pending = pending.slice(newline + 1);
      }
      if (pending.length > MAX_LINE) this.fail(new Error('it wrote an over-long line'));
    });
    this.child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr = (this.stderr + chunk).slice(-4096);
    });
    this.child.stdin!.on('error', () => undefined);
    this.child.on('error', (error) => this.fail(error));
    this.child.on('close', (code, signal) => {
      this.fail(new Error(`it ended (${signal ?? `exit ${code}`})`));
      this.markExited();
    });
    this.child.stdin!.write(`${JSON.stringify(config)}\n`);
  }

  /** The supervisor's host pid (its process group, unconfined). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  get alive(): boolean {
    return this.failure === undefined;
  }

  /** The role of `kind` for `user`, started on first use and again if it ended. */
  role(kind: RoleKind, user: string): Promise<RoleConnection> {
    const key = `${kind}:${user}`;
    const current = this.roles.get(key);
    if (current !== undefined) {
      const alive = current.then(
        (connection) => connection.alive,
        () => false,
      );
      return alive.then((ok) => (ok ? current : this.startRole(key, kind, user)));
    }
    return this.startRole(key, kind, user);
  }

  /** Ends the sandbox: the supervisor, its init and every process in the sandbox. */
  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill('SIGKILL');
    }
  }

  private startRole(key: string, kind: RoleKind, user: string): Promise<RoleConnection> {
    const label = `${kind === 'proc' ? 'launcher' : 'file agent'} of ${user} in sandbox ${this.config.sandboxID}`;
    const started = this.ready.then(() => {
      if (this.failure) throw this.failure;
      const deadline = this.deadline;
      const expected = this.agents.expect(
        label,
        deadline && {
          ms: deadline.ms,
          onMissed: () => deadline.onMissed(kind, user),
          excused: deadline.excused,
        },
      );
      const { spawn } = expected;
      this.spawns.set(spawn, label);
      this.send({ op: 'spawn', spawn, token: expected.token, role: kind, user });
      return expected.connection
        .finally(() => this.spawns.delete(spawn))
        .then((connection) => {
          // Moat is done with it (it missed a deadline, broke the protocol, or ended): a role
          // still there, stopped perhaps, is ended by the sandbox's init.
          void connection.closed.then(() => this.send({ op: 'kill', spawn }));
          return connection;
        });
    });
    this.roles.set(key, started);
    started.catch(() => {
      if (this.roles.get(key) === started) this.roles.delete(key);
    });
    return started;
  }

  private send(request: object): void {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.stdin!.write(`${JSON.stringify(request)}\n`);
    }
  }

  private onLine(line: string): void {
    let event: Record<string, unknown>;
    try {
      event = JSON.parse(line) as Record<string, unknown>;
    } catch {
      this.fail(new Error(`it wrote a line that is not JSON: ${line.slice(0, 200)}`));
      return;
    }
    if (event.ev === 'ready' && Number.isSafeInteger(event.pid)) {
      this.markReady(event.pid as number);
    } else if (event.ev === 'failed') {
      this.fail(new Error(String(event.error).slice(0, 4000)));
    } else if (event.ev === 'spawn-failed' && typeof event.spawn === 'string') {
      this.agents.cancel(
        event.spawn,
        new Error(
          `the ${this.spawns.get(event.spawn) ?? 'role'} could not start: ${String(event.error)}`,
        ),
      );
    }
  }

  private fail(error: Error): void {
    if (this.failure) return;
    const detail = this.stderr.trim();
    this.failure = new Error(
      `the supervisor of sandbox ${this.config.sandboxID} failed: ${error.message}${detail ? `\n${detail}` : ''}`,
    );
    this.markFailed(this.failure);
    for (const spawn of this.spawns.keys()) this.agents.cancel(spawn, this.failure);
    this.kill();
  }
}
