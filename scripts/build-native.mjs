#!/usr/bin/env node
/**
 * Builds the native addons with node-gyp (binding.gyp): native/udp_batch.c (batched UDP for the
 * DNS interceptor) and native/tcp_relay.c (the explicit proxy's accept, dial and relay). Run by
 * `npm ci` / `npm install` (the install script). Both are optimisations: where they cannot be
 * built (not Linux, no C compiler), Moat answers DNS over UDP with node:dgram and carries proxy
 * connections on Node's sockets, correct but slower, and says so at start-up. So this script
 * never fails the install; it says what is missing instead.
 */
import { spawnSync } from 'node:child_process';

const skip = (why) => {
  console.warn(
    `moat: DNS over UDP will use node:dgram and the proxy Node's sockets (slower): ${why}`,
  );
  process.exit(0);
};
if (process.platform !== 'linux')
  skip('the native addons need Linux (recvmmsg, sendmmsg, epoll, splice)');
// npm puts its own node-gyp on the PATH of lifecycle scripts and names it in npm_config_node_gyp.
const gyp = process.env.npm_config_node_gyp;
const [command, args] = gyp ? [process.execPath, [gyp, 'rebuild']] : ['node-gyp', ['rebuild']];
const result = spawnSync(command, args, { stdio: 'inherit', timeout: 300_000 });
if (result.error) skip(`node-gyp could not run (${result.error.message}); run it via npm`);
if (result.status !== 0)
  skip('building native/*.c failed (see above; it needs make, a C compiler and python3)');
