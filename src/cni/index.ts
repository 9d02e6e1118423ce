/**
 * Moat's CNI plugin (`type: "moat"`): a CNI runtime's containers and VMs attached to Moat as
 * network-only sandboxes, and the install that puts the plugin where a runtime finds it.
 */
export { DEFAULT_API, DEFAULT_KEY_FILE } from './conf.js';
export { type InstallOptions, type Installed, installPlugin, NETWORK_NAME } from './install.js';
export { type PluginOutput, runPlugin } from './plugin.js';
export { CNI_CODES, SUPPORTED_VERSIONS } from './spec.js';
