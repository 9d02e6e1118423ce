import { afterEach, describe, expect, it, vi } from 'vitest';
import { choice, flag, list, readOptions, text, whole } from '../bench/lib/options.js';

const OPTIONS = {
  rounds: whole({ default: 3, min: 1, max: 9, help: 'rounds' }),
  modes: list({ known: ['moat', 'squid'], default: ['moat', 'squid'], help: 'what is measured' }),
  io: choice({ known: ['auto', 'node'], default: 'auto', help: 'relay' }),
  'node-flags': text({ default: '', value: 'FLAGS', help: 'extra node flags' }),
  strict: flag('exit 1 when a target fails'),
};

class Exit extends Error {
  constructor(readonly code: number | undefined) {
    super(`exit ${code}`);
  }
}

/** readOptions on `args`, with what it printed and the code it exited with (if it did). */
function run(args: string[]) {
  const printed = { out: '', err: '' };
  vi.spyOn(process, 'argv', 'get').mockReturnValue(['node', 'bench.js', ...args]);
  vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((printed.out += String(s)), true));
  vi.spyOn(process.stderr, 'write').mockImplementation((s) => ((printed.err += String(s)), true));
  vi.spyOn(process, 'exit').mockImplementation((code) => {
    throw new Exit(code === undefined ? undefined : Number(code));
  });
  try {
    const values = readOptions('bench:x', 'What it measures.', OPTIONS);
    return { values, exit: undefined, ...printed };
  } catch (error) {
    if (!(error instanceof Exit)) throw error;
    return { values: undefined, exit: error.code, ...printed };
  }
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe('bench options', () => {
  it('gives the defaults, and the values given', () => {
    expect(run([]).values).toEqual({
      rounds: 3,
      modes: ['moat', 'squid'],
      io: 'auto',
      'node-flags': '',
      strict: false,
    });
    expect(
      run(['--rounds', '5', '--modes=squid', '--io=node', '--node-flags=--a --b', '--strict'])
        .values,
    ).toEqual({ rounds: 5, modes: ['squid'], io: 'node', 'node-flags': '--a --b', strict: true });
  });

  it('answers --help with the usage, the summary and every option, and exits 0', () => {
    const { exit, out } = run(['--rounds=0', '--help']);
    expect(exit).toBe(0);
    expect(out).toContain('npm run bench:x -- [options]\n\nWhat it measures.\n');
    expect(out).toMatch(/--rounds=N +rounds \(default 3; 1 to 9\)/);
    expect(out).toMatch(/--modes=LIST +what is measured \(default moat,squid; of moat, squid\)/);
    expect(out).toMatch(/--io=auto\|node +relay \(default auto\)/);
    expect(out).toMatch(/--strict +exit 1 when a target fails\n/);
    expect(run(['-h']).exit).toBe(0);
  });

  it.each([
    [['--nope'], 'unknown option --nope'],
    [['--rounds=10'], '--rounds must be a whole number from 1 to 9'],
    [['--rounds=2.5'], '--rounds must be a whole number from 1 to 9'],
    [['--rounds'], '--rounds needs a value (--rounds=N)'],
    [['--rounds', '--strict'], '--rounds needs a value (--rounds=N)'],
    [['--modes=moat,x'], '--modes has an unknown item "x"'],
    [['--io=fast'], '--io must be one of auto, node'],
    [['--strict=yes'], '--strict takes no value'],
    [['extra'], 'unexpected argument extra'],
  ])('refuses %j with one line and exit 2', (args, problem) => {
    const { exit, err, out } = run(args);
    expect(exit).toBe(2);
    expect(err).toBe(`bench:x: ${problem}; see --help\n`);
    expect(out).toBe('');
  });
});
