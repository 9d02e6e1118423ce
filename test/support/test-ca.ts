/** The throwaway certificate authority of tests; it lives with the benchmarks', which use it too. */
export { type KeyPair, TestCa } from '../../bench/lib/certificate.js';
