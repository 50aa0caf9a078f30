"""Example bodies of the reports (api/routes/reports.py) for the OpenAPI document (api/examples.py)."""

SLA_BUCKET = {"fell_due": 16, "on_time": 15, "late": 1, "open_past_due": 0, "attainment": "0.9375"}
SLA_OUT = {
    "from": "2026-11-02",
    "to": "2026-11-16",
    "tz": "Europe/Berlin",
    "bucket": "week",
    "as_of": "2026-12-04T09:00:00+00:00",
    "ledger_entity": None,
    "buckets": [
        {"start": "2026-11-02", **SLA_BUCKET},
        {
            "start": "2026-11-09",
            "fell_due": 0,
            "on_time": 0,
            "late": 0,
            "open_past_due": 0,
            "attainment": None,
        },
    ],
    "total": SLA_BUCKET,
}
THROUGHPUT_OUT = {
    "from": "2026-11-02",
    "to": "2026-11-03",
    "tz": "UTC",
    "bucket": "day",
    "as_of": "2026-12-04T09:00:00+00:00",
    "reviewer": None,
    "rows": [
        {
            "start": "2026-11-02",
            "reviewer": "alice",
            "resolved": 41,
            "submitted_for_approval": 2,
            "approved": 0,
            "rejected": 0,
            "released": 3,
            "decisions": 46,
            "median_lease_to_decision_s": "94.518233",
            "p90_lease_to_decision_s": "412.004871",
        }
    ],
}
BACKLOG_OUT = {
    "from": "2026-12-03",
    "to": "2026-12-05",
    "tz": "UTC",
    "bucket": "day",
    "as_of": "2026-12-04T09:00:00+00:00",
    "bands": ["0-1d", "1-3d", "3-7d", "7-30d", "30d+"],
    "points": [
        {
            "start": "2026-12-03",
            "at": "2026-12-04T00:00:00+00:00",
            "open": 57,
            "by_age": {"0-1d": 31, "1-3d": 17, "3-7d": 8, "7-30d": 1, "30d+": 0},
        },
        {
            "start": "2026-12-04",
            "at": "2026-12-04T09:00:00+00:00",
            "open": 49,
            "by_age": {"0-1d": 20, "1-3d": 21, "3-7d": 7, "7-30d": 1, "30d+": 0},
        },
    ],
}
