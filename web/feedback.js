// What the desk says back: the notice line, the banner while the service is away, and the one rule
// for errors (retry while the database is away, back to sign-in on a 401, else a sentence).

import { ApiError } from "./api.js";
import { $ } from "./dom.js";
import { endSession, state } from "./state.js";

export function renderBanner() {
  const banner = $("banner");
  banner.hidden = !state.banner;
  banner.textContent = state.banner || "";
}

export function renderNotice() {
  const notice = $("notice");
  notice.textContent = state.notice ? state.notice.text : "";
  notice.className = state.notice?.error ? "notice error" : "notice";
}

export function say(text, error = false) {
  state.notice = text ? { text, error } : null;
  renderNotice();
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Runs a call; while the database is away it shows the banner and tries again, forever, with a
// growing pause (1 s .. 5 s). Any other error is the caller's to handle.
export async function withRetry(fn) {
  for (let attempt = 0; ; attempt++) {
    try {
      const result = await fn();
      if (state.banner) {
        state.banner = null;
        renderBanner();
      }
      return result;
    } catch (error) {
      if (!(error instanceof ApiError) || !error.retryable) throw error;
      state.banner = error.message;
      renderBanner();
      await sleep(Math.min(5000, 1000 * (attempt + 1)));
    }
  }
}

export function handle(error) {
  if (error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401) {
    endSession("Your session has ended. Sign in again.");
    return;
  }
  say(error instanceof ApiError ? error.message : "Something went wrong. Please reload the page.", true);
  if (!(error instanceof ApiError)) console.error(error);
}
