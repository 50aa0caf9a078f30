"""deploy/prometheus/alerts.yml and deploy/grafana/review-queue.json, checked with Prometheus's own
promtool and against a real scrape of /metrics from `review-queue serve`."""

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.receiver import Receiver
from db import roles
from tests.support import DEPLOY, backdate_lease, wait_for
from tests.support.api import assert_problem, item_body
from tests.support.postgres import create_token, fresh_database, libpq, with_database
from tests.support.servers import start_server, stop_server

ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "review-queue.json"

# One rule per row of the README's alert table, plus the quarantine of issue 10 and the SLA of issue 12.
EXPECTED_ALERTS = {
    "ReviewQueueLeaseLeak",
    "ReviewQueueExpiredLeasesNotReclaimed",
    "ReviewQueueLockTimeouts",
    "ReviewQueueOldestPendingTooOld",
    "ReviewQueueUnavailable",
    "ReviewQueueItemsQuarantined",
    "ReviewQueueSlaBreached",
    # Issue 27: webhooks.
    "ReviewQueueWebhookFailing",
    "ReviewQueueWebhookLagging",
    # Issue 29: the event trail's monthly partitions, and its monthly archive.
    "ReviewQueueEventPartitionsRunningOut",
    "ReviewQueueArchiveOverdue",
    # Issue 40: open items in a currency with no exchange rate (each needs an approver).
    "ReviewQueueItemsWithoutRate",
}
# Recording rules (the dashboard's SLA attainment panel reads the first).
EXPECTED_RECORDS = {"review_queue:sla_attainment_7d:ratio"}
RULES = len(EXPECTED_ALERTS) + len(EXPECTED_RECORDS)
# Metrics a rule or panel may use before the service exposes them (none now). Listed only while
# absent: the test fails once one appears, so the list cannot go stale.
PENDING_METRICS: set[str] = set()

METRIC = re.compile(r"\breview_queue_[a-z0-9_]+")


def _rules() -> list[dict[str, object]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]


def _promtool(promtool: str, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_alert_rules_pass_promtool_check(promtool: str) -> None:
    out = _promtool(promtool, "check", "rules", str(ALERTS))
    assert f"SUCCESS: {RULES} rules found" in out, out


def test_alert_rules_fire_and_stay_quiet_in_promtool_unit_tests(promtool: str) -> None:
    _promtool(promtool, "test", "rules", str(ALERT_TESTS))


def test_every_alert_has_a_severity_a_runbook_and_a_firing_and_a_quiet_case() -> None:
    rules = [r for r in _rules() if "alert" in r]
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    assert {r["record"] for r in _rules() if "record" in r} == EXPECTED_RECORDS
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule  # type: ignore[index]
        assert len(rule["annotations"]["runbook"]) > 40, rule  # type: ignore[index]
        assert rule["annotations"]["summary"], rule  # type: ignore[index]
    cases = [
        case
        for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for name in EXPECTED_ALERTS:
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == name}
        assert outcomes == {True, False}, f"{name}: needs a firing and a not-firing case, has {outcomes}"


def test_dashboard_queries_are_valid_promql(promtool: str, tmp_path: Path) -> None:
    # promtool has no expression checker of its own; as recording rules, it parses every query.
    exprs = _dashboard_exprs()
    rules = [
        {"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m")}
        for i, e in enumerate(exprs)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _promtool(promtool, "check", "rules", str(path))


def test_dashboard_has_the_operators_panels() -> None:
    text = " ".join(_dashboard_exprs())
    for metric in (
        "review_queue_pending_items",  # queue depth
        "review_queue_assigned_items",  # leases in flight
        "review_queue_oldest_pending_age_seconds",
        "review_queue_http_request_duration_seconds_bucket",  # latency
        "review_queue_database_unavailable_total",  # 503s
        "review_queue_overdue_items",  # the SLA
        "review_queue_webhook_delivery_lag_seconds",  # webhooks
        "review_queue_webhook_attempts_total",
        "review_queue:sla_attainment_7d:ratio",  # SLA attainment, the recording rule
    ):
        assert metric in text, f"no panel queries {metric}"


@pytest.fixture(scope="module")
def scrape(server_url: str, template_db: str) -> Iterator[str]:
    """/metrics of a live `review-queue serve` (with its deliverer) after every kind of transition,
    a webhook delivery, a lock timeout and a 503, so labelled counters have samples."""
    receiver = Receiver().start()
    with fresh_database(server_url, template_db) as name:
        url = with_database(server_url, name, role=roles.APP_ROLE)
        env = {
            "DATABASE_URL": url,
            "REVIEW_QUEUE_METRICS_TOKEN": "scrape-secret",
            "REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP": "1",
            "REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "REVIEW_QUEUE_DELIVERER_INTERVAL_MS": "100",
        }
        process, base = start_server(env, deliverer=True)
        try:
            yield _exercise_and_scrape(base, url, with_database(server_url, name), receiver)
        finally:
            stop_server(process)
            receiver.stop()


def _exercise_and_scrape(base: str, url: str, arrange_url: str, receiver: Receiver) -> str:
    admin = {"Authorization": f"Bearer {create_token(url, 'ops', 'admin')}"}
    ann = {"Authorization": f"Bearer {create_token(url, 'ann', 'reviewer')}"}
    with httpx.Client(base_url=base, timeout=30) as http, psycopg.connect(libpq(arrange_url)) as sql:
        hook = http.put("/webhooks/ledger", json={"url": receiver.url()}, headers=admin)
        assert hook.status_code == 201, hook.text
        for _ in range(4):
            assert http.post("/items", json=item_body(), headers=admin).status_code == 201
        held = http.post("/leases", json={"batch_size": 4}, headers=ann).json()["items"]
        assert len(held) == 4
        done = http.post(f"/items/{held[0]['id']}/complete", json={"resolution": "APPROVED"}, headers=ann)
        assert done.status_code == 200
        assert http.post(f"/items/{held[1]['id']}/renew", headers=ann).status_code == 200
        assert http.post(f"/items/{held[2]['id']}/release", headers=ann).status_code == 200
        backdate_lease(sql, held[3]["id"])
        sql.commit()
        assert http.post("/admin/reclaim", headers=admin).json()["reclaimed"] == 1
        # The RESOLVED event, by the deliverer child: counted before its outcome is recorded.
        wait_for(lambda: http.get("/webhooks/ledger/deliveries", headers=admin).json()["deliveries"], 60)
        sql.execute("LOCK TABLE review_queue_item IN ACCESS EXCLUSIVE MODE")
        assert_problem(http.post("/leases", headers=ann), 503, "DATABASE_UNAVAILABLE")
        sql.rollback()
        response = http.get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
    assert response.status_code == 200, response.text
    return response.text


def test_a_real_scrape_passes_promtool_check_metrics(promtool: str, scrape: str) -> None:
    _promtool(promtool, "check", "metrics", stdin=scrape)


def test_every_metric_the_alerts_and_dashboard_query_is_in_a_real_scrape(scrape: str) -> None:
    scraped = {s.name for f in text_string_to_metric_families(scrape) for s in f.samples}
    queried = set(METRIC.findall(" ".join([*(str(r["expr"]) for r in _rules()), *_dashboard_exprs()])))
    assert queried, "no review_queue_ metric found in the queries"
    stale = PENDING_METRICS & scraped
    assert not stale, f"{stale} are exposed now: drop them from PENDING_METRICS"
    missing = queried - scraped - PENDING_METRICS
    assert not missing, f"queried but not in a real scrape: {sorted(missing)}"


def test_the_scrape_config_in_the_production_checklist_passes_promtool(promtool: str, tmp_path: Path) -> None:
    text = (DEPLOY.parent / "docs" / "production.md").read_text()
    (snippet,) = re.findall(r"```yaml\n(.*?)```", text, re.S)
    config = yaml.safe_load(snippet)
    # The paths the checklist names, pointed at this checkout's files.
    token = tmp_path / "review-queue-metrics-token"
    token.write_text("scrape-secret\n")
    config["scrape_configs"][0]["authorization"]["credentials_file"] = str(token)
    assert config["rule_files"] == ["/etc/prometheus/rules/review-queue-alerts.yml"]
    config["rule_files"] = [str(ALERTS)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    out = _promtool(promtool, "check", "config", str(path))
    assert f"SUCCESS: {RULES} rules found" in out, out


def test_the_sla_gauges_count_the_last_week(scrape: str) -> None:
    """The scrape's world: one item resolved a moment after enqueue, due days later: nothing fell
    due in the last 7 days, so both gauges are 0 and the recording rule has no ratio (no 0/0)."""
    samples = {s.name: s.value for f in text_string_to_metric_families(scrape) for s in f.samples}
    assert samples["review_queue_sla_fell_due_items"] == 0
    assert samples["review_queue_sla_on_time_items"] == 0
