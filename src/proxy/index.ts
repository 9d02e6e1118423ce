/**
 * The egress proxy: explicit (CONNECT and absolute-form HTTP) and transparent (SNI/Host), all
 * deciding with the sandbox's current compiled Policy and closing what a new policy denies.
 */
export { Dialer, type DialerOptions } from './dial.js';
export { EgressProxy, type ProxyListen, type ProxyOptions } from './egress.js';
export { TransparentProxy } from './transparent.js';
export { TunnelRegistry } from './tunnels.js';
