/** `filesystem.Filesystem` (being written). */
import type { Method } from './context.js';

export const FILESYSTEM_METHODS: Readonly<Record<string, Method>> = {};
