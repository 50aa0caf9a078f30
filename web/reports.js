// The Reports view, for admins and auditors: SLA attainment per week, throughput per reviewer and
// the backlog by age, each drawn here as inline SVG (no library, nothing the CSP must allow) inside a
// <figure> with its <figcaption> and a table of the same numbers for screen readers; and a link that
// downloads the period's decisions as CSV (the desk's session cookie authenticates it).
//
// A view of its own (views.js): its section is drawn the first time it is shown, and the default
// period's reports are read then. Text is set with textContent, never innerHTML.
//
// One period for everything on the view (issue 42): whole weeks, Monday to Sunday (the SLA and the
// throughput come in Monday weeks), from the Monday of the first day chosen up to the Sunday of the
// last, or today in the chosen zone if that comes first. The backlog and the Download decisions link
// cover those very days, and the weeks' days after today hold nothing yet; so the default period,
// which ends today, ends the backlog with a point for now (the API's point for the day in progress).

import { api } from "./api.js";
import { h } from "./dom.js";
import { registerView } from "./views.js";

const SVG = "http://www.w3.org/2000/svg";
// The decisions by outcome; a release hands the work back undecided and is shown apart.
const OUTCOMES = [
  ["resolved", "Resolved"],
  ["submitted_for_approval", "Submitted for approval"],
  ["approved", "Approved"],
  ["rejected", "Rejected"],
];
const SHORT = ["Resolved", "Submitted", "Approved", "Rejected"]; // the chart's legend

// --- dates: plain calendar days, as UTC midnights so that no local DST shifts them ---------------

const DAY = 86_400_000;
const isoDay = (d) => d.toISOString().slice(0, 10);
const parseDay = (text) => new Date(`${text}T00:00:00Z`);
const addDays = (d, n) => new Date(d.getTime() + n * DAY);
const monday = (d) => addDays(d, -((d.getUTCDay() + 6) % 7));

/** Today's date in the IANA zone `tz` (the API's zones are the browser's), or null if unknown. */
export function todayIn(tz, now = new Date()) {
  try {
    const parts = new Intl.DateTimeFormat("en-US", { timeZone: tz, year: "numeric", month: "2-digit", day: "2-digit" })
      .formatToParts(now);
    const part = (type) => parts.find((p) => p.type === type).value;
    return parseDay(`${part("year")}-${part("month")}-${part("day")}`);
  } catch {
    return null;
  }
}

function browserZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  } catch {
    return "UTC";
  }
}

/** The days the view covers for the local dates [first, last] chosen in `tz`, whose today is
 *  `today`: from the Monday of `first` to the Sunday of `last` or today, whichever comes first; and
 *  the API queries that cover them: the weeks (the last may run past today, into days that hold
 *  nothing yet) and the days themselves (the backlog and the decisions). */
export function reportPeriod(first, last, tz, today) {
  const start = monday(first);
  const sunday = addDays(monday(last), 6);
  const end = today && today < sunday ? (today < start ? start : today) : sunday;
  const weeks = { from: isoDay(start), to: isoDay(addDays(monday(end), 7)), tz, bucket: "week" };
  const days = { from: isoDay(start), to: isoDay(addDays(end, 1)), tz };
  // The backlog comes split by currency: the view's currency choice then needs no second request.
  return { first: start, last: end, sla: weeks, throughput: weeks, backlog: { ...days, by: "currency" }, decisions: days };
}

// --- small DOM helpers -------------------------------------------------------------------------

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

// The first `heads` cells of each row name it (row headers), the others are numbers.
function table(caption, head, rows, heads = 1) {
  return h(
    "table",
    { class: "data" },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, head.map((name) => h("th", { scope: "col" }, name)))),
    h(
      "tbody",
      {},
      rows.map((cells) =>
        h("tr", {}, cells.map((c, i) => (i < heads ? h("th", { scope: "row" }, c) : h("td", { class: "num" }, c)))),
      ),
    ),
  );
}

// One figure: its caption names it (the figure's accessible name), the SVG shows it, the table says it.
// The table scrolls in a box of its own (focusable, so the keyboard scrolls it too).
function figure(title, detail, chart, data) {
  const numbers = h("div", { class: "table-scroll", tabindex: 0, role: "region", "aria-label": `${title}: the numbers` }, data);
  return h("figure", { class: "report" }, h("figcaption", {}, h("strong", {}, title), " ", detail), chart, numbers);
}

function chartFrame(width, height, label) {
  return svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label, class: "chart" });
}

function legend(parent, x, y, names, spacing) {
  names.forEach((name, i) => {
    parent.append(svg("rect", { x: x + i * spacing, y, width: 12, height: 12, class: `series-${i}` }));
    parent.append(svg("text", { x: x + i * spacing + 16, y: y + 11, class: "legend" }, name));
  });
}

// --- the three charts --------------------------------------------------------------------------

const percent = (attainment) => (attainment === null ? "–" : `${(Number(attainment) * 100).toFixed(1)} %`);

function slaFigure(report) {
  const width = 640;
  const height = 220;
  const left = 40;
  const bottom = 180;
  const slot = (width - left - 10) / Math.max(report.buckets.length, 1);
  const chart = chartFrame(width, height, "Bar chart of SLA attainment per week; the table below gives the numbers.");
  for (const tick of [0, 0.5, 1]) {
    const y = bottom - tick * 150;
    chart.append(svg("line", { x1: left, x2: width - 10, y1: y, y2: y, class: "grid" }));
    chart.append(svg("text", { x: left - 6, y: y + 4, class: "axis end" }, `${tick * 100}%`));
  }
  report.buckets.forEach((b, i) => {
    const x = left + i * slot + slot * 0.15;
    if (b.attainment !== null) {
      const height = Number(b.attainment) * 150;
      chart.append(svg("rect", { x, y: bottom - height, width: slot * 0.7, height: height, class: "series-0" }));
    }
    chart.append(svg("text", { x: x + slot * 0.35, y: bottom - 4 - (b.attainment === null ? 0 : Number(b.attainment) * 150), class: "axis middle" }, percent(b.attainment)));
    chart.append(svg("text", { x: x + slot * 0.35, y: bottom + 16, class: "axis middle" }, b.start.slice(5)));
  });
  const rows = report.buckets.map((b) => [
    b.start, String(b.fell_due), String(b.on_time), String(b.late), String(b.open_past_due), percent(b.attainment),
  ]);
  rows.push(["Total", ...["fell_due", "on_time", "late", "open_past_due"].map((k) => String(report.total[k])), percent(report.total.attainment)]);
  return figure(
    "SLA attainment per week",
    `(weeks from ${report.from}, ${report.tz}): items resolved by their deadline, of those that fell due.`,
    chart,
    table("SLA attainment per week", ["Week of", "Fell due", "On time", "Late", "Open past due", "Attainment"], rows),
  );
}

function perReviewer(report) {
  const totals = new Map();
  for (const row of report.rows) {
    const sum = totals.get(row.reviewer) ?? Object.fromEntries([...OUTCOMES.map(([k]) => [k, 0]), ["decisions", 0], ["released", 0]]);
    for (const [k] of OUTCOMES) sum[k] += row[k];
    sum.decisions += row.decisions;
    sum.released += row.released;
    totals.set(row.reviewer, sum);
  }
  return [...totals.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

/** A time in seconds (the API's decimal string) as days, hours, minutes and seconds; "–" for none. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const total = Math.round(Number(seconds));
  const [d, h, m, s] = [Math.floor(total / 86400), Math.floor(total / 3600) % 24, Math.floor(total / 60) % 60, total % 60];
  if (total < 60) return `${s} s`;
  if (total < 3600) return `${m} min ${s} s`;
  if (total < 86400) return `${h} h ${m} min`;
  return `${d} d ${h} h`;
}

function throughputFigure(report) {
  const reviewers = perReviewer(report);
  const width = 640;
  const left = 120;
  const rowHeight = 26;
  const height = 50 + reviewers.length * rowHeight;
  const most = Math.max(1, ...reviewers.map(([, s]) => s.decisions));
  const chart = chartFrame(width, height, "Stacked bar chart of decisions per reviewer by outcome, releases apart; the table below gives the numbers week by week.");
  reviewers.forEach(([who, sum], i) => {
    const y = 10 + i * rowHeight;
    chart.append(svg("text", { x: left - 6, y: y + 15, class: "axis end" }, who));
    let x = left;
    OUTCOMES.forEach(([key], s) => {
      const w = (sum[key] / most) * (width - left - 110);
      if (w > 0) chart.append(svg("rect", { x, y, width: w, height: rowHeight - 8, class: `series-${s}` }));
      x += w;
    });
    const released = sum.released ? ` (+${sum.released} released)` : "";
    chart.append(svg("text", { x: x + 6, y: y + 15, class: "axis" }, `${sum.decisions}${released}`));
  });
  legend(chart, 10, height - 24, SHORT, 120);
  if (!reviewers.length) chart.append(svg("text", { x: left, y: 30, class: "axis" }, "No decisions in this period."));
  return figure(
    "Throughput per reviewer",
    `(weeks from ${report.from}, ${report.tz}): decisions by outcome and the time from lease to decision; a release hands the work back and is not a decision.`,
    chart,
    table(
      "Throughput per reviewer",
      ["Week of", "Reviewer", ...OUTCOMES.map(([, name]) => name), "Decisions", "Median time to decision", "p90 time to decision", "Released"],
      report.rows.map((r) => [
        r.start, r.reviewer, ...OUTCOMES.map(([k]) => String(r[k])), String(r.decisions),
        duration(r.median_lease_to_decision_s), duration(r.p90_lease_to_decision_s), String(r.released),
      ]),
      2,
    ),
  );
}

/** The backlog's points of one currency (its items open at each day's end), or of all (code ""). */
export function backlogOf(report, code) {
  if (!code) return report.points;
  const none = Object.fromEntries(report.bands.map((band) => [band, 0]));
  return report.points.map((p) => {
    const figures = (p.by_currency || {})[code];
    return { ...p, open: figures ? figures.open : 0, by_age: figures ? figures.by_age : none };
  });
}

function backlogFigure(report, code) {
  const width = 640;
  const height = 240;
  const left = 40;
  const bottom = 190;
  const points = backlogOf(report, code);
  const title = code ? `Backlog by age, ${code}` : "Backlog by age";
  const slot = (width - left - 10) / Math.max(points.length, 1);
  const most = Math.max(1, ...points.map((p) => p.open));
  const chart = chartFrame(width, height, "Stacked bar chart of open items by age at the end of each day; the table below gives the numbers.");
  chart.append(svg("text", { x: left - 6, y: bottom - 150 + 4, class: "axis end" }, String(most)));
  chart.append(svg("text", { x: left - 6, y: bottom + 4, class: "axis end" }, "0"));
  points.forEach((p, i) => {
    let y = bottom;
    report.bands.forEach((band, s) => {
      const height = (p.by_age[band] / most) * 150;
      if (height > 0) chart.append(svg("rect", { x: left + i * slot + slot * 0.1, y: y - height, width: Math.max(slot * 0.8, 1), height: height, class: `series-${s}` }));
      y -= height;
    });
  });
  // The day in progress is measured now (its point's `at` is the report's as_of), not at its end.
  const day = (p) => (p.at === report.as_of ? `${p.start} (now)` : p.start);
  if (points.length) {
    chart.append(svg("text", { x: left, y: bottom + 16, class: "axis" }, points[0].start));
    chart.append(svg("text", { x: width - 10, y: bottom + 16, class: "axis end" }, day(points[points.length - 1])));
  }
  legend(chart, 10, height - 24, report.bands, 110);
  return figure(
    title,
    `(open items${code ? ` in ${code}` : ""} at the end of each day, and now for today, ${report.tz}, by age since enqueue).`,
    chart,
    table(
      title,
      ["Day", ...report.bands, "Open"],
      points.map((p) => [day(p), ...report.bands.map((band) => String(p.by_age[band])), String(p.open)]),
    ),
  );
}

// --- the view ------------------------------------------------------------------------------------

function mountReports(container) {
  const zone = browserZone();
  const last = todayIn(zone) ?? todayIn("UTC");
  const from = h("input", { id: "reports-from", type: "date", value: isoDay(addDays(monday(last), -7 * 7)), required: true });
  const to = h("input", { id: "reports-to", type: "date", value: isoDay(last), required: true });
  const tz = h("input", { id: "reports-tz", value: zone, maxlength: 64, spellcheck: "false" });
  // "To" left at today follows today, in whichever zone is chosen when the reports are shown.
  let toToday = to.value;
  const covers = h("p", { id: "reports-period" });
  // The backlog of one currency, or of all: the currencies of the period's split once it is read.
  const currency = h("select", { id: "reports-currency" }, h("option", { value: "" }, "All currencies"));
  const status = h("p", { role: "status", class: "muted" });
  const download = h("a", { class: "download" }, "Download decisions (CSV)");
  // aria-busy while a period is read: the figures below are then the last period's, not the form's.
  const charts = h("div", { id: "reports-charts", class: "reports" });
  const form = h(
    "form",
    { class: "row" },
    h("label", { for: "reports-from" }, "From", from),
    h("label", { for: "reports-to" }, "To (last day)", to),
    h("label", { for: "reports-tz" }, "Time zone", tz),
    h("label", { for: "reports-currency" }, "Backlog currency", currency),
    h("button", { type: "submit" }, "Show reports"),
  );
  let backlogReport = null;
  let backlogChart = null;
  let shown = 0; // the latest show(): an earlier one's answer, arriving after it, is dropped

  function chooseCurrencies(report) {
    const codes = [...new Set(report.points.flatMap((p) => Object.keys(p.by_currency || {})))].sort();
    const chosen = codes.includes(currency.value) ? currency.value : "";
    currency.replaceChildren(
      h("option", { value: "" }, "All currencies"),
      ...codes.map((code) => h("option", { value: code }, code)),
    );
    currency.value = chosen;
  }

  currency.addEventListener("change", () => {
    if (!backlogReport || !backlogChart) return;
    const redrawn = backlogFigure(backlogReport, currency.value);
    backlogChart.replaceWith(redrawn);
    backlogChart = redrawn;
  });

  async function show() {
    const zoneName = tz.value.trim() || "UTC";
    const today = todayIn(zoneName); // null for a zone the browser does not know: the API says why
    if (today && to.value === toToday) to.value = toToday = isoDay(today);
    const first = parseDay(from.value);
    const lastDay = parseDay(to.value);
    if (Number.isNaN(first.getTime()) || Number.isNaN(lastDay.getTime()) || lastDay < first) {
      status.textContent = "Choose a first and a last day, the last on or after the first.";
      return;
    }
    const q = reportPeriod(first, lastDay, zoneName, today);
    // The form shows the days covered, so that the figures and the download are read for what they are.
    from.value = isoDay(q.first);
    to.value = isoDay(q.last);
    if (today && q.last.getTime() === today.getTime()) toToday = to.value;
    const until = today && q.last.getTime() === today.getTime() ? `${to.value} (today)` : to.value;
    covers.textContent = `Covers ${from.value} to ${until}, ${zoneName}: whole weeks from Monday, up to today at most; the charts, the tables and the download alike.`;
    download.href = api.decisionsCsvUrl(q.decisions);
    download.setAttribute("download", "");
    status.textContent = "Loading the reports…";
    charts.setAttribute("aria-busy", "true");
    const mine = ++shown;
    try {
      const [sla, throughput, backlog] = await Promise.all([
        api.reportSla(q.sla),
        api.reportThroughput(q.throughput),
        api.reportBacklog(q.backlog),
      ]);
      if (mine !== shown) return;
      backlogReport = backlog;
      chooseCurrencies(backlog);
      backlogChart = backlogFigure(backlog, currency.value);
      charts.replaceChildren(slaFigure(sla), throughputFigure(throughput), backlogChart);
      // The database's clock, in UTC and saying so (as_of is RFC 3339 in UTC).
      status.textContent = `As of ${sla.as_of.slice(0, 16).replace("T", " ")} UTC.`;
    } catch (error) {
      if (mine !== shown) return;
      backlogReport = backlogChart = null;
      charts.replaceChildren();
      status.textContent = error.message;
    } finally {
      if (mine === shown) charts.removeAttribute("aria-busy");
    }
  }

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    show();
  });
  container.replaceChildren(h("h2", {}, "Reports"), form, covers, h("p", {}, download), status, charts);
  return show();
}

let section = null;
let drawn = false;

registerView({
  id: "reports",
  label: "Reports",
  roles: ["auditor", "admin"],
  regions() {
    section = h("section", { "aria-label": "Reports", id: "reports" });
    drawn = false;
    return [section];
  },
  show() {
    if (drawn) return;
    drawn = true;
    mountReports(section);
  },
  reset() {
    drawn = false;
  },
});
