#!/usr/bin/env node
/**
 * `npm test`: the static checks and the three vitest runs, in two lanes at once.
 *
 *   lane 1: the `together` project on Node 22, then the same on Node 24 (all but the browser file)
 *   lane 2: the checks (tsc --noEmit, ESLint, Prettier), then the `alone` project on Node 22
 *           (namespaces, confinement, the README as written)
 *
 * The `alone` files run one at a time and spend most of their time waiting on namespaces,
 * sandboxes and timers; one vitest run cannot overlap them with the rest (vitest runs a project
 * of one worker after every other project), so each lane is its own vitest. Each line of output
 * is prefixed with its stage; the end lists every stage's result and time. Exit status 1 when
 * any stage failed; every stage runs to its end either way, so one run reports everything.
 *
 *   node scripts/test-suites.mjs          run them
 *   node scripts/test-suites.mjs --list   print the lanes and their commands, run nothing
 */
import { spawn, spawnSync } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(import.meta.resolve('../'));
const BIN = `${ROOT}node_modules/.bin`;
const NODE_24_BIN = `${ROOT}node_modules/node-24/bin`;

/** The PATH each stage runs with: the project's tools first, and its Node 22 or 24. */
const pathWith = (...first) => [...first, process.env.PATH ?? ''].join(':');

const stage = (tag, command, args, nodeBin) => ({ tag, command, args, nodeBin });
const LANES = [
  [
    stage('22 together', 'vitest', ['run', '--project', 'together']),
    stage(
      '24 together',
      'vitest',
      ['run', '--project', 'together', '--exclude', 'test/api/console.test.ts'],
      NODE_24_BIN,
    ),
  ],
  [
    stage('checks tsc', 'tsc', ['--noEmit']),
    stage('checks eslint', 'eslint', ['.']),
    stage('checks prettier', 'prettier', ['--check', '.']),
    stage('22 alone', 'vitest', ['run', '--project', 'alone']),
  ],
];

const commandLine = ({ command, args, nodeBin }) =>
  `${nodeBin ? `PATH=${nodeBin.replace(ROOT, '')}:$PATH ` : ''}${command} ${args.join(' ')}`;

if (process.argv.includes('--list') || process.argv.includes('--help')) {
  LANES.forEach((lane, index) => {
    console.log(`lane ${index + 1}:`);
    for (const each of lane) console.log(`  ${each.tag.padEnd(16)} ${commandLine(each)}`);
  });
  process.exit(0);
}

/** What the global set-up of each vitest run would do, done once before the lanes start. */
function prepare() {
  for (const args of [
    ['scripts/system-packages.mjs'],
    ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'],
  ]) {
    const { status } = spawnSync(process.execPath, args, { cwd: ROOT, stdio: 'inherit' });
    if (status !== 0) {
      console.error(`npm test: ${args.join(' ')} failed (exit ${status}); no tests ran`);
      process.exit(1);
    }
  }
}

const children = new Set();

/** Runs one stage with its lines prefixed; its result, time and closing summary line. */
function run(each) {
  const started = Date.now();
  const tag = `[${each.tag}]`.padEnd(18);
  return new Promise((resolve) => {
    const child = spawn(each.command, each.args, {
      cwd: ROOT,
      env: {
        ...process.env,
        PATH: pathWith(...(each.nodeBin ? [each.nodeBin] : []), BIN),
        MOAT_TEST_PREPARED: '1',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.add(child);
    let summary = '';
    for (const stream of [child.stdout, child.stderr]) {
      createInterface({ input: stream, crlfDelay: Infinity }).on('line', (line) => {
        if (/^\d+ passed, \d+ failed, \d+ skipped on Node /.test(line)) summary = line;
        process.stdout.write(`${tag} ${line}\n`);
      });
    }
    const finish = (status, why) => {
      children.delete(child);
      resolve({ tag: each.tag, status, seconds: (Date.now() - started) / 1000, summary, why });
    };
    child.on('error', (error) => finish(1, error.message));
    child.on('close', (code, signal) => finish(code ?? 1, signal ? `killed by ${signal}` : ''));
  });
}

/** Set by Ctrl-C or a SIGTERM: the running stages are stopped and no other starts. */
let stopping = false;

async function runLane(lane) {
  const results = [];
  for (const each of lane) if (!stopping) results.push(await run(each));
  return results;
}

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    stopping = true;
    for (const child of children) child.kill(signal);
  });
}

const started = Date.now();
prepare();
const results = (await Promise.all(LANES.map(runLane))).flat();
console.log('\nnpm test:');
for (const { tag, status, seconds, summary, why } of results) {
  const outcome = status === 0 ? 'ok' : `FAILED (exit ${status}${why ? `, ${why}` : ''})`;
  console.log(
    `  ${tag.padEnd(16)} ${outcome.padEnd(8)} ${seconds.toFixed(0).padStart(4)} s  ${summary}`,
  );
}
const failed = results.filter(({ status }) => status !== 0).map(({ tag }) => tag);
if (stopping) failed.push('stopped before the end');
console.log(
  failed.length === 0
    ? `all passed in ${((Date.now() - started) / 1000).toFixed(0)} s`
    : `failed: ${failed.join(', ')}`,
);
process.exit(failed.length === 0 ? 0 : 1);
