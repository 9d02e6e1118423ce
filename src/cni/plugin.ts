/**
 * The CNI plugin `moat`: ADD adopts the container's network namespace as a network-only
 * sandbox, DEL detaches it (succeeding when there is nothing to detach, as CNI requires),
 * CHECK verifies the sandbox and its link, VERSION answers which versions it speaks.
 */
import {
  type Invocation,
  invocationFrom,
  parseConf,
  type PluginConf,
  requestedVersion,
} from './conf.js';
import { linkProblem, macOf } from './link-check.js';
import { MoatApi } from './moat-api.js';
import { addResult, attachedFrom } from './result.js';
import { CNI_CODES, type CniError, fail, type Outcome, SUPPORTED_VERSIONS } from './spec.js';

/** What the plugin prints on standard output, and its exit status. */
export interface PluginOutput {
  readonly stdout: string;
  readonly exitCode: number;
}

/** A policy that denies every destination: what a container gets when the conflist has none. */
const DENY_ALL = { allowOut: [], denyOut: ['0.0.0.0/0'] };

export async function runPlugin(
  env: Readonly<Record<string, string | undefined>>,
  stdin: string,
): Promise<PluginOutput> {
  const invocation = invocationFrom(env);
  if (!invocation.ok) return errorOutput(requestedVersion(stdin), invocation.error);
  if (invocation.value.command === 'VERSION')
    return {
      stdout: JSON.stringify({
        cniVersion: requestedVersion(stdin),
        supportedVersions: SUPPORTED_VERSIONS,
      }),
      exitCode: 0,
    };
  const conf = parseConf(stdin);
  if (!conf.ok) return errorOutput(requestedVersion(stdin), conf.error);
  const api = await MoatApi.open(conf.value);
  if (!api.ok) return errorOutput(conf.value.cniVersion, api.error);
  const run = { ADD: add, DEL: del, CHECK: check }[invocation.value.command];
  const done = await run(conf.value, invocation.value, api.value);
  return done.ok
    ? { stdout: done.value, exitCode: 0 }
    : errorOutput(conf.value.cniVersion, done.error);
}

const errorOutput = (cniVersion: string, error: CniError): PluginOutput => ({
  stdout: JSON.stringify({ cniVersion, ...error }),
  exitCode: 1,
});

async function add(
  conf: PluginConf,
  invocation: Invocation,
  api: MoatApi,
): Promise<Outcome<string>> {
  const created = await api.call('POST', '/sandboxes', {
    templateID: 'network-only',
    netns: invocation.netns,
    ifname: invocation.ifname,
    ...(conf.guestLink === undefined ? {} : { guestLink: conf.guestLink }),
    metadata: { cniContainerID: invocation.containerID },
    network: conf.policy ?? DENY_ALL,
  });
  if (!created.ok) return created;
  const attached = attachedFrom(created.value.body);
  if (typeof attached === 'string') {
    // Moat attached something it cannot describe: undo it rather than leave it unowned.
    const id = (created.value.body as { sandboxID?: unknown } | undefined)?.sandboxID;
    if (typeof id === 'string')
      await api.call('DELETE', `/sandboxes/${encodeURIComponent(id)}`, undefined, [404]);
    return fail(CNI_CODES.moatRefused, `Moat's answer to the attach is not usable: ${attached}`);
  }
  const mac = await macOf(invocation.netns, attached.link.ifname);
  return { ok: true, value: JSON.stringify(addResult(conf, invocation, attached, mac)) };
}

async function del(
  _conf: PluginConf,
  invocation: Invocation,
  api: MoatApi,
): Promise<Outcome<string>> {
  const found = await api.sandboxesOf(invocation.containerID);
  if (!found.ok) return found;
  for (const id of found.value) {
    // 404: detached meanwhile (Moat saw the namespace go, or a DEL ran twice).
    const deleted = await api.call(
      'DELETE',
      `/sandboxes/${encodeURIComponent(id)}`,
      undefined,
      [404],
    );
    if (!deleted.ok) return deleted;
  }
  return { ok: true, value: '' };
}

async function check(
  conf: PluginConf,
  invocation: Invocation,
  api: MoatApi,
): Promise<Outcome<string>> {
  const found = await api.sandboxesOf(invocation.containerID);
  if (!found.ok) return found;
  if (found.value.length === 0)
    return fail(
      CNI_CODES.unknownContainer,
      `Moat holds no sandbox for container ${invocation.containerID} (network ${conf.name})`,
    );
  for (const id of found.value) {
    const got = await api.call('GET', `/sandboxes/${encodeURIComponent(id)}`);
    if (!got.ok) return got;
    const attached = attachedFrom(got.value.body);
    if (typeof attached === 'string') return fail(CNI_CODES.linkMissing, attached);
    if (attached.link.ifname !== invocation.ifname) continue;
    if (attached.link.netns !== invocation.netns)
      return fail(
        CNI_CODES.linkMissing,
        `sandbox ${id} holds namespace ${attached.link.netns}, not CNI_NETNS ${invocation.netns}`,
      );
    const problem = await linkProblem(invocation.netns, attached);
    return problem === undefined
      ? { ok: true, value: '' }
      : fail(CNI_CODES.linkMissing, `sandbox ${id}: ${problem}`);
  }
  return fail(
    CNI_CODES.linkMissing,
    `Moat holds container ${invocation.containerID}, but not on interface ${invocation.ifname}`,
  );
}
