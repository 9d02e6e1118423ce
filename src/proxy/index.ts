/**
 * The egress proxy: explicit (CONNECT and absolute-form HTTP) and transparent (SNI/Host), all
 * deciding with the sandbox's current compiled Policy and closing what a new policy denies.
 */
export { Dialer, type DialerOptions } from './dial.js';
export { EgressProxy, type ProxyListen, type ProxyOptions } from './egress.js';
export { type HeaderInjection } from './intercept.js';
export { type TcpIo, type TcpIoSetting } from './native-tcp.js';
export { originalDestinationUnavailable } from './original-destination.js';
export { TransparentProxy } from './transparent.js';
export { TunnelRegistry } from './tunnels.js';
export {
  type GatewaySandbox,
  NOT_RUNNING,
  SANDBOX_API_PORT,
  SandboxGateway,
  type SandboxGatewayOptions,
} from './gateway.js';
export {
  IngressProxy,
  type IngressOptions,
  type IngressTarget,
  TRAFFIC_TOKEN_HEADER,
} from './ingress.js';
