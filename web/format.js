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
