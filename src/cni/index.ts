/**
 * Moat's CNI plugin (`type: "moat"`): a CNI runtime's containers and VMs attached to Moat as
 * network-only sandboxes, and the install that puts the plugin where a runtime finds it. The
 * plugin itself runs from its own entry (`main.ts`), which the installed executable names.
 */
export { DEFAULT_API, DEFAULT_KEY_FILE } from './conf.js';
export { type InstallOptions, type Installed, installPlugin, NETWORK_NAME } from './install.js';
