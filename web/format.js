// Durations, dates and amounts as people read them.

export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours >= 48) return hours % 24 ? `${Math.floor(hours / 24)} d ${hours % 24} h` : `${hours / 24} d`;
  return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
}

export function since(iso) {
  return duration((Date.now() - Date.parse(iso)) / 1000);
}

// A decimal string as finance reads it: digits grouped by thousands, the sign kept, with its
// currency's own decimals (ISO 4217, which the API already writes: "1500" JPY, "1.234" KWD).
// Intl.NumberFormat formats a decimal string exactly, never through a float; without a currency or
// where the browser does not know it, string work alone groups the digits as sent.
export function money(amount, code) {
  if (code) {
    try {
      const digits = new Intl.NumberFormat("en-US", { style: "currency", currency: code }).resolvedOptions()
        .maximumFractionDigits;
      const format = new Intl.NumberFormat("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
      if (/^-?\d+(\.\d+)?$/.test(String(amount))) return format.format(String(amount));
    } catch {
      // an unknown code: as sent
    }
  }
  const parts = /^(-?)(\d+)(\.\d+)?$/.exec(String(amount));
  if (!parts) return String(amount);
  const [, sign, whole, fraction = ""] = parts;
  return `${sign}${whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",")}${fraction}`;
}

// The currency the matcher's context names (`currency` or `ccy`, an ISO 4217 code), else null.
export function currency(context) {
  for (const [key, value] of Object.entries(context || {})) {
    if (/^(currency|ccy)$/i.test(key) && typeof value === "string" && /^[A-Z]{3}$/.test(value)) return value;
  }
  return null;
}

// A moment as `2026-12-04 17:00 UTC`: one zone for everyone, always named.
export function when(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const two = (n) => String(n).padStart(2, "0");
  return `${d.getUTCFullYear()}-${two(d.getUTCMonth() + 1)}-${two(d.getUTCDate())} ${two(d.getUTCHours())}:${two(d.getUTCMinutes())} UTC`;
}
