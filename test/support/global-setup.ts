import { execFileSync } from 'node:child_process';

/** Tests that run the real `moat` binary need dist/ built from the current sources. */
export default function setup(): void {
  execFileSync(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], {
    stdio: 'inherit',
  });
}
