/**
 * Every file in deploy/ is checked here, with the real tools where this machine has them or can
 * install them (root with apt-get): systemd-analyze for the unit, promtool for the Prometheus
 * files and for Moat's real /metrics output, python3-yaml to read the YAML. Checks whose tool is
 * missing and cannot be installed are skipped with the reason printed. What no tool checks
 * offline (the Containerfile, the Kubernetes manifests) is checked against Moat itself: every
 * MOAT_* setting goes through Moat's own configuration parser, ports, paths and commands are
 * followed from one file to the next, and every metric a dashboard or alert names must be in
 * the /metrics output of a Moat that has served some traffic.
 */
import { execFile, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it, type TestContext } from 'vitest';
import { scratchMoatFlags } from '../bench/lib/scratch.js';
import { type RunningMoat, startMoat } from '../src/app/index.js';
import { loadConfig, type MoatConfig } from '../src/config.js';
import type { HostPort } from '../src/net/index.js';
import { SETTINGS } from '../src/config-settings.js';
import { ApiClient } from './support/api-client.js';
import { udpQuery } from './support/dns-client.js';
import { FakeDns } from './support/fake-dns.js';
import { connectThrough, type Origin, readUntil, tcpEchoOrigin } from './support/origins.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const deployFile = (name: string) => path.join(ROOT, 'deploy', name);
const readDeploy = (name: string) => readFileSync(deployFile(name), 'utf8');
const scratchDir = mkdtempSync(path.join(os.tmpdir(), 'moat-deploy-test-'));
afterAll(() => rmSync(scratchDir, { recursive: true, force: true }));

// ---------------------------------------------------------------------------------------------
// Tools: found, installed once per run with apt-get when root, or a reason to skip.

interface Ran {
  readonly status: number | null;
  readonly output: string;
}

/** Runs a tool to completion (blocking: only for tools that need nothing from this process). */
function run(command: string, args: string[], options: { input?: string } = {}): Ran {
  const result = spawnSync(command, args, {
    cwd: ROOT,
    encoding: 'utf8',
    input: options.input,
    timeout: 60_000,
    maxBuffer: 16 << 20,
  });
  const error = result.error ? `${result.error.message}\n` : '';
  return { status: result.status, output: `${error}${result.stdout ?? ''}${result.stderr ?? ''}` };
}

const APT_ENV = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
const installs = new Map<string, boolean>();

/** apt-get install, once per package per run; a fresh machine may need `apt-get update` first. */
function aptInstall(pkg: string): boolean {
  if (!installs.has(pkg)) {
    const install = () =>
      spawnSync('apt-get', ['install', '-y', '--no-install-recommends', pkg], {
        env: APT_ENV,
        stdio: 'ignore',
        timeout: 240_000,
      }).status === 0;
    let ok = install();
    if (!ok) {
      spawnSync('apt-get', ['update'], { env: APT_ENV, stdio: 'ignore', timeout: 240_000 });
      ok = install();
    }
    installs.set(pkg, ok);
  }
  return installs.get(pkg)!;
}

/** Undefined when `works()` holds (after installing `pkg` if needed), else why it does not. */
function provide(what: string, pkg: string, works: () => boolean): string | undefined {
  if (works()) return undefined;
  if (process.getuid?.() !== 0 || !existsSync('/usr/bin/apt-get')) {
    return `${what} is missing; installing Debian package ${pkg} needs root and apt-get`;
  }
  return aptInstall(pkg) && works()
    ? undefined
    : `${what} is missing and apt-get could not install ${pkg}`;
}

const TOOLS = {
  promtool: () =>
    provide('promtool', 'prometheus', () => run('promtool', ['--version']).status === 0),
  systemdAnalyze: () =>
    provide('systemd-analyze', 'systemd', () => run('systemd-analyze', ['--version']).status === 0),
  // Debian's own python3, which python3-yaml installs into (not whatever python3 is on PATH).
  pyyaml: () =>
    provide(
      'python3 with PyYAML',
      'python3-yaml',
      () => run('/usr/bin/python3', ['-c', 'import yaml']).status === 0,
    ),
};

/** Skips the test, saying why, when `missing` is a reason. */
function needs(context: TestContext, missing: string | undefined): void {
  if (missing === undefined) return;
  console.log(`skipped: ${context.task.name}: ${missing}`);
  context.skip();
}

// ---------------------------------------------------------------------------------------------
// Moat's configuration, as the deployment files set it.

const SETTING_BY_ENV = new Map(SETTINGS.map((s) => [s.env, s]));
const SETTING_BY_KEY = new Map(SETTINGS.map((s) => [s.key as string, s]));

/** Moat's effective configuration from environment, config file text and flags; throws if refused. */
function moatConfig(
  env: Record<string, string>,
  options: { file?: string; flags?: Record<string, string> } = {},
): MoatConfig {
  const unknown = Object.keys(env).filter((k) => k.startsWith('MOAT_') && !SETTING_BY_ENV.has(k));
  expect(unknown, 'MOAT_* variables Moat does not know').toEqual([]);
  let file: string | undefined;
  if (options.file !== undefined) {
    file = path.join(mkdtempSync(path.join(scratchDir, 'config-')), 'moat.json');
    writeFileSync(file, options.file);
  }
  const config = loadConfig({ env, flags: options.flags, file });
  if (!config.ok) throw new Error(`Moat refuses this configuration: ${config.error}`);
  return config.value;
}

/** Every listener a configuration switches on, by setting key. */
const listenersOf = (config: MoatConfig): Array<{ key: string; at: HostPort }> =>
  SETTINGS.filter((s) => s.key.endsWith('Listen')).flatMap((s) => {
    const at = config[s.key] as HostPort | undefined;
    return at ? [{ key: s.key, at }] : [];
  });

/** Flags that keep an in-process Moat on loopback with free ports. */
const LOOPBACK_FLAGS = {
  'dns-listen': '127.0.0.1:0',
  'dns-upstream': '127.0.0.1:9',
  'proxy-listen': '127.0.0.1:0',
  'transparent-listen': 'off',
  'log-level': 'silent',
};

/** YAML documents as JSON values, read by PyYAML (safe_load_all). */
function parseYaml(name: string): unknown[] {
  const script =
    'import json, sys, yaml\nprint(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))';
  const result = run('/usr/bin/python3', ['-c', script, deployFile(name)]);
  if (result.status !== 0) throw new Error(`${name} does not parse as YAML:\n${result.output}`);
  return (JSON.parse(result.output) as unknown[]).filter((doc) => doc !== null);
}

// ---------------------------------------------------------------------------------------------
describe('deploy/', () => {
  const files = readdirSync(path.join(ROOT, 'deploy'), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => path.relative(path.join(ROOT, 'deploy'), path.join(e.parentPath, e.name)))
    .sort();

  /** Files a suite of their own checks, by that suite (relative to this folder). */
  const CHECKED_ELSEWHERE: Record<string, string> = {
    'kubernetes/cni.yaml': '../test/cni/kubernetes.test.ts',
  };

  it('has no file that this test (or the suite it names) does not check and deploy/README.md does not explain', () => {
    const self = readFileSync(fileURLToPath(import.meta.url), 'utf8');
    const readme = readDeploy('README.md');
    expect(files.length).toBeGreaterThan(10);
    for (const file of files.filter((f) => f !== 'README.md')) {
      const checker = CHECKED_ELSEWHERE[file];
      const where = checker === undefined ? self : readDeploy(checker);
      expect(where, `${file} is checked ${checker ?? 'here'}`).toContain(
        checker === undefined ? `'${file}'` : path.basename(file),
      );
      expect(readme, `${file} is in the README`).toContain(file);
    }
  });

  it('has only YAML that parses and JSON that parses', (context) => {
    const json = files.filter((f) => f.endsWith('.json'));
    for (const file of json) expect(() => JSON.parse(readDeploy(file)), file).not.toThrow();
    needs(context, TOOLS.pyyaml());
    const yaml = files.filter((f) => /\.ya?ml$/.test(f));
    expect(yaml.length).toBeGreaterThanOrEqual(7);
    for (const file of yaml) expect(parseYaml(file).length, file).toBeGreaterThan(0);
  });
});

// ---------------------------------------------------------------------------------------------
describe('systemd unit', () => {
  const UNIT = 'systemd/moat.service';
  const unit = readDeploy(UNIT);
  /** Directive values in file order (a directive may repeat). */
  const directives = (name: string) =>
    [...unit.matchAll(new RegExp(`^${name}=(.*)$`, 'gm'))].map((m) => m[1]!.trim());

  it('passes systemd-analyze verify without a warning', (context) => {
    needs(context, TOOLS.systemdAnalyze());
    const result = run('systemd-analyze', ['verify', deployFile(UNIT)]);
    expect(result.output).toBe('');
    expect(result.status).toBe(0);
  });

  it('rates at most 5.5 of 10 on systemd-analyze security (offline)', (context) => {
    needs(context, TOOLS.systemdAnalyze());
    const result = run('systemd-analyze', [
      'security',
      '--offline=true',
      '--threshold=55',
      deployFile(UNIT),
    ]);
    const level = /Overall exposure level for .*: ([0-9.]+)/.exec(result.output)?.[1];
    expect(result.status, `exposure ${level}:\n${result.output}`).toBe(0);
  });

  it.each([
    ['ProtectKernelTunables', 'a mount over /proc/sys: a sandbox init cannot mount /proc'],
    ['ProtectKernelLogs', 'a mount over /proc/kmsg: a sandbox init cannot mount /proc'],
    ['ProtectProc', 'a /proc mounted with hidepid: a sandbox init cannot mount its own'],
    ['ProcSubset', 'a /proc mounted with subset=pid: a sandbox init cannot mount its own'],
    ['MemoryDenyWriteExecute', 'V8 needs writable executable memory'],
    ['PrivateDevices', 'it hides the loop devices of sandbox disks'],
    ['PrivateUsers', 'Moat needs real root'],
    ['PrivateNetwork', 'Moat is the network path of its sandboxes'],
    ['DynamicUser', 'Moat needs real root'],
    ['User', 'Moat needs real root'],
  ])('leaves out %s (%s)', (name) => {
    expect(directives(name).filter((v) => !/^(no|false|0|off|root)$/.test(v))).toEqual([]);
  });

  it('starts the built CLI, keeps state writable, and gives Moat time to drain on stop', () => {
    const start = directives('ExecStart')[0]!.split(/\s+/);
    const main = start.find((arg) => arg.endsWith('.js'))!;
    expect(existsSync(path.join(ROOT, path.relative('/opt/moat', main))), main).toBe(true);
    expect(start.at(-1)).toBe('serve');
    const dataDir = directives('Environment')
      .map((e) => /^MOAT_DATA_DIR=(.*)$/.exec(e)?.[1])
      .find(Boolean);
    expect(dataDir).toBe(`/var/lib/${directives('StateDirectory')[0]}`);
    expect(directives('ProtectSystem')).toEqual(['strict']);
    expect(directives('ReadWritePaths').join(' ')).toContain('/sys/fs/cgroup/freezer/moat');
    // serve drains tunnels for up to 5 s after SIGTERM, then stops sandboxes and the store.
    expect(directives('KillMode')).toEqual(['mixed']);
    expect(Number.parseInt(directives('TimeoutStopSec')[0]!, 10)).toBeGreaterThanOrEqual(15);
  });

  it('reads an environment file that Moat accepts line by line, commented keys included', () => {
    expect(directives('EnvironmentFile')).toEqual(['-/etc/moat/moat.env']);
    const lines = readDeploy('systemd/moat.env.example').split('\n');
    const env = Object.fromEntries(
      lines.flatMap((line) => {
        const m = /^([A-Z_][A-Z0-9_]*)=(.*)$/.exec(line);
        return m ? [[m[1]!, m[2]!]] : [];
      }),
    );
    const commented = lines.flatMap((line) => /^#\s*(MOAT_[A-Z_]+)=/.exec(line)?.[1] ?? []);
    expect(commented).toContain('MOAT_API_KEYS');
    expect(commented.filter((name) => !SETTING_BY_ENV.has(name))).toEqual([]);
    const config = moatConfig(env);
    expect(config.apiListen).toEqual({ host: '127.0.0.1', port: 3000 });
  });
});

// ---------------------------------------------------------------------------------------------
interface Instruction {
  readonly keyword: string;
  readonly args: string;
}

/** Dockerfile instructions with continuation lines joined and comments dropped. */
function parseContainerfile(text: string): Instruction[] {
  const instructions: Instruction[] = [];
  let pending = '';
  for (const line of text.split('\n')) {
    if (line.trim().startsWith('#') || (pending === '' && line.trim() === '')) continue;
    const continued = line.endsWith('\\');
    pending += continued ? `${line.slice(0, -1)} ` : line;
    if (continued) continue;
    const [, keyword, args] = /^\s*(\S+)\s*(.*)$/.exec(pending)!;
    instructions.push({ keyword: keyword!.toUpperCase(), args: args!.trim() });
    pending = '';
  }
  return instructions;
}

/** The Containerfile, read once: its instructions, the final stage's ENV and HEALTHCHECK. */
const IMAGE = (() => {
  const instructions = parseContainerfile(readDeploy('container/Containerfile'));
  const all = (keyword: string) => instructions.filter((i) => i.keyword === keyword);
  const finalStage = instructions.slice(instructions.lastIndexOf(all('FROM').at(-1)!));
  const env = Object.fromEntries(
    finalStage
      .filter((i) => i.keyword === 'ENV')
      .flatMap((i) => [...i.args.matchAll(/([A-Za-z_]\w*)=(\S+)/g)])
      .map((m) => [m[1]!, m[2]!]),
  );
  const healthcheck = all('HEALTHCHECK').at(-1)!.args;
  const command = JSON.parse(healthcheck.slice(healthcheck.indexOf('CMD') + 3)) as string[];
  return { instructions, all, finalStage, env, healthcheck: command };
})();

/** Exit code of `command` run without blocking this process (the Moat under test lives here). */
function exitCode(command: string[]): Promise<number | null> {
  return new Promise((resolve) => {
    const child = execFile(command[0]!, command.slice(1), { timeout: 10_000 });
    child.on('close', (code) => resolve(code));
  });
}

describe('container file', () => {
  const { instructions, all, finalStage } = IMAGE;
  const stages = all('FROM').map((i) => /\bAS\s+(\S+)/i.exec(i.args)?.[1]);

  it('uses only Dockerfile instructions, starts with FROM and copies only from earlier stages', () => {
    const known = new Set([
      ...['FROM', 'RUN', 'CMD', 'LABEL', 'EXPOSE', 'ENV', 'ADD', 'COPY', 'ENTRYPOINT', 'VOLUME'],
      ...['USER', 'WORKDIR', 'ARG', 'ONBUILD', 'STOPSIGNAL', 'HEALTHCHECK', 'SHELL'],
    ]);
    expect(instructions.map((i) => i.keyword).filter((k) => !known.has(k))).toEqual([]);
    expect(instructions.find((i) => i.keyword !== 'ARG')?.keyword).toBe('FROM');
    const fromStages = all('COPY').flatMap((i) => /--from=(\S+)/.exec(i.args)?.[1] ?? []);
    expect(fromStages.length).toBeGreaterThan(0);
    for (const stage of fromStages) expect(stages.slice(0, -1)).toContain(stage);
  });

  it('builds on a Node image that satisfies package.json engines', () => {
    const pkg = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as {
      engines: { node: string };
    };
    const minimum = Number(/>=\s*(\d+)/.exec(pkg.engines.node)![1]);
    for (const from of all('FROM')) {
      const major = Number(/^node:(\d+)/.exec(from.args)?.[1]);
      expect(major, from.args).toBeGreaterThanOrEqual(minimum);
    }
  });

  it('copies files that exist and that the ignore file lets into the build context', () => {
    const ignored = readDeploy('container/Containerfile.dockerignore')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l !== '' && !l.startsWith('#'));
    const sources = all('COPY')
      .filter((i) => !i.args.includes('--from='))
      .flatMap((i) => i.args.split(/\s+/).slice(0, -1));
    expect(sources.length).toBeGreaterThan(0);
    for (const source of sources) {
      expect(existsSync(path.join(ROOT, source)), source).toBe(true);
      expect(ignored, source).not.toContain(source.split('/')[0]);
    }
  });

  it('installs the Debian packages that npm start installs (scripts/system-packages.mjs)', () => {
    const script = readFileSync(path.join(ROOT, 'scripts/system-packages.mjs'), 'utf8');
    // What Moat runs with (a benchmark's peer and a test's browser are not shipped).
    const needed = [...script.matchAll(/\{[^{}]*name: '([^']+)'[^{}]*\}/g)]
      .filter((m) => !m[0].includes('only:'))
      .map((m) => m[1]!);
    expect(needed.length).toBeGreaterThan(0);
    const installed = all('RUN')
      .map((i) => i.args)
      .join(' ');
    for (const pkg of needed) expect(installed).toMatch(new RegExp(`\\b${pkg}\\b`));
  });

  it('sets only MOAT_* variables Moat accepts, with the data folder on a volume', () => {
    const config = moatConfig(IMAGE.env);
    expect(all('VOLUME').map((i) => i.args)).toEqual([JSON.stringify([config.dataDir])]);
    // Published ports reach the listeners outside the sandboxes only beyond loopback.
    for (const key of ['apiListen', 'sandboxListen', 'metricsListen'] as const)
      expect(config[key]?.host, key).toBe('0.0.0.0');
    expect(all('USER').map((i) => i.args)).toEqual(['root']);
  });

  it('exposes the port of every listener the image configures, DNS on UDP and TCP', () => {
    const exposed = all('EXPOSE').flatMap((i) => i.args.split(/\s+/));
    const listeners = listenersOf(moatConfig(IMAGE.env));
    expect(listeners.map((l) => l.key)).toContain('metricsListen');
    for (const { key, at } of listeners) {
      const protocols = key === 'dnsListen' ? ['udp', 'tcp'] : ['tcp'];
      for (const p of protocols) expect(exposed, key).toContain(`${at.port}/${p}`);
    }
  });

  it('runs the built CLI as PID 1 in exec form', () => {
    const entrypoint = JSON.parse(all('ENTRYPOINT').at(-1)!.args) as string[];
    const cmd = JSON.parse(all('CMD').at(-1)!.args) as string[];
    expect(entrypoint[0]).toBe('node');
    const workdir = finalStage.filter((i) => i.keyword === 'WORKDIR').at(-1)!.args;
    const main = path.join(ROOT, path.relative(workdir, entrypoint[1]!));
    expect(existsSync(main), entrypoint[1]).toBe(true);
    expect(cmd).toEqual(['serve']);
  });

  describe('HEALTHCHECK', () => {
    const apiPort = moatConfig(IMAGE.env).apiListen.port;
    let moat: RunningMoat;
    let scratch: ReturnType<typeof scratchMoatFlags>;

    beforeAll(async () => {
      scratch = scratchMoatFlags();
      const config = moatConfig({}, { flags: { ...scratch.flags, ...LOOPBACK_FLAGS } });
      moat = await startMoat(config, pino({ level: 'silent' }), { defaultMetrics: false });
    });
    afterAll(async () => {
      await moat.stop();
      scratch.remove();
    });

    /** The image's exact command, aimed at `port` instead of the image's API port. */
    const probe = (port: number) => {
      const command = IMAGE.healthcheck.map((a) => a.replace(`:${apiPort}/`, `:${port}/`));
      expect(command.join(' ')).toContain(`http://127.0.0.1:${port}/health`);
      return exitCode([process.execPath, ...command.slice(1)]);
    };

    it('succeeds against a running Moat and fails when nothing listens', async () => {
      expect(IMAGE.healthcheck[0]).toBe('node');
      expect(await probe(moat.listening.api.port)).toBe(0);
      const closed = net.createServer();
      const port = await new Promise<number>((resolve) =>
        closed.listen(0, '127.0.0.1', () => resolve((closed.address() as net.AddressInfo).port)),
      );
      await new Promise((resolve) => closed.close(resolve));
      expect(await probe(port)).toBe(1);
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Kubernetes: the subset of the API objects these manifests use.

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: {
    fieldRef?: { fieldPath: string };
    secretKeyRef?: { name: string; key: string };
  };
}
interface Probe {
  httpGet?: { path: string; port: string | number };
  exec?: { command: string[] };
}
interface Container {
  name: string;
  image: string;
  args?: string[];
  env?: EnvVar[];
  ports?: Array<{ name?: string; containerPort: number; hostPort?: number; protocol?: string }>;
  startupProbe?: Probe;
  readinessProbe?: Probe;
  livenessProbe?: Probe;
  volumeMounts?: Array<{ name: string; mountPath: string }>;
}
interface PodSpec {
  hostNetwork?: boolean;
  containers: Container[];
  initContainers?: Array<Container & { restartPolicy?: string }>;
  volumes?: Array<{ name: string; configMap?: { name: string } }>;
}
interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  data?: Record<string, string>;
  spec?: {
    template?: { spec: PodSpec };
    ports?: Array<{ port: number; targetPort: string | number }>;
    ingress?: Array<{ ports: Array<{ port: number }> }>;
  };
}

/** What the downward API and the secret give, in place of a real cluster. */
const SAMPLE = {
  'status.hostIP': '10.0.0.7',
  'status.podIP': '10.244.1.9',
  secret: 'sample-api-key-from-the-secret-0123',
};

/** A container's environment as Kubernetes builds it: $(VAR) expands earlier variables. */
function containerEnv(container: Container): Record<string, string> {
  const env: Record<string, string> = {};
  for (const v of container.env ?? []) {
    const from = v.valueFrom;
    if (from?.fieldRef) env[v.name] = SAMPLE[from.fieldRef.fieldPath as keyof typeof SAMPLE];
    else if (from?.secretKeyRef) env[v.name] = SAMPLE.secret;
    else env[v.name] = (v.value ?? '').replace(/\$\((\w+)\)/g, (ref, name) => env[name] ?? ref);
  }
  return env;
}

interface MoatPod {
  readonly file: string;
  readonly pod: PodSpec;
  readonly moat: Container;
  readonly config: MoatConfig;
  readonly env: Record<string, string>;
  /** The moat.json of the ConfigMap behind --config, if any. */
  readonly fileSettings: Record<string, unknown>;
  /** The address the kubelet and Prometheus reach the pod at. */
  readonly podIP: string;
}

/** Whether a listener is reachable at the pod's address (from the kubelet, from Prometheus). */
const reachableFromOutside = (at: HostPort | undefined, podIP: string) =>
  at !== undefined && ['0.0.0.0', '::', podIP].includes(at.host);

describe('Kubernetes manifests', () => {
  const FILES = ['kubernetes/daemonset.yaml', 'kubernetes/sidecar.yaml', 'kubernetes/service.yaml'];
  const docs = new Map<string, K8sObject[]>();
  let yamlMissing: string | undefined;

  beforeAll(() => {
    yamlMissing = TOOLS.pyyaml();
    if (yamlMissing === undefined)
      for (const file of FILES) docs.set(file, parseYaml(file) as K8sObject[]);
  }, 300_000);

  const objects = () => [...docs.values()].flat();

  /** The moat container of every workload, with the configuration Moat would run with. */
  const moatPods = (): MoatPod[] =>
    [...docs].flatMap(([file, list]) =>
      list.flatMap((doc) => {
        const pod = doc.spec?.template?.spec;
        const moat = [...(pod?.initContainers ?? []), ...(pod?.containers ?? [])].find(
          (c) => c.name === 'moat',
        );
        if (!pod || !moat) return [];
        const env = { ...IMAGE.env, ...containerEnv(moat) };
        const args = moat.args ?? [];
        let text: string | undefined;
        if (args.includes('--config')) {
          const at = args[args.indexOf('--config') + 1]!;
          const mount = moat.volumeMounts!.find((m) => at.startsWith(`${m.mountPath}/`))!;
          const volume = pod.volumes!.find((v) => v.name === mount.name)!;
          const map = list.find(
            (d) => d.kind === 'ConfigMap' && d.metadata.name === volume.configMap!.name,
          );
          text = map!.data![path.basename(at)];
        }
        return [
          {
            file,
            pod,
            moat,
            env,
            config: moatConfig(env, { file: text }),
            fileSettings: text === undefined ? {} : (JSON.parse(text) as Record<string, unknown>),
            podIP: pod.hostNetwork ? SAMPLE['status.hostIP'] : SAMPLE['status.podIP'],
          },
        ];
      }),
    );
  const pod = (suffix: string) => moatPods().find((p) => p.file.endsWith(suffix))!;

  it('parse as YAML into objects with apiVersion, kind and name', (context) => {
    needs(context, yamlMissing);
    expect(objects().map((d) => `${d.kind}/${d.metadata.name}`)).toEqual([
      'Namespace/moat',
      'ConfigMap/moat-config',
      'DaemonSet/moat',
      'Deployment/sandbox-runner',
      'NetworkPolicy/sandbox-runner-ingress',
      'Service/moat',
    ]);
    for (const doc of objects()) expect(doc.apiVersion).toMatch(/^([a-z0-9.]+\/)?v1$/);
  });

  it('run Moat with settings Moat accepts, none of the file settings overridden by env', (context) => {
    needs(context, yamlMissing);
    const pods = moatPods();
    expect(pods.map((p) => p.file)).toEqual([
      'kubernetes/daemonset.yaml',
      'kubernetes/sidecar.yaml',
    ]);
    for (const { fileSettings, env, file } of pods) {
      const shadowed = Object.keys(fileSettings).filter((key) => {
        const setting = SETTING_BY_KEY.get(key);
        expect(setting, `${file}: config file key ${key}`).toBeDefined();
        return env[setting!.env] !== undefined;
      });
      expect(shadowed, `${file}: config file keys that MOAT_* variables override`).toEqual([]);
    }
  });

  it('probe /health (readiness: /ready) where the kubelet reaches it, or run the image HEALTHCHECK inside', (context) => {
    needs(context, yamlMissing);
    for (const { file, pod, moat, config, podIP } of moatPods()) {
      const probes = [moat.startupProbe, moat.readinessProbe, moat.livenessProbe];
      expect(probes.every(Boolean), `${file}: startup, readiness and liveness probes`).toBe(true);
      for (const probe of probes) {
        if (probe!.exec) {
          // The command the HEALTHCHECK test runs against a live Moat, on the same port.
          expect(probe!.exec.command, file).toEqual(IMAGE.healthcheck);
          expect(config.apiListen.port).toBe(moatConfig(IMAGE.env).apiListen.port);
          continue;
        }
        // Readiness asks whether the store and listeners work; the others only whether Moat runs.
        expect(probe!.httpGet!.path).toBe(probe === moat.readinessProbe ? '/ready' : '/health');
        expect(reachableFromOutside(config.apiListen, podIP), `${file}: API address`).toBe(true);
        const port = moat.ports!.find(
          (p) => p.name === probe!.httpGet!.port || p.containerPort === probe!.httpGet!.port,
        );
        expect(port?.containerPort, `${file}: probe port`).toBe(config.apiListen.port);
        if (pod.hostNetwork) expect(port?.hostPort).toBe(port?.containerPort);
      }
    }
  });

  it('keep the data folder on a volume and take the API key from the secret', (context) => {
    needs(context, yamlMissing);
    for (const { file, pod, moat, config } of moatPods()) {
      const mount = moat.volumeMounts!.find((m) => m.mountPath === config.dataDir);
      expect(mount, `${file}: a volume at ${config.dataDir}`).toBeDefined();
      expect(pod.volumes!.map((v) => v.name)).toContain(mount!.name);
      const keys = moat.env!.find((v) => v.name === 'MOAT_API_KEYS')!.valueFrom?.secretKeyRef;
      expect(keys, file).toEqual({ name: 'moat-api-keys', key: 'MOAT_API_KEYS' });
      expect(config.apiKeys).toEqual([SAMPLE.secret]);
    }
  });

  it('point the sidecar runner at the loopback ports Moat listens on, with the same key', (context) => {
    needs(context, yamlMissing);
    const sidecar = pod('sidecar.yaml');
    const init = sidecar.pod.initContainers?.find((c) => c.name === 'moat');
    expect(init?.restartPolicy).toBe('Always');
    const runner = sidecar.pod.containers.find((c) => c.name === 'runner')!;
    const env = containerEnv(runner);
    for (const [variable, listen] of [
      ['E2B_API_URL', sidecar.config.apiListen],
      ['E2B_SANDBOX_URL', sidecar.config.sandboxListen],
    ] as const) {
      const url = new URL(env[variable]!);
      expect(url.hostname, variable).toBe('127.0.0.1');
      expect(Number(url.port), variable).toBe(listen.port);
      // Loopback only: nothing outside the pod reaches the platform or sandbox API.
      expect(listen.host, variable).toBe('127.0.0.1');
    }
    expect(runner.env!.find((v) => v.name === 'E2B_API_KEY')!.valueFrom?.secretKeyRef).toEqual(
      sidecar.moat.env!.find((v) => v.name === 'MOAT_API_KEYS')!.valueFrom?.secretKeyRef,
    );
    const policy = objects().find((d) => d.kind === 'NetworkPolicy')!;
    expect(policy.spec!.ingress!.flatMap((r) => r.ports.map((p) => p.port))).toEqual([
      sidecar.config.metricsListen?.port,
    ]);
  });

  it('give the Service target ports the DaemonSet declares', (context) => {
    needs(context, yamlMissing);
    const node = pod('daemonset.yaml');
    const service = objects().find((d) => d.kind === 'Service')!;
    const declared = new Map(node.moat.ports!.map((p) => [p.name, p.containerPort]));
    expect(service.spec!.ports!.map((p) => declared.get(String(p.targetPort)))).toEqual([
      node.config.apiListen.port,
      node.config.sandboxListen.port,
    ]);
  });

  it('expose the metrics listener under the container and port name Prometheus keeps', (context) => {
    needs(context, yamlMissing);
    const keep = new RegExp(`^(?:${kubernetesScrapeKeep()})$`);
    for (const { file, moat, config, podIP } of moatPods()) {
      expect(reachableFromOutside(config.metricsListen, podIP), `${file}: metrics address`).toBe(
        true,
      );
      const port = moat.ports!.find((p) => p.containerPort === config.metricsListen!.port);
      expect(`${moat.name};${port?.name}`, file).toMatch(keep);
      // Nothing else of the pod matches: one target per Moat.
      const others = moat.ports!.filter((p) => p !== port && keep.test(`${moat.name};${p.name}`));
      expect(others, file).toEqual([]);
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Prometheus and Grafana.

interface ScrapeConfig {
  job_name: string;
  static_configs?: Array<{ targets: string[]; labels?: Record<string, string> }>;
  kubernetes_sd_configs?: unknown[];
  relabel_configs?: Array<{
    source_labels?: string[];
    regex?: string;
    action?: string;
    target_label?: string;
  }>;
}
interface PrometheusConfig {
  rule_files: string[];
  scrape_configs: ScrapeConfig[];
}
interface Rule {
  record?: string;
  alert?: string;
  expr: string;
  labels?: Record<string, string>;
}

const SCRAPE_FILES = ['prometheus/scrape.yml', 'prometheus/scrape-kubernetes.yml'];
const scrapeJobs = () =>
  SCRAPE_FILES.flatMap((f) => (parseYaml(f)[0] as PrometheusConfig).scrape_configs);
const alertRules = () =>
  (parseYaml('prometheus/alerts.yml')[0] as { groups: Array<{ rules: Rule[] }> }).groups.flatMap(
    (g) => g.rules,
  );

/** The regex the Kubernetes job keeps `container;port` name pairs with. */
function kubernetesScrapeKeep(): string {
  const job = scrapeJobs().find((j) => j.kubernetes_sd_configs)!;
  const keep = job.relabel_configs!.find(
    (r) =>
      r.action === 'keep' &&
      r.source_labels?.join(',') ===
        '__meta_kubernetes_pod_container_name,__meta_kubernetes_pod_container_port_name',
  );
  expect(keep, 'a keep rule on container and port name').toBeDefined();
  return keep!.regex!;
}

/** Labels Prometheus puts on every series of a target: job, instance and the configured ones. */
function targetLabels(): Set<string> {
  const labels = new Set(['job', 'instance']);
  for (const job of scrapeJobs()) {
    for (const s of job.static_configs ?? [])
      for (const l of Object.keys(s.labels ?? {})) labels.add(l);
    for (const r of job.relabel_configs ?? []) if (r.target_label) labels.add(r.target_label);
  }
  return labels;
}

interface Selector {
  readonly name: string;
  readonly labels: string[];
}
interface Query {
  readonly selectors: Selector[];
  readonly by: string[];
  readonly without: string[];
}

const PROMQL_KEYWORDS = new Set(
  'and or unless by without on ignoring group_left group_right offset bool inf nan'.split(' '),
);
const labelList = (text: string) =>
  text
    .split(',')
    .map((l) => l.trim())
    .filter(Boolean);

/**
 * The series selectors and grouping labels of a PromQL expression: enough of a parser to check
 * names and labels against /metrics (promtool checks the syntax).
 */
function analyse(expr: string): Query {
  const by: string[] = [];
  const without: string[] = [];
  const selectors: Selector[] = [];
  let text = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  text = text.replace(
    /\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g,
    (_, keyword: string, list: string) => {
      if (keyword === 'by') by.push(...labelList(list));
      if (keyword === 'without') without.push(...labelList(list));
      return ' ';
    },
  );
  text = text.replace(/([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}/g, (_, name: string, body: string) => {
    selectors.push({ name, labels: labelList(body).map((m) => /^[a-zA-Z_]\w*/.exec(m)![0]) });
    return ' ';
  });
  text = text.replace(/\[[^\]]*\]/g, ' ').replace(/\boffset\s+\w+/g, ' ');
  // Whole names only ((?![\w:]) stops backtracking into "su" of "sum"), not function calls.
  for (const m of text.matchAll(/(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()/g)) {
    if (!PROMQL_KEYWORDS.has(m[1]!.toLowerCase())) selectors.push({ name: m[1]!, labels: [] });
  }
  return { selectors, by, without };
}

/** Metric families and the series names and labels of Moat's real /metrics output. */
class Exposition {
  readonly types = new Map<string, string>();
  /** Label names by series name, for the series that have samples. */
  readonly labels = new Map<string, Set<string>>();

  constructor(readonly text: string) {
    for (const line of text.split('\n')) {
      const type = /^# TYPE (\S+) (\S+)$/.exec(line);
      if (type) this.types.set(type[1]!, type[2]!);
      const sample = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? /.exec(line);
      if (!sample) continue;
      const set = this.labels.get(sample[1]!) ?? new Set<string>();
      for (const l of (sample[2] ?? '').matchAll(/([a-zA-Z_]\w*)="/g)) set.add(l[1]!);
      this.labels.set(sample[1]!, set);
    }
  }

  /** The series names the families export: histograms as _bucket, _sum and _count. */
  seriesNames(): Set<string> {
    const suffixes: Record<string, string[]> = {
      histogram: ['_bucket', '_sum', '_count'],
      summary: ['', '_sum', '_count'],
    };
    return new Set(
      [...this.types].flatMap(([name, type]) => (suffixes[type] ?? ['']).map((s) => name + s)),
    );
  }
}

interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { x: number; y: number; w: number; h: number };
  datasource?: { uid: string };
  targets?: Array<{ expr: string; refId: string; legendFormat?: string }>;
  panels?: Panel[];
}
interface Dashboard {
  schemaVersion: number;
  uid: string;
  title: string;
  panels: Panel[];
  templating: { list: Array<{ name: string; type: string; definition?: string }> };
}
interface NamedQuery {
  readonly where: string;
  readonly expr: string;
  readonly legend?: string;
}

const readDashboard = () => JSON.parse(readDeploy('grafana/moat-dashboard.json')) as Dashboard;

/** The PromQL of every panel and variable, dashboard variables given sample values. */
function dashboardQueries(dashboard: Dashboard): NamedQuery[] {
  const fill = (expr: string) =>
    expr.replaceAll('$__rate_interval', '5m').replace(/\$\{?(job|instance)\}?/g, '.+');
  const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
  const queries = panels.flatMap((p) =>
    (p.targets ?? []).map((t) => ({
      where: `panel "${p.title}" ${t.refId}`,
      expr: fill(t.expr),
      legend: t.legendFormat,
    })),
  );
  const variables = dashboard.templating.list.flatMap((v) => {
    const m = /^label_values\((.*),\s*\w+\)$/.exec(v.definition ?? '');
    return m ? [{ where: `variable ${v.name}`, expr: fill(m[1]!) }] : [];
  });
  return [...queries, ...variables];
}

describe('Prometheus configuration and rules', () => {
  it('promtool check config accepts scrape.yml and the rule file it loads', (context) => {
    needs(context, TOOLS.promtool());
    const result = run('promtool', ['check', 'config', deployFile('prometheus/scrape.yml')]);
    expect(result.status, result.output).toBe(0);
    expect(result.output).toMatch(/alerts\.yml/);
  });

  it('promtool check config accepts scrape-kubernetes.yml', (context) => {
    needs(context, TOOLS.promtool() ?? TOOLS.pyyaml());
    const file = deployFile('prometheus/scrape-kubernetes.yml');
    const native = run('promtool', ['check', 'config', file]);
    if (!/field kubernetes_sd_configs not found/.test(native.output)) {
      expect(native.status, native.output).toBe(0);
      return;
    }
    // This promtool was built without Kubernetes discovery (Debian's is). Check the rest of
    // the file, relabelling included, with a static target where discovery would be.
    const config = parseYaml('prometheus/scrape-kubernetes.yml')[0] as PrometheusConfig;
    config.rule_files = config.rule_files.map((f) => deployFile(`prometheus/${f}`));
    for (const job of config.scrape_configs) {
      expect(job.kubernetes_sd_configs).toBeDefined();
      delete job.kubernetes_sd_configs;
      job.static_configs = [{ targets: ['10.244.1.9:9464'] }];
    }
    const copy = path.join(scratchDir, 'scrape-kubernetes-static.yml');
    writeFileSync(copy, JSON.stringify(config));
    const result = run('promtool', ['check', 'config', copy]);
    expect(result.status, result.output).toBe(0);
    console.log(
      `partly checked: ${context.task.name}: this promtool has no Kubernetes discovery; the rest of the file passed`,
    );
  });

  it('promtool check rules accepts alerts.yml', (context) => {
    needs(context, TOOLS.promtool());
    const result = run('promtool', ['check', 'rules', deployFile('prometheus/alerts.yml')]);
    expect(result.status, result.output).toBe(0);
  });

  it('the alerts fire, and stay quiet, as alerts.test.yml says', (context) => {
    needs(context, TOOLS.promtool());
    const result = run('promtool', ['test', 'rules', deployFile('prometheus/alerts.test.yml')]);
    expect(result.status, result.output).toBe(0);
  });

  it('alert on deny spikes, SERVFAIL, upstream latency, publish and store failures, and down', (context) => {
    needs(context, TOOLS.pyyaml());
    const rules = alertRules();
    const recorded = new Map(rules.flatMap((r) => (r.record ? [[r.record, r.expr]] : [])));
    // An alert on a recorded series covers the metric the recording rule reads.
    const expanded = rules
      .filter((r) => r.alert)
      .map((r) => r.expr.replace(/\w+:\w+:\w+/g, (name) => recorded.get(name) ?? name))
      .join('\n');
    for (const needle of [
      'moat_proxy_denials_total',
      'moat_dns_queries_total{verdict="blocked"}',
      'moat_dns_queries_total{verdict="servfail"}',
      'moat_dns_upstream_duration_seconds_bucket',
      'moat_policy_publishes_total{result="failed"}',
      'moat_store_errors_total',
      'up{',
    ])
      expect(expanded).toContain(needle);
    for (const rule of rules.filter((r) => r.alert))
      expect(['warning', 'critical'], rule.alert).toContain(rule.labels?.severity);
  });
});

describe('Grafana dashboard', () => {
  it('is a dashboard Grafana can import: unique panel ids, a 24-column grid, a data source variable', () => {
    const dashboard = readDashboard();
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(36);
    expect(dashboard.uid).toMatch(/^[\w-]{1,40}$/);
    const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
    const ids = panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const p of panels) {
      expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
      if (p.type === 'row') continue;
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
      expect(p.datasource?.uid).toBe('${datasource}');
    }
    expect(dashboard.templating.list.map((v) => v.name)).toEqual(['datasource', 'job', 'instance']);
  });
});

// ---------------------------------------------------------------------------------------------
describe('metric names against real /metrics', () => {
  const KEY = 'deploy-test-api-key-0123456789';
  let moat: RunningMoat;
  let upstream: FakeDns;
  let origin: Origin;
  let scratch: ReturnType<typeof scratchMoatFlags>;
  let exposition: Exposition;

  /** Traffic that gives the labelled families series: API, lifecycle, policy, DNS, proxy. */
  async function driveTraffic(): Promise<void> {
    const api = new ApiClient(`http://127.0.0.1:${moat.listening.api.port}`, KEY);
    const network = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };
    const id = (await api.sandbox({ network })).sandboxID;
    expect((await api.put(`/sandboxes/${id}/network`, network)).status).toBe(204);
    const invalid = await api.put(`/sandboxes/${id}/network`, { allowOut: ['not a rule'] });
    expect(invalid.status).toBe(400);
    const source = (await api.detail(id)).egress.address;
    const dns = moat.listening.dns.port;
    expect((await udpQuery(dns, source, 'allowed.test')).rcode).toBe('NOERROR');
    expect((await udpQuery(dns, source, 'allowed.test')).rcode).toBe('NOERROR');
    await udpQuery(dns, source, 'denied.test');
    const proxy = moat.listening.proxy;
    const denied = await connectThrough(proxy, `denied.test:${origin.port}`, {
      localAddress: source,
    });
    expect(denied.status).toBe(403);
    const allowed = await connectThrough(proxy, `allowed.test:${origin.port}`, {
      localAddress: source,
    });
    expect(allowed.status).toBe(200);
    // A whole line: bytes that could still begin an HTTP request wait until their line ends.
    allowed.socket.write('ping\n');
    expect(await readUntil(allowed.socket, (t) => t.includes('ping'))).toContain('ping');
    allowed.socket.destroy();
    expect((await api.delete(`/sandboxes/${id}`)).status).toBe(204);
  }

  beforeAll(async () => {
    origin = await tcpEchoOrigin('127.0.0.12');
    upstream = await new FakeDns(new Map([['allowed.test', { A: ['127.0.0.12'] }]])).start();
    scratch = scratchMoatFlags();
    const flags = {
      ...scratch.flags,
      ...LOOPBACK_FLAGS,
      'dns-upstream': `127.0.0.1:${upstream.port}`,
      'api-keys': KEY,
      // The origin is on loopback, which the default internal list denies and which is the
      // host's own: its port is opened as an operator would.
      'internal-deny': '10.0.0.0/8',
      'allow-host-ports': String(origin.port),
    };
    moat = await startMoat(moatConfig({}, { flags }), pino({ level: 'silent' }), {
      defaultMetrics: true,
    });
    await driveTraffic();
    const response = await fetch(`http://127.0.0.1:${moat.listening.api.port}/metrics`, {
      signal: AbortSignal.timeout(10_000),
    });
    expect(response.status).toBe(200);
    exposition = new Exposition(await response.text());
  }, 60_000);

  afterAll(async () => {
    await moat?.stop();
    scratch?.remove();
    await Promise.all([upstream?.stop(), origin?.close()]);
  });

  it('promtool check metrics finds no problem in the real output', (context) => {
    needs(context, TOOLS.promtool());
    const result = run('promtool', ['check', 'metrics'], { input: exposition.text });
    expect(result.output).toBe('');
    expect(result.status).toBe(0);
  });

  /** Every problem with the series names and labels `queries` use; empty when all exist. */
  function problems(queries: NamedQuery[], recorded = new Map<string, string>()): string[] {
    const names = exposition.seriesNames();
    const target = targetLabels();
    const labelsOf = (name: string): Set<string> => {
      const source = recorded.get(name);
      if (source !== undefined)
        return new Set(analyse(source).selectors.flatMap((s) => [...labelsOf(s.name)]));
      return new Set([...(exposition.labels.get(name) ?? []), ...target]);
    };
    const found: string[] = [];
    for (const { where, expr, legend } of queries) {
      const query = analyse(expr);
      const available = new Set(query.selectors.flatMap((s) => [...labelsOf(s.name)]));
      for (const { name, labels } of query.selectors) {
        if (name === 'up') continue; // made by Prometheus for every target
        if (!names.has(name) && !recorded.has(name)) {
          found.push(`${where}: ${name} is not in /metrics`);
          continue;
        }
        // A family with no series yet (GC durations before the first GC) shows no labels.
        const hint = exposition.labels.has(name) ? '' : ' (no series yet to read labels from)';
        for (const l of labels.filter((l) => !labelsOf(name).has(l)))
          found.push(`${where}: ${name} has no label ${l}${hint}`);
      }
      for (const l of [...query.by, ...query.without].filter((l) => !available.has(l)))
        found.push(`${where}: groups by ${l}, which none of its series has`);
      const kept = query.by.length > 0 ? new Set(query.by) : available;
      for (const m of (legend ?? '').matchAll(/\{\{\s*(\w+)\s*\}\}/g))
        if (!kept.has(m[1]!)) found.push(`${where}: legend uses {{${m[1]}}}, which is not kept`);
    }
    return found;
  }

  it('has every metric and label the dashboard queries', (context) => {
    needs(context, TOOLS.pyyaml()); // the scrape configs name the target labels
    const queries = dashboardQueries(readDashboard());
    expect(queries.length).toBeGreaterThan(20);
    expect(problems(queries)).toEqual([]);
  });

  it('has every metric and label the alert and recording rules use', (context) => {
    needs(context, TOOLS.pyyaml());
    const rules = alertRules();
    const recorded = new Map(rules.flatMap((r) => (r.record ? [[r.record, r.expr]] : [])));
    const queries = rules.map((r) => ({ where: r.alert ?? r.record!, expr: r.expr }));
    expect(problems(queries, recorded)).toEqual([]);
  });

  it('the dashboard queries are valid PromQL (promtool check rules)', (context) => {
    needs(context, TOOLS.promtool());
    const rules = dashboardQueries(readDashboard()).map((q, i) => ({
      record: `dashboard:query_${i}:check`,
      expr: q.expr,
    }));
    // JSON is YAML: promtool reads it as a rule file.
    const file = path.join(scratchDir, 'dashboard-rules.yml');
    writeFileSync(file, JSON.stringify({ groups: [{ name: 'dashboard', rules }] }));
    const result = run('promtool', ['check', 'rules', file]);
    expect(result.status, result.output).toBe(0);
  });

  it('the name checks catch a misspelt metric, a missing label and a histogram family name', (context) => {
    needs(context, TOOLS.pyyaml());
    expect(
      problems([
        { where: 'probe', expr: 'rate(moat_dns_query_total[5m])' },
        { where: 'probe', expr: 'sum by (reason) (rate(moat_proxy_denials_total{rule="x"}[5m]))' },
        { where: 'probe', expr: 'moat_dns_upstream_duration_seconds', legend: '{{verdict}}' },
      ]),
    ).toEqual([
      'probe: moat_dns_query_total is not in /metrics',
      'probe: moat_proxy_denials_total has no label rule',
      'probe: groups by reason, which none of its series has',
      'probe: moat_dns_upstream_duration_seconds is not in /metrics',
      'probe: legend uses {{verdict}}, which is not kept',
    ]);
  });
});
