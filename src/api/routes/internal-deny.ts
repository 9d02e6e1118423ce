/**
 * `GET /internal-deny`: this node's hard internal deny list, each range as written with its
 * note, so that a client deciding recorded traffic again (`moat check --replay-api`) decides it
 * under the list the node enforced rather than its own default.
 */
import { type PlatformRoute, route } from './route.js';
import { errors } from './schemas.js';

export const internalDenyRoute: PlatformRoute = route({
  method: 'GET',
  url: '/internal-deny',
  summary: "This node's internal deny list: the ranges no sandbox rule can open",
  auth: true,
  schema: {
    response: {
      200: {
        type: 'object',
        properties: {
          internalDeny: {
            type: 'array',
            items: {
              type: 'object',
              properties: { entry: { type: 'string' }, description: { type: 'string' } },
              required: ['entry', 'description'],
            },
          },
        },
        required: ['internalDeny'],
      },
      ...errors(401),
    },
  },
  handler: async (_request, _reply, { internalDeny }) => ({
    internalDeny: internalDeny.map(({ entry, description }) => ({ entry, description })),
  }),
});
