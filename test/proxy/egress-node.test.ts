import { egressSuite } from './egress-suite.js';

// The same behaviour on Node's sockets, the fallback where the native relay does not load.
egressSuite('node');
