// Sign-in with the company's identity provider (OpenID Connect): the "Sign in with <provider>" link
// and the sentence for a sign-in the service refused. The service's callback names only a code in the
// address (/desk/?sign_in_error=CODE); the words are this table's, so a crafted link cannot put its
// own text on the page.

import { api } from "./api.js";

// RFC 6749 4.1.2.1 error codes from the provider (the callback passes on plain ones only).
const PROVIDER_ERRORS = {
  access_denied: "You cancelled the sign-in, or the identity provider refused it.",
  login_required: "The identity provider needs you to sign in again.",
  interaction_required: "The identity provider needs you to sign in again.",
  consent_required: "The identity provider needs your consent before you can sign in.",
  temporarily_unavailable: "The identity provider is busy. Please try again in a minute.",
  server_error: "The identity provider had a problem. Please try again in a minute.",
};

const SIGN_IN_ERRORS = {
  OIDC_PROVIDER_ERROR: (providerError) =>
    PROVIDER_ERRORS[providerError] ?? "The identity provider did not sign you in. Please try again.",
  OIDC_STATE_INVALID: () =>
    "That sign-in was already used, took too long, or was started in another browser. Please sign in again.",
  OIDC_NO_ROLE: () =>
    "Your account is in none of the groups that give access to the reviewer desk, so you were not signed in. Ask an administrator to add you to one.",
  OIDC_AMBIGUOUS_ROLE: () =>
    "Your account is in groups whose roles cannot be combined (reviewer and auditor, for example), so you were not signed in. Ask an administrator to leave you in one of them.",
  OIDC_BAD_SUBJECT: () =>
    "The identity provider gave a user name the reviewer desk cannot use, so you were not signed in. Ask an administrator.",
  OIDC_ID_TOKEN_INVALID: () =>
    "The identity provider's answer could not be verified, so you were not signed in. Please try again; if it keeps happening, tell an administrator.",
  OIDC_EXCHANGE_FAILED: () => "The identity provider did not confirm the sign-in. Please try again.",
  OIDC_SUBJECT_TAKEN: () =>
    "The user name your identity provider gave belongs to another account here, so you were not signed in. Ask an administrator.",
  IDENTITY_PROVIDER_UNAVAILABLE: () => "The identity provider cannot be reached right now. Please try again in a minute.",
};

let provider = null; // {provider_name, login_url} when the service offers it

export async function loadProvider() {
  try {
    const found = await api.oidcProvider();
    provider = found.enabled ? found : null;
  } catch {
    provider = null; // the token sign-in still works
  }
}

// The sentence for a refused sign-in named in the address, once: the address is cleaned up, so a
// reload does not show it again.
export function takeSignInError() {
  const params = new URLSearchParams(window.location.search);
  const code = params.get("sign_in_error");
  if (code === null) return null;
  window.history.replaceState(null, "", window.location.pathname);
  const sentence = SIGN_IN_ERRORS[code];
  return sentence ? sentence(params.get("provider_error")) : "The sign-in did not work. Please try again.";
}

// "Sign in with <provider>", a plain link (the sign-in is a navigation), or null when not offered.
export function providerSignIn(h) {
  if (!provider) return null;
  return h(
    "p",
    {},
    h("a", { href: provider.login_url, class: "button primary" }, `Sign in with ${provider.provider_name}`),
  );
}
