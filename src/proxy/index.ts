/**
 * The egress proxy: explicit (CONNECT and absolute-form HTTP) and transparent (SNI/Host), all
 * deciding with the sandbox's current compiled Policy and closing what a new policy denies.
 */
export { Dialer, type DialerOptions } from './dial.js';
export { EgressProxy, type ProxyListen } from './egress.js';
export { FairShare, type FairShareBudgets } from './fair-share.js';
export type { HeaderInjection, ProxyOptions } from './options.js';
export { type TcpIo, type TcpIoSetting } from './native-tcp.js';
export { originalDestinationUnavailable } from './original-destination.js';
export { TransparentProxy } from './transparent.js';
export { TunnelRegistry } from './tunnels.js';
export {
  NOT_RUNNING,
  type RoutedSandbox,
  SandboxRouter,
  type SandboxRouterOptions,
} from './sandbox-router.js';
export {
  IngressProxy,
  type IngressOptions,
  type IngressTarget,
  TRAFFIC_TOKEN_HEADER,
} from './ingress.js';
