// A real OpenID Connect provider for the tests: panva's oidc-provider (OpenID Certified), in memory.
// Started by tests/support/oidc_provider.py with its configuration as JSON in OIDC_TEST_CONFIG:
//   {port, issuer, initial_access_token, users: {login: {preferred_username, groups, ...}},
//    clients: [static clients, e.g. client credentials ones], resources: [audience, ...],
//    conform_id_token_claims: bool}
// Desk clients are registered by the tests through the provider's own registration endpoint
// (RFC 7591), with the redirect URI of the server each test starts. The development interactions give a plain
// login form (any login, any password) and a consent page, which a browser test fills like a person.
// Additions for the tests only: GET /_test/requests counts the requests per path, so a test
// can prove what the service fetched (discovery, keys) and how often; POST /_test/next_id_token
// {id_token} makes the token endpoint's next answer carry that ID token instead of its own (signed
// by the test with the provider's own key, config.jwks), for claims no real configuration gives.
import Provider, { errors } from "oidc-provider";

const config = JSON.parse(process.env.OIDC_TEST_CONFIG);
const users = config.users;
const requests = {};
let nextIdToken = null;

function account(id) {
  const user = users[id] ?? {};
  const claims = {
    sub: id,
    preferred_username: user.preferred_username ?? id,
    name: user.name ?? id,
    email: `${id}@example.com`,
    email_verified: true,
    groups: user.groups ?? [],
  };
  return { accountId: id, claims: async () => claims };
}

// Per-client test metadata: test_ttl_s shortens every token the client gets (the expiry tests);
// test_opaque makes its access tokens for the API opaque rather than JWTs.
const ttl = (fallback) => (_ctx, _token, client) => client?.test_ttl_s ?? fallback;

const provider = new Provider(config.issuer, {
  clients: config.clients ?? [],
  findAccount: async (_ctx, id) => account(id),
  claims: {
    openid: ["sub"],
    profile: ["preferred_username", "name"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  conformIdTokenClaims: config.conform_id_token_claims ?? true,
  cookies: { keys: ["review-queue-test-cookie-key"] },
  ...(config.jwks ? { jwks: config.jwks } : {}),
  pkce: { required: () => true },
  extraClientMetadata: { properties: ["test_groups", "test_ttl_s", "test_opaque"] },
  ttl: {
    AccessToken: ttl(600),
    ClientCredentials: ttl(600),
    IdToken: ttl(3600),
    Interaction: 600,
    Session: 3600,
    Grant: 3600,
  },
  features: {
    devInteractions: { enabled: true },
    registration: { enabled: true, initialAccessToken: config.initial_access_token },
    clientCredentials: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    // RFC 7662 and RFC 7009: a confidential client (the desk's) may introspect any token; a
    // client may revoke its own.
    introspection: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, resource, client) => {
        if (!config.resources.includes(resource)) throw new errors.InvalidTarget();
        return {
          scope: "queue",
          audience: resource,
          accessTokenTTL: client.test_ttl_s ?? 600,
          // test_opaque: the client's access tokens for the API are opaque (checked by introspection).
          ...(client.test_opaque
            ? { accessTokenFormat: "opaque" }
            : { accessTokenFormat: "jwt", jwt: { sign: { alg: "RS256" } } }),
        };
      },
    },
  },
  // Access tokens carry what the API reads: a person's name and groups, or a client's groups.
  extraTokenClaims: async (ctx, token) => {
    if (token.kind === "ClientCredentials") {
      const client = await ctx.oidc.provider.Client.find(token.clientId);
      return { groups: client?.test_groups ?? [] };
    }
    if (token.accountId) {
      const claims = await account(token.accountId).claims();
      return { preferred_username: claims.preferred_username, groups: claims.groups };
    }
    return undefined;
  },
});
provider.proxy = false;

provider.use(async (ctx, next) => {
  if (ctx.path === "/_test/requests") {
    ctx.body = requests;
    return;
  }
  if (ctx.path === "/_test/next_id_token" && ctx.method === "POST") {
    let raw = "";
    for await (const chunk of ctx.req) raw += chunk;
    nextIdToken = JSON.parse(raw).id_token;
    ctx.status = 204;
    return;
  }
  requests[ctx.path] = (requests[ctx.path] ?? 0) + 1;
  await next();
  if (ctx.path === "/token" && nextIdToken !== null && ctx.body?.id_token) {
    ctx.body = { ...ctx.body, id_token: nextIdToken };
    nextIdToken = null;
  }
});

const server = provider.listen(config.port, () => {
  console.log(`ready ${config.issuer}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
