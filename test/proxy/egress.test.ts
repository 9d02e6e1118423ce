import { egressSuite } from './egress-suite.js';

// On the native relay where it loads (egress-node.test.ts runs the same on Node's sockets).
egressSuite('auto');
