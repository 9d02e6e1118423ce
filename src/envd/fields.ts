/** Request fields of the sandbox API's RPCs (proto3 JSON: lowerCamelCase, snake_case also accepted). */
import { invalid } from './file-errors.js';

type Message = Record<string, unknown>;

export function fieldOf(message: Message, name: string): unknown {
  const snake = name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
  return message[name] ?? message[snake];
}

export function stringField(message: Message, name: string): string {
  const value = fieldOf(message, name);
  if (typeof value !== 'string' || value === '') throw invalid(`${name} is required`);
  return value;
}

export function boolField(message: Message, name: string): boolean {
  const value = fieldOf(message, name);
  if (value === undefined || value === null) return false;
  if (typeof value !== 'boolean') throw invalid(`${name} must be true or false`);
  return value;
}
