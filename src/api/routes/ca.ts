/**
 * `GET /ca.pem`: the certificate of this node's egress CA, for operators who bring their own
 * images (Moat's own sandboxes trust it already). Only the certificate: the key never leaves the
 * node's data folder.
 */
import { type PlatformRoute, route } from './route.js';
import { errors } from './schemas.js';

export const caRoute: PlatformRoute = route({
  method: 'GET',
  url: '/ca.pem',
  summary: "This node's egress CA certificate (PEM): add it to the trust store of your own images",
  auth: true,
  schema: {
    response: {
      200: { type: 'string', description: 'application/x-pem-file' },
      ...errors(401),
    },
  },
  handler: async (_request, reply, { caCertificatePem }) => {
    reply.header('content-type', 'application/x-pem-file');
    return caCertificatePem;
  },
});
