import { statSync } from 'node:fs';
import { DEFAULT_API, DEFAULT_KEY_FILE, installPlugin, NETWORK_NAME } from '../cni/index.js';
import { type CliIO, EXIT, parseOptions, UsageError } from './io.js';
import { readPolicyFile } from './policy-file.js';
import { loadPresets } from '../config-presets.js';

export const CNI_HELP = `Usage: moat cni install --bin-dir DIR --conf-dir DIR [options]

Installs Moat's CNI plugin, so that a CNI runtime (Podman, containerd/nerdctl, CRI-O,
Kubernetes, firecracker-containerd) attaches containers and VMs to a running Moat: each one's
network namespace becomes a network-only sandbox with its own policy, flows and live PUT network.

Writes two files:
  DIR/moat                  the plugin (runs this Moat with this node, by absolute path)
  CONF-DIR/${NETWORK_NAME}.conflist     the network "${NETWORK_NAME}" (podman run --network ${NETWORK_NAME})

Options:
  --bin-dir DIR        the runtime's CNI plugin folder (Podman: cni_plugin_dirs, often
                       /usr/lib/cni; containerd and Kubernetes: /opt/cni/bin)
  --conf-dir DIR       the runtime's CNI configuration folder (often /etc/cni/net.d)
  --api URL            Moat's platform API as the runtime's host reaches it
                       (default ${DEFAULT_API})
  --key-file FILE      the file holding Moat's API key, mode 0600 (default ${DEFAULT_KEY_FILE},
                       where a Moat started by deploy/systemd generates it); the conflist names
                       the file, never the key
  --policy FILE        the policy every attached sandbox starts with (JSON shaped like the PUT
                       /sandboxes/{id}/network body, checked as "moat lint" checks it); default:
                       deny every destination. Change one sandbox's policy live with
                       GET /sandboxes?metadata=cniContainerID%3D<container ID> and PUT network.
  -h, --help           this help

Exit status: 0 installed, 2 usage error or a policy file "moat lint" refuses.`;

/** `moat cni install`: checks its inputs, writes the plugin and the conflist, says where. */
export async function cni(args: string[], io: CliIO): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === undefined || sub === '-h' || sub === '--help') {
    io.stdout.write(`${CNI_HELP}\n`);
    return EXIT.ok;
  }
  if (sub !== 'install')
    throw new UsageError(
      `unknown subcommand ${JSON.stringify(sub)}: the one there is is "install"`,
    );
  const { values } = parseOptions({
    args: rest,
    options: {
      'bin-dir': { type: 'string' },
      'conf-dir': { type: 'string' },
      api: { type: 'string' },
      'key-file': { type: 'string' },
      policy: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
  if (values.help) {
    io.stdout.write(`${CNI_HELP}\n`);
    return EXIT.ok;
  }
  const binDir = values['bin-dir'];
  const confDir = values['conf-dir'];
  if (binDir === undefined || confDir === undefined)
    throw new UsageError('--bin-dir and --conf-dir are required');
  const api = (values.api ?? DEFAULT_API).replace(/\/+$/, '');
  if (!/^https?:\/\/[^/]/.test(api)) throw new UsageError(`--api ${api} must be an http(s) URL`);
  const keyFile = values['key-file'] ?? DEFAULT_KEY_FILE;
  if (!keyFile.startsWith('/'))
    throw new UsageError(
      `--key-file ${keyFile} must be an absolute path (the plugin runs elsewhere)`,
    );
  const keyNote = keyFileNote(keyFile);
  let policy: Record<string, unknown> | undefined;
  if (values.policy !== undefined) {
    // Checked against the shipped presets; the Moat it is sent to expands them (and its own).
    const shipped = loadPresets(undefined);
    const file = readPolicyFile(values.policy, shipped.ok ? { presets: shipped.value } : {});
    if (!file.ok) {
      for (const problem of file.problems) io.stderr.write(`${values.policy}: error: ${problem}\n`);
      io.stderr.write(`moat cni: not installed: the policy file is invalid\n`);
      return EXIT.usage;
    }
    // The file as written, less its description (the API's network body has none).
    const { description: _description, ...body } = file.json as Record<string, unknown>;
    policy = body;
  }
  const installed = installPlugin({ binDir, confDir, api, keyFile, ...(policy ? { policy } : {}) });
  io.stdout.write(
    [
      `moat cni: wrote ${installed.executable} (the plugin)`,
      `moat cni: wrote ${installed.conflist} (network "${NETWORK_NAME}": Moat at ${api}, key in ${keyFile}${keyNote}, policy ${values.policy ?? 'deny everything'})`,
      '',
    ].join('\n'),
  );
  return EXIT.ok;
}

/** Refuses a key file others may read (the plugin would); notes one not made yet. */
function keyFileNote(keyFile: string): string {
  let mode: number;
  try {
    mode = statSync(keyFile).mode & 0o777;
  } catch {
    return ' (not there yet: a Moat using that file generates it at its first start)';
  }
  if ((mode & 0o077) !== 0)
    throw new UsageError(
      `--key-file ${keyFile} has mode ${mode.toString(8).padStart(4, '0')}: others than its owner may use the key; chmod 600 it`,
    );
  return '';
}
