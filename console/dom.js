/**
 * Building page elements. Every piece of text goes in through textContent: nothing the API
 * answers is ever parsed as HTML, so a destination named `<img onerror=...>` shows as text.
 */

/** Attributes `el` may set: none of them can run script or load anything. */
const SAFE_ATTRIBUTES = new Set([
  'class',
  'title',
  'type',
  'value',
  'for',
  'id',
  'role',
  'colspan',
]);

/**
 * An element with attributes and children; strings and numbers become text nodes, null and
 * undefined are left out.
 */
export function el(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('data-') || name.startsWith('aria-') || SAFE_ATTRIBUTES.has(name)) {
      element.setAttribute(name, String(value));
    } else {
      throw new Error(`el: attribute ${name} is not one the console sets`);
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
}

/** The element with this id (the page's own markup has it). */
export const byId = (id) => {
  const element = document.getElementById(id);
  if (element === null) throw new Error(`the page has no #${id}`);
  return element;
};

/** 1536 -> "1.5 KiB". */
export function formatBytes(bytes) {
  if (typeof bytes !== 'number') return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

const two = (n) => String(n).padStart(2, '0');

/** An ISO time as the local wall clock, to the millisecond. */
export function formatTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso ?? '');
  const ms = String(date.getMilliseconds()).padStart(3, '0');
  return `${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}.${ms}`;
}

/** An ISO time as the local date and wall clock, to the second. */
export function formatDateTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso ?? '');
  const day = `${date.getFullYear()}-${two(date.getMonth() + 1)}-${two(date.getDate())}`;
  return `${day} ${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}`;
}

/** 1234 -> "1,234" (counts in the sandbox list). */
export const formatCount = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '–');
