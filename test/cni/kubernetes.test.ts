/**
 * The Kubernetes recipe for the CNI plugin (deploy/kubernetes/cni.yaml), on paper: it parses
 * (PyYAML) into objects of the kinds and API versions Kubernetes serves, whose references hold
 * (selectors, volumes, the RuntimeClass, the containerd handler its comment configures), and
 * whose install command the real `moat cni install` accepts, with the paths the plugin uses on
 * the host mounted at the same path, and the node service's port and key secret.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { runMoat } from '../support/moat.js';

const DEPLOY = fileURLToPath(new URL('../../deploy/kubernetes/', import.meta.url));
const scratch = mkdtempSync(path.join(os.tmpdir(), 'moat-cni-k8s-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

interface Mount {
  name: string;
  mountPath: string;
}
interface Container {
  name: string;
  image: string;
  command?: string[];
  args?: string[];
  env?: Array<{ name: string; value?: string; valueFrom?: { secretKeyRef?: unknown } }>;
  volumeMounts?: Mount[];
}
interface PodSpec {
  nodeSelector?: Record<string, string>;
  runtimeClassName?: string;
  initContainers?: Container[];
  containers: Container[];
  volumes?: Array<{ name: string; hostPath?: { path: string }; configMap?: { name: string } }>;
}
interface K8s {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  handler?: string;
  scheduling?: { nodeSelector?: Record<string, string> };
  data?: Record<string, string>;
  spec?: PodSpec & {
    selector?: { matchLabels: Record<string, string> };
    template?: { metadata: { labels: Record<string, string> }; spec: PodSpec };
  };
}

/** PyYAML's reading of a file of deploy/kubernetes, or why it cannot be read here. */
function parse(file: string): K8s[] | string {
  if (!existsSync('/usr/bin/python3')) return 'no /usr/bin/python3';
  const read = spawnSync(
    '/usr/bin/python3',
    [
      '-c',
      'import json,sys,yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))',
      path.join(DEPLOY, file),
    ],
    { encoding: 'utf8', timeout: 30_000 },
  );
  if (read.status !== 0)
    return /No module named .?yaml/.test(read.stderr)
      ? 'python3-yaml is not installed'
      : read.stderr;
  return (JSON.parse(read.stdout) as Array<K8s | null>).filter((d): d is K8s => d !== null);
}

const SERVED: Record<string, string> = {
  RuntimeClass: 'node.k8s.io/v1',
  DaemonSet: 'apps/v1',
  ConfigMap: 'v1',
  Pod: 'v1',
};

const parsed = parse('cni.yaml');
const unreadable = typeof parsed === 'string' ? parsed : undefined;
if (unreadable?.includes('not installed'))
  console.warn(`test/cni/kubernetes: skipped: ${unreadable}`);

describe.skipIf(unreadable?.includes('not installed') ?? false)(
  'deploy/kubernetes/cni.yaml',
  () => {
    const docs = () => {
      expect(unreadable).toBeUndefined();
      return parsed as K8s[];
    };
    const find = (kind: string) => docs().find((d) => d.kind === kind)!;
    const daemonSet = () => find('DaemonSet');
    const installer = () =>
      daemonSet().spec!.template!.spec.initContainers!.find((c) => c.name === 'install')!;

    it('holds objects of kinds and API versions Kubernetes serves, with valid names', () => {
      expect(docs().map((d) => `${d.kind}/${d.metadata.name}`)).toEqual([
        'RuntimeClass/moat',
        'DaemonSet/moat-cni',
        'ConfigMap/moat-cni-policy',
        'Pod/held-by-moat',
      ]);
      for (const doc of docs()) {
        expect(doc.apiVersion, doc.kind).toBe(SERVED[doc.kind]);
        expect(doc.metadata.name).toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/);
      }
    });

    it('has a DaemonSet whose selector, containers and volumes hold together', () => {
      const set = daemonSet().spec!;
      expect(set.template!.metadata.labels).toMatchObject(set.selector!.matchLabels);
      const pod = set.template!.spec;
      const volumes = new Set(pod.volumes!.map((v) => v.name));
      for (const container of [...pod.initContainers!, ...pod.containers]) {
        expect(container.name).toMatch(/^[a-z0-9-]+$/);
        expect(container.image).toBe('moat:0.1.0');
        for (const mount of container.volumeMounts ?? [])
          expect(volumes, mount.name).toContain(mount.name);
      }
      const policyMap = pod.volumes!.find((v) => v.configMap)!.configMap!.name;
      expect(find('ConfigMap').metadata.name).toBe(policyMap);
    });

    it('schedules the class only where the plugin is installed, under the handler containerd is given', () => {
      const runtimeClass = find('RuntimeClass');
      expect(runtimeClass.scheduling!.nodeSelector).toEqual(
        daemonSet().spec!.template!.spec.nodeSelector,
      );
      expect(find('Pod').spec!.runtimeClassName).toBe(runtimeClass.metadata.name);
      const text = readFileSync(path.join(DEPLOY, 'cni.yaml'), 'utf8');
      expect(text).toContain(`containerd.runtimes.${runtimeClass.handler}]`);
      const confDir = /cni_conf_dir = "([^"]+)"/.exec(text)?.[1];
      const volume = daemonSet().spec!.template!.spec.volumes!.find((v) => v.name === 'cni-conf');
      expect(volume?.hostPath?.path).toBe(confDir);
    });

    it("installs with flags moat cni install accepts, for the node service's port and key", async () => {
      const script = installer().args!.join('\n');
      const flags = /cni install\s+([\s\S]*)$/
        .exec(script)![1]!
        .replaceAll('\\\n', ' ')
        .split(/\s+/)
        .filter((word) => word !== '')
        .map((word) => word.replaceAll('"', ''));
      const value = (flag: string) => flags[flags.indexOf(flag) + 1]!;
      // Host paths the plugin reads at run time are mounted at the same path.
      const pod = daemonSet().spec!.template!.spec;
      const hostPathOf = (inside: string) => {
        const mount = installer().volumeMounts!.find((m) => inside.startsWith(`${m.mountPath}/`))!;
        const volume = pod.volumes!.find((v) => v.name === mount.name)!;
        return (
          volume.hostPath && path.join(volume.hostPath.path, path.relative(mount.mountPath, inside))
        );
      };
      expect(hostPathOf(value('--key-file'))).toBe(value('--key-file'));
      expect(hostPathOf('/opt/moat-cni/node')).toBe('/opt/moat-cni/node');
      expect(hostPathOf(`${value('--bin-dir')}/moat`)).toBe('/opt/cni/bin/moat');
      // The node service (daemonset.yaml) listens on HOST_IP:3000 and takes the same secret.
      const node = parse('daemonset.yaml') as K8s[];
      const moat = node.find((d) => d.kind === 'DaemonSet')!.spec!.template!.spec.containers[0]!;
      const listen = moat.env!.find((e) => e.name === 'MOAT_API_LISTEN')!.value!;
      expect(value('--api')).toBe(`http://${listen.replace('$(HOST_IP)', '${HOST_IP}')}`);
      const secret = (c: Container) => c.env!.find((e) => e.name === 'MOAT_API_KEYS')!.valueFrom;
      expect(secret(installer())).toEqual(secret(moat));
      // The real install, with the recipe's flags pointed into a scratch folder.
      const policy = path.join(scratch, 'policy.json');
      writeFileSync(policy, find('ConfigMap').data!['policy.json']!);
      const keyFile = path.join(scratch, 'api-key');
      writeFileSync(keyFile, 'k8s-recipe-key-0123456789abcdef\n', { mode: 0o600 });
      const rewrite: Record<string, string> = {
        '--bin-dir': path.join(scratch, 'bin'),
        '--conf-dir': path.join(scratch, 'net.d'),
        '--api': value('--api').replace('${HOST_IP}', '10.0.0.7'),
        '--key-file': keyFile,
        '--policy': policy,
      };
      expect(Object.keys(rewrite).sort()).toEqual(flags.filter((f) => f.startsWith('--')).sort());
      const done = await runMoat(['cni', 'install', ...Object.entries(rewrite).flat()]);
      expect(done.code, done.stderr).toBe(0);
      const list = JSON.parse(readFileSync(path.join(scratch, 'net.d', 'moat.conflist'), 'utf8'));
      const { description: _description, ...body } = JSON.parse(readFileSync(policy, 'utf8'));
      expect(list.plugins).toEqual([
        { type: 'moat', api: 'http://10.0.0.7:3000', keyFile, policy: body },
      ]);
    });
  },
);
