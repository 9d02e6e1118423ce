/** The DNS interceptor: UDP and TCP listeners, upstream client, answer cache, learning. */
export { AnswerCache, type AnswerCacheOptions } from './cache.js';
export { DnsInterceptor, type DnsInterceptorOptions } from './interceptor.js';
export { HostResolver } from './resolver.js';
export { UpstreamClient, UpstreamError, type UpstreamOptions } from './upstream.js';
export { ListenerGroup, listenOn } from './listen.js';
export { MAX_TCP_CONNECTIONS_PER_SOURCE } from './tcp-connections.js';
export { batchedUdpUnavailable, MAX_UDP_QUERY, type UdpIo, type UdpIoSetting } from './udp.js';
