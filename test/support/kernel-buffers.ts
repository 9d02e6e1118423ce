import { readFileSync } from 'node:fs';

/** The largest size the kernel grows one side of a TCP socket to (the third field). */
const grownMax = (name: 'tcp_rmem' | 'tcp_wmem'): number =>
  Number(readFileSync(`/proc/sys/net/ipv4/${name}`, 'utf8').trim().split(/\s+/)[2]);

/**
 * The most bytes `hops` loopback TCP connections can hold in kernel buffers on this machine:
 * each can grow its receive side to tcp_rmem's maximum and its send side to tcp_wmem's.
 * Backpressure tests bound what a stalled reader lets through by this (plus what the relay
 * itself may hold), because the maximums differ between machines (6 MiB and 32 MiB seen).
 */
export function kernelBufferedMax(hops: number): number {
  return hops * (grownMax('tcp_rmem') + grownMax('tcp_wmem'));
}
