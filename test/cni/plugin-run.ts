/**
 * The CNI plugin as a runtime runs it: `moat cni install` writes it into a scratch folder, and
 * each call is a child process of the installed executable with only the CNI_* variables (no
 * PATH, as runtimes give) and the network configuration on standard input.
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { runMoat } from '../support/moat.js';

export interface PluginRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Standard output as JSON; undefined when it is empty. */
  readonly json: Record<string, unknown> | undefined;
}

export interface InstalledPlugin {
  readonly dir: string;
  readonly binDir: string;
  readonly confDir: string;
  readonly keyFile: string;
  /** The plugin's entry of moat.conflist as a runtime passes it (with the list's name and version). */
  conf(overrides?: Record<string, unknown>): Record<string, unknown>;
  run(env: Record<string, string>, stdin: string | object): Promise<PluginRun>;
  remove(): void;
}

/** Installs the plugin for Moat at `api` with `key` in a mode-0600 key file. */
export async function installPlugin(
  api: string,
  key: string,
  extra: string[] = [],
): Promise<InstalledPlugin> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-cni-'));
  const binDir = path.join(dir, 'bin');
  const confDir = path.join(dir, 'net.d');
  const keyFile = path.join(dir, 'api-key');
  writeFileSync(keyFile, `${key}\n`, { mode: 0o600 });
  chmodSync(keyFile, 0o600);
  const installed = await runMoat([
    ...['cni', 'install', '--bin-dir', binDir, '--conf-dir', confDir],
    ...['--api', api, '--key-file', keyFile, ...extra],
  ]);
  if (installed.code !== 0) throw new Error(`moat cni install: ${installed.stderr}`);
  return {
    dir,
    binDir,
    confDir,
    keyFile,
    conf(overrides = {}) {
      const list = JSON.parse(readFileSync(path.join(confDir, 'moat.conflist'), 'utf8')) as {
        cniVersion: string;
        name: string;
        plugins: Array<Record<string, unknown>>;
      };
      return { cniVersion: list.cniVersion, name: list.name, ...list.plugins[0], ...overrides };
    },
    run: (env, stdin) => runPluginFile(path.join(binDir, 'moat'), env, stdin),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** Runs the plugin executable once (bounded: 30 s). */
export function runPluginFile(
  file: string,
  env: Record<string, string>,
  stdin: string | object,
): Promise<PluginRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, [], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({
        code,
        stdout,
        stderr,
        json: stdout.trim() === '' ? undefined : (JSON.parse(stdout) as Record<string, unknown>),
      });
    });
    child.stdin.end(typeof stdin === 'string' ? stdin : JSON.stringify(stdin));
  });
}
