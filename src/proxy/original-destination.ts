/**
 * Where a connection that the kernel redirected to the transparent listener was going: the
 * original destination conntrack keeps for NAT (SO_ORIGINAL_DST), read by the native TCP addon.
 * Node has no way to ask for it; without the addon Moat cannot tunnel redirected TCP of other
 * protocols, and the kernel rules refuse such connections instead (enforce/kernel-rules.ts).
 */
import type net from 'node:net';
import { type LoadedAddon, loadAddon } from '../process/index.js';

interface OriginalDestinationAddon {
  originalDestination(fd: number): [ip: string, port: number] | undefined;
}

export interface OriginalDestination {
  readonly ip: string;
  readonly port: number;
}

let loaded: LoadedAddon<OriginalDestinationAddon> | undefined;

const addon = (): LoadedAddon<OriginalDestinationAddon> =>
  (loaded ??= loadAddon<OriginalDestinationAddon>(
    'moat_tcp_relay',
    'tcp_relay.c',
    "reading a redirected connection's original destination",
  ));

/** Why original destinations cannot be read here, or undefined when they can. */
export function originalDestinationUnavailable(): string | undefined {
  const found = addon();
  return 'problem' in found ? found.problem : undefined;
}

/**
 * The IPv4 destination `socket` had before the kernel redirected it, or undefined when it was
 * not redirected (or cannot be read here).
 */
export function originalDestination(socket: net.Socket): OriginalDestination | undefined {
  const found = addon();
  // A TCP socket's handle carries its descriptor on Linux.
  const fd = (socket as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  if ('problem' in found || typeof fd !== 'number' || fd < 0) return undefined;
  const original = found.addon.originalDestination(fd);
  return original === undefined ? undefined : { ip: original[0], port: original[1] };
}
