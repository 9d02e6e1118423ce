/**
 * The plugin executable's entry: what the `moat` file `moat cni install` writes runs this with
 * the node that ran the install. Reads the network configuration from standard input, answers
 * on standard output.
 */
import { runPlugin } from './plugin.js';

const chunks: Buffer[] = [];
for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
const output = await runPlugin(process.env, Buffer.concat(chunks).toString('utf8'));
process.stdout.write(output.stdout === '' ? '' : `${output.stdout}\n`);
process.exitCode = output.exitCode;
