"""Mutation check: each test the Reliability table (docs/reliability.md) names must fail when the
property it proves is broken on purpose.

For every mutant below, the source tree is copied to a temporary directory (the real tree is never
touched), the bug is applied there by exact text replacement, and the named test runs in the copy
in its own `python -m pytest` (same interpreter, same PostgreSQL server). The mutant must be killed:
the test must fail. A replacement whose text is not found exactly once fails this check loudly
("mutation no longer applies"), so a refactor that moves the code makes the mutant be rewritten,
never silently skipped. The first named test of each file first runs on an unmutated copy and must
pass there, so a kill is the mutation's doing, not the copy's: what a copy can lack (a path, a file,
a setting) mostly breaks a file's fixtures, for all its tests, and the suite itself runs every named
test on the real tree. The trade: a test body of its own that reads what the copy leaves out (.git,
.data) would count as killing its mutant unchecked. (All 61 took 172 s of the check's time in CI;
one per file, 26, took 91 s.)
"""

import compileall
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.settings import REPO_ROOT

# One worker runs the whole module. Ungrouped, `--dist loadgroup` deals these tests one by one to
# both workers, and each worker's module-scoped `runs` started every copy (all mutants and the
# control): the check's nested sessions ran twice, or more when a worker came back to the module.
pytestmark = pytest.mark.xdist_group("mutations")


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    test: str  # the pytest node id that must fail
    edits: tuple[Edit, ...]


# db/queue/ by the item's lifecycle: each mutant edits the module its statement lives in.
ROWS = "db/queue/rows.py"  # the guards every holder-only statement shares
LEASE = "db/queue/lease.py"
COMPLETION = "db/queue/completion.py"
APPROVAL = "db/queue/approval.py"
MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "a rejected proposal is anyone's at once (no return to its preparer)",
        "tests/integration/db/test_queue.py::test_racing_reviewers_never_take_a_proposal_returned_to_its_preparer",
        (Edit(LEASE, "        wanted.append(_not_returned())\n", ""),),
    ),
    Mutant(
        "a long search term's LIKE wildcards left unescaped (its `_` matches any character)",
        "tests/integration/api/test_search.py::test_a_term_longer_than_the_indexed_prefixes_is_checked_whole",
        (
            Edit(
                "db/queue/reads.py",
                '    return term.replace("\\\\", "\\\\\\\\").replace("%", "\\\\%").replace("_", "\\\\_")\n',
                "    return term\n",
            ),
        ),
    ),
    Mutant(
        "no SKIP LOCKED in the lease",
        "tests/integration/db/test_queue.py::test_two_workers_never_double_lease",
        (
            Edit(
                LEASE,
                '        .with_for_update(skip_locked=True)\n        .cte(f"{prefix}candidate")',
                '        .cte(f"{prefix}candidate")',
            ),
        ),
    ),
    Mutant(
        "check-then-act completion (read the holder, then update by id)",
        "tests/integration/db/test_queue.py::test_a_completion_queued_behind_a_reclaim_in_flight_loses",
        (
            Edit(
                COMPLETION,
                "_resolved = (\n    item.update()\n"
                "    .where(*_held_by_caller(item_id=_entry.item_id, fence_nonce=_entry.fence_nonce))",
                "_resolved = (\n    item.update()\n    .where(item.c.id == _entry.item_id)",
            ),
            # The read it checks with lives in reads.py (completion.py has no other use for it).
            Edit(
                COMPLETION,
                "from db.queue.rows import (\n",
                "from db.queue.reads import get_item\nfrom db.queue.rows import (\n",
            ),
            Edit(
                COMPLETION,
                "    result = await unit.execute(_COMPLETE_ITEMS, params)\n",
                '    seen = [await get_item(unit, item_id=i) for i in params["item_ids"]]\n'
                '    params["item_ids"] = [\n'
                '        i if s is not None and s.state == "ASSIGNED" and s.leased_by == reviewer\n'
                "        else UUID(int=0)\n"
                '        for i, s in zip(params["item_ids"], seen, strict=True)\n'
                "    ]\n"
                "    result = await unit.execute(_COMPLETE_ITEMS, params)\n",
            ),
        ),
    ),
    Mutant(
        "no holder guard",
        "tests/integration/db/test_queue.py::test_late_completion_after_reclaim_matches_nothing",
        (Edit(ROWS, '        item.c.leased_by == bindparam("actor", type_=Text),\n', ""),),
    ),
    Mutant(
        # The fence: a lease_token names one lease (its nonce; the epoch before that). Without the
        # check, a stale tab's token passes whenever the same reviewer holds a newer lease.
        "no epoch guard (the lease-token fence)",
        "tests/integration/api/test_lifecycle.py::TestFencing::test_same_reviewer_stale_token_is_refused",
        (
            Edit(
                ROWS,
                "        item.c.lease_nonce == func.coalesce(fence_nonce, item.c.lease_nonce),\n",
                "",
            ),
        ),
    ),
    Mutant(
        # A source revision moves the lease on; without this guard a tokenless completion would
        # decide on figures the reviewer never saw.
        "completion ignores a source revision",
        "tests/system/api/test_revisions.py::test_tokenless_completion_must_carry_the_current_source_hash_after_a_revision",
        (
            Edit(
                COMPLETION,
                "    .where(*_saw_current_source(_entry.fence_nonce, _entry.expected_source_hash))\n",
                "",
            ),
        ),
    ),
    Mutant(
        "append-only trigger dropped",
        "tests/integration/api/test_events.py::test_the_database_refuses_to_edit_events",
        (
            Edit(
                "alembic/versions/2026_12_02_1900_lease_lifecycle_and_audit.py",
                "        CREATE TRIGGER review_queue_event_no_change\n"
                "        BEFORE UPDATE OR DELETE ON review_queue_event\n"
                "        FOR EACH ROW EXECUTE FUNCTION review_queue_event_append_only()\n",
                "        SELECT 1\n",
            ),
        ),
    ),
)

# Issue 23: the mutation audit's survivors (49 mutants, 8 survived), and the guards it found caught
# only through a CHECK's 500, each now killed by a test of its own.
MUTANTS += (
    Mutant(
        "reject without its prepared_by <> caller guard",
        "tests/integration/api/test_approval.py::test_approve_and_reject_refuse_the_preparer_by_their_own_guard",
        (
            Edit(
                APPROVAL,
                "_rejected = (\n    item.update()\n    .where(*_held_by_caller(AWAITING_APPROVAL))\n"
                '    .where(_not_prepared_by("actor"))\n',
                "_rejected = (\n    item.update()\n    .where(*_held_by_caller(AWAITING_APPROVAL))\n",
            ),
        ),
    ),
    Mutant(
        "approve without its prepared_by <> caller guard",
        "tests/integration/api/test_approval.py::test_approve_and_reject_refuse_the_preparer_by_their_own_guard",
        (
            Edit(
                APPROVAL,
                "_approved = (\n    item.update()\n    .where(*_held_by_caller(AWAITING_APPROVAL))\n"
                '    .where(_not_prepared_by("actor"))\n',
                "_approved = (\n    item.update()\n    .where(*_held_by_caller(AWAITING_APPROVAL))\n",
            ),
        ),
    ),
    Mutant(
        "the approval lease without its preparer guard",
        "tests/integration/api/test_approval.py::test_the_approval_lease_skips_the_preparers_proposal_by_its_own_guard",
        (
            Edit(
                LEASE,
                'wanted = [*unheld, _not_prepared_by("actor")] if approval',
                "wanted = [*unheld] if approval",
            ),
        ),
    ),
    Mutant(
        "the four_eyes CHECK without approved_by <> resolved_by",
        "tests/integration/api/test_approval.py::test_the_database_refuses_an_approval_by_the_resolver",
        (
            Edit(
                "alembic/versions/2026_12_04_0600_case_folded_identities.py",
                '"approved_by IS NULL OR (lower(approved_by) <> lower(resolved_by)'
                ' AND approved_at IS NOT NULL)"',
                '"approved_by IS NULL OR approved_at IS NOT NULL"',
            ),
        ),
    ),
    Mutant(
        "the per-person cap not counting approval leases",
        "tests/integration/api/test_approval.py::test_approval_leases_count_against_the_per_person_cap",
        (
            Edit(LEASE, "    case,\n    func,\n", "    case,\n    false,\n    func,\n"),  # for false() below
            Edit(
                LEASE,
                "    .where(item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_not(None))\n"
                '    .where(item.c.leased_by == bindparam("actor", type_=Text))\n',
                "    .where(false())\n",
            ),
        ),
    ),
    Mutant(
        "the sealer ordering by id instead of (xid, id)",
        "tests/integration/db/test_audit.py::test_a_transaction_whose_xid_order_differs_from_its_id_order_is_sealed_in_xid_order",
        (
            Edit(
                # The sealer as the archive's revision replaced it (the one at head).
                "alembic/versions/2026_12_05_0900_archive.py",
                "        ORDER BY e.xid, e.id\n",
                "        ORDER BY e.id\n",
            ),
        ),
    ),
    Mutant(
        "script-src * in the desk's CSP",
        "tests/integration/api/test_session.py::test_the_desk_is_served_with_a_strict_csp",
        (Edit("api/desk.py", "script-src 'self';", "script-src *;"),),
    ),
    Mutant(
        "no nosniff on the desk",
        "tests/integration/api/test_session.py::test_the_desk_is_served_with_a_strict_csp",
        (Edit("api/desk.py", '    (b"x-content-type-options", b"nosniff"),\n', ""),),
    ),
    Mutant(
        "sign-in not checking revocation",
        "tests/integration/api/test_session.py::test_a_revoked_token_gets_no_session",
        (
            Edit(
                "db/sessions.py",
                "api_token.c.token_hash == hash_token(token), LIVE",
                "api_token.c.token_hash == hash_token(token)",
            ),
        ),
    ),
    Mutant(
        "the verifier accepting a first line with a non-zero prev_hash",
        "tests/integration/db/test_audit.py::test_an_export_whose_first_line_links_to_anything_but_genesis_is_broken",
        (Edit("db/chain.py", "if seq == 1 and prev_hash != GENESIS:", "if False:"),),
    ),
    Mutant(
        "the desk's idle check in waitForWork",
        "tests/system/web/test_desk.py::test_waiting_for_work_stops_when_the_reviewer_is_away",
        (
            Edit(
                "web/review.js",  # the desk as ES modules: waitForWork lives in the review view
                "      if (idleFor() >= state.me.idle_release_s * 1000) {\n"
                '        state.paused = "Stopped waiting for work while you were away.',
                '      if (false) {\n        state.paused = "Stopped waiting for work while you were away.',
            ),
        ),
    ),
    Mutant(
        "feed pages stopping at limit - 1",
        "tests/integration/db/test_feed.py::test_a_page_holds_limit_events_while_there_are_more",
        (
            Edit(
                "db/feed.py",
                "if taken and len(taken) + len(served) > limit:",
                "if taken and len(taken) + len(served) >= limit:",
            ),
        ),
    ),
    Mutant(
        "the feed serving each event's item as it is now, not as it stood after the event",
        "tests/integration/db/test_feed.py::test_each_event_carries_its_item_as_it_stood_right_after_it",
        (
            Edit(
                "db/feed.py",
                "item=current if after is None else as_it_stood(current, after, lease_epoch=lease_epoch),",
                "item=current,",
            ),
        ),
    ),
    Mutant(
        "events written without the item as it stood (item_after)",
        "tests/system/test_deliverer.py::test_a_delivery_retried_after_the_item_moved_on_says_what_happened_then",
        (Edit(ROWS, "        item_after(changed.c),\n", '        literal_column("NULL"),\n'),),
    ),
    Mutant(
        # Each waiter back on its own clock: a read of its own every poll interval (O(N) queries).
        "feed long-polls each reading every interval instead of waiting for the watcher",
        "tests/integration/api/test_feed_watch.py::test_waiting_long_polls_cost_one_query_per_interval_not_one_each",
        (
            Edit(
                "api/feed_watch.py",
                "{woken, gone}, timeout=max(0, up_to_s),",
                "{gone}, timeout=min(max(0, up_to_s), self._interval_s),",
            ),
            Edit(
                "api/feed_watch.py",
                "            return waiter.woken.is_set()\n",
                "            return not gone.done()\n",
            ),
            Edit("api/routes/feed.py", "            if not waits:\n", "            if True:\n"),
        ),
    ),
    Mutant(
        "the feed watcher looking on with no one waiting",
        "tests/integration/api/test_feed_watch.py::"
        "test_a_waiter_whose_client_leaves_is_dropped_and_the_watcher_stops_with_no_one_waiting",
        (Edit("api/feed_watch.py", "        while self.waiters:\n", "        while True:\n"),),
    ),
    Mutant(
        "archive verify not hashing the items file",
        "tests/system/test_archive.py::test_verify_hashes_the_items_file_too",
        (
            Edit(
                "db/archive.py",
                "            if file_sha256(each) != sha:",
                "            if each == path and file_sha256(each) != sha:",
            ),
        ),
    ),
    Mutant(
        "archive verify not checking that each file continues the one before",
        "tests/system/test_archive.py::test_verify_checks_that_each_archive_continues_the_one_before",
        (
            Edit(
                "db/archive.py",
                "if (result.first_seq, result.first_prev) != (expected, previous):",
                "if result.first_seq != expected:",
            ),
        ),
    ),
)

# Sign-in with the identity provider and the desk's sessions (issue 38): each against a real
# provider (oidc-provider under Node), as tests/system/api/test_oidc.py runs.
OIDC_TESTS = "tests/system/api/test_oidc.py"
MUTANTS += (
    Mutant(
        "the callback takes any sealed sign-in cookie, not the one its state names",
        f"{OIDC_TESTS}::test_a_state_works_only_in_the_browser_that_started_it",
        (
            Edit(
                "api/oidc_login.py",
                "    return login if secrets.compare_digest(login.state.encode(), state.encode()) else None",
                "    return login",
            ),
        ),
    ),
    Mutant(
        "an answer without iss accepted though the provider promises RFC 9207",
        f"{OIDC_TESTS}::test_an_answer_without_iss_is_refused_when_the_provider_promises_it",
        (
            Edit(
                "api/routes/oidc.py",
                "(iss is not None or metadata.iss_parameter_supported)",
                "(iss is not None)",
            ),
        ),
    ),
    Mutant(
        "a desk session's expires_at not checked on lookup",
        "tests/integration/api/test_session.py::test_a_session_past_its_expiry_is_refused_though_its_token_lives",
        (Edit("db/sessions.py", "        desk_session.c.expires_at > func.now(),\n", ""),),
    ),
    Mutant(
        "an OIDC session's expires_at not checked on lookup",
        f"{OIDC_TESTS}::test_an_oidc_session_past_its_expiry_is_refused",
        (
            Edit(
                "db/oidc.py",
                'oidc_session.c.id_hash == bindparam("id_hash"), oidc_session.c.expires_at > func.now()',
                'oidc_session.c.id_hash == bindparam("id_hash")',
            ),
        ),
    ),
    Mutant(
        "an ID token accepted as an API bearer",
        f"{OIDC_TESTS}::test_an_id_token_is_never_an_api_bearer",
        (Edit("api/oidc.py", "            self._access_token_only(verified.header, claims)\n", ""),),
    ),
    Mutant(
        "the username claim folded before it is checked",
        f"{OIDC_TESTS}::test_an_api_username_is_checked_as_sent_before_it_is_folded",
        (
            Edit(
                "api/oidc_claims.py",
                "        return check_subject(value)\n",
                "        return check_subject(value.lower())\n",
            ),
        ),
    ),
    Mutant(
        "a name not kept by the provider account that first used it",
        f"{OIDC_TESTS}::test_a_name_stays_with_the_provider_account_that_first_signed_in_with_it",
        (
            Edit(
                "db/oidc.py",
                "    return (owner.issuer, owner.provider_subject) == (issuer, provider_subject)",
                "    return True",
            ),
        ),
    ),
)

# Issue 42: the provider's opaque access tokens, by introspection, against the real provider.
INTROSPECTION_TESTS = "tests/system/api/test_oidc_introspection.py"
MUTANTS += (
    Mutant(
        "an introspected token's audience not checked",
        f"{INTROSPECTION_TESTS}::test_a_401_for_a_provider_token_names_what_the_service_expected",
        (
            Edit(
                "api/introspection.py",
                "        if self.settings.oidc_api_audience not in audiences:\n",
                "        if False:\n",
            ),
        ),
    ),
    Mutant(
        "an introspection's answer cached past the token's exp",
        f"{INTROSPECTION_TESTS}::test_an_expired_opaque_token_is_refused_from_its_exp_not_the_cache_life",
        (Edit("api/introspection.py", "            life = min(life, exp - now)\n", "            pass\n"),),
    ),
    Mutant(
        "introspection's answers not cached",
        f"{INTROSPECTION_TESTS}::test_an_opaque_token_of_the_provider_is_accepted_with_its_role",
        (Edit("api/introspection.py", "            self.cache[key] = answer\n", "            pass\n"),),
    ),
)

# Issue 38: the webhook survivors of the fourth round's mutation audit.
MUTANTS += (
    Mutant(
        "the SSRF guard allowing shared address space (100.64.0.0/10)",
        "tests/unit/test_addresses.py::test_every_special_purpose_range_is_refused",
        (
            Edit(
                "cli/addresses.py",
                '    ("100.64.0.0/10", "shared address space',
                '    ("100.64.0.0/32", "shared',
            ),
        ),
    ),
    Mutant(
        "the SSRF guard checking only the first resolved address",
        "tests/unit/test_addresses.py::test_every_resolved_address_is_checked_not_only_the_first",
        (Edit("cli/outbound.py", "    for address in resolved:\n", "    for address in resolved[:1]:\n"),),
    ),
    Mutant(
        "the webhook body signed as \\u-escaped bytes but sent as UTF-8",
        "tests/system/test_deliverer.py::test_a_body_that_is_not_ascii_is_signed_as_it_is_sent",
        (
            Edit(
                "cli/outbound.py",
                "content=body, headers",
                'content=body.decode("unicode_escape").encode(), headers',
            ),
        ),
    ),
    Mutant(
        "the webhook backoff 2**n instead of 2**(n-1)",
        "tests/unit/test_delivery_rules.py::test_the_nth_retry_waits_base_times_two_to_the_n_minus_one_with_jitter_and_a_ceiling",
        (Edit("cli/deliverer.py", "2 ** min(failures - 1, 40)", "2 ** min(failures, 40)"),),
    ),
    Mutant(
        "quick webhook retries for a receiver that is down",
        "tests/unit/test_delivery_rules.py::test_while_the_receiver_is_up_the_first_five_retries_come_within_a_second",
        (
            Edit(
                "cli/deliverer.py",
                "if receiver_up and failures <= QUICK_RETRIES:",
                "if failures <= QUICK_RETRIES:",
            ),
        ),
    ),
    Mutant(
        "the webhook give-up counted in hours x 60",
        "tests/unit/test_delivery_rules.py::test_retrying_gives_up_after_72_hours_with_some_30_to_40_attempts",
        (Edit("api/settings.py", "self.webhook_give_up_h * 3600", "self.webhook_give_up_h * 60"),),
    ),
    Mutant(
        "a webhook PUT without secret replacing the stored one",
        "tests/integration/api/test_webhooks.py::test_a_put_without_secret_keeps_the_stored_one_and_one_with_a_secret_replaces_it",
        (Edit("api/routes/webhooks.py", "replace_secret=body.secret is not None,", "replace_secret=True,"),),
    ),
    Mutant(
        "webhook secrets decrypted with the first key only",
        "tests/unit/test_delivery_rules.py::test_a_secret_encrypted_under_the_old_key_is_read_under_the_rotated_list",
        (
            Edit(
                "api/webhook_secret.py",
                "    return _fernet(key_list).decrypt(token).decode()",
                '    return Fernet(key_list.split(",")[0].strip()).decrypt(token).decode()',
            ),
        ),
    ),
    Mutant(
        "a webhook delivery not resetting the retry state",
        "tests/system/test_deliverer.py::test_a_success_after_a_failure_starts_the_retry_state_over",
        (
            Edit(
                "db/webhooks.py",
                "attempts = coalesce(held.attempts, 0),",
                "attempts = greatest(s.attempts, coalesce(held.attempts, 0)),",
            ),
        ),
    ),
    Mutant(
        "a new webhook subscription starting at the newest committed event (no snapshot rule)",
        "tests/integration/api/test_webhooks.py::test_a_new_subscription_gets_what_an_older_transaction_commits_after_it",
        (
            Edit(
                "db/webhooks.py",
                "        WHERE xid < pg_snapshot_xmin(pg_current_snapshot())\n    ), head_id",
                "    ), head_id",
            ),
        ),
    ),
)

# Issue 41: the service following a failover. Multi-host URLs (db/urls.py), a read-only server as
# 503 DATABASE_UNAVAILABLE, and the keepalive options that bound a silent server reaching libpq.
URLS = "db/urls.py"
URL_TESTS = "tests/unit/test_db_urls.py"
MUTANTS += (
    Mutant(
        "a multi-host URL rendered with its first host only",
        f"{URL_TESTS}::test_every_spelling_reaches_both_consumers_with_every_server",
        (
            Edit(
                URLS,
                'query.append(("host", ",".join(target.hosts)))',
                'query.append(("host", target.hosts[0]))',
            ),
        ),
    ),
    Mutant(
        # The bug issue 41 found: libpq kept only the last of SQLAlchemy's ?host=h1:p1&host=h2:p2.
        "?host=h1:p1&host=h2:p2 read as its last host",
        f"{URL_TESTS}::test_every_spelling_reaches_both_consumers_with_every_server",
        (
            Edit(
                URLS,
                "    if len(query_hosts) > 1:  # SQLAlchemy's form",
                "    query_hosts = query_hosts[-1:]\n    if len(query_hosts) > 1:  # SQLAlchemy's form",
            ),
        ),
    ),
    Mutant(
        "the ports of h1:p1,h2:p2 dropped",
        f"{URL_TESTS}::test_hosts_and_ports_as_libpq_reads_them",
        (Edit(URLS, "            ports.append(port)\n", "            ports.append(None)\n"),),
    ),
    Mutant(
        "a URL with more ports than hosts accepted",
        f"{URL_TESTS}::test_a_url_naming_no_one_list_of_servers_is_refused_with_a_sentence",
        (Edit(URLS, "    if len(ports) > 1 and len(ports) != len(hosts):", "    if False:"),),
    ),
    Mutant(
        "a read-only server's refusal not classified as unavailable (a 500)",
        "tests/unit/api/test_database_errors.py::test_a_read_only_server_is_a_503_database_unavailable_never_a_500",
        (Edit("db/errors.py", "    if isinstance(driver, pg.ReadOnlySqlTransaction):\n", "    if False:\n"),),
    ),
    Mutant(
        "/readyz ready on a read-only server",
        "tests/system/test_multi_host.py::test_a_server_turned_read_only_answers_503_then_the_pool_lets_go_of_it",
        (
            Edit(
                "api/routes/health.py",
                "    if not primary:\n        return unavailable(",
                "    if False:\n        return unavailable(",
            ),
        ),
    ),
    Mutant(
        "the pool kept after a read-only refusal of the lease and completion routes",
        "tests/system/test_multi_host.py::test_a_completion_refused_read_only_lets_go_of_the_pool_by_itself",
        (
            Edit(
                "db/engine.py",
                "                stale = True\n                if attempt:",
                "                if attempt:",
            ),
        ),
    ),
    Mutant(
        "the keepalive options not added to the URL",
        f"{URL_TESTS}::test_the_liveness_options_are_added_unless_the_url_sets_them",
        (Edit("db/engine.py", "    if liveness:\n", "    if False:\n"),),
    ),
    Mutant(
        "the API's engine without the keepalive options",
        "tests/integration/test_db_liveness.py::test_the_apps_connections_carry_the_keepalive_settings_to_libpq",
        (
            Edit(
                "api/app.py",
                "settings.database_url, settings.data_dir, settings.db_liveness)\n        engine",
                "settings.database_url, settings.data_dir)\n        engine",
            ),
        ),
    ),
)

MUTANTS += (
    Mutant(
        "a transaction on a frozen server without its per-statement watchdog",
        "tests/system/test_frozen_server.py::test_a_transaction_on_a_frozen_server_gives_up_within_its_deadline",
        (Edit("db/engine.py", "        info[_DEADLINE] = deadline_s\n", ""),),
    ),
    # Issue 40: the backlog's split, the SLA tiers and the amount bounds in their currencies.
    Mutant(
        "the backlog's split by currency ignores revisions that changed an item's currency",
        "tests/integration/db/test_reports.py::test_the_kept_days_carry_their_split_by_currency_as_it_stood_then",
        (Edit("db/reports/aging.py", '"currency_spans": _CURRENCY_SPANS,', '"currency_spans": "",'),),
    ),
    Mutant(
        "the SLA tier compares the bare amount, not its base-currency equivalent",
        "tests/integration/api/test_deadlines.py::test_the_tiers_compare_the_amount_converted_at_the_latest_rate",
        (
            Edit(
                "db/queue/enqueue.py",
                ".where(func.abs(_batch.c.a) * _rate >= _tiers.c.floor)",
                ".where(func.abs(_batch.c.a) >= _tiers.c.floor)",
            ),
        ),
    ),
    Mutant(
        "an item in a currency without a rate gets the loosest SLA tier",
        "tests/integration/api/test_deadlines.py::test_an_item_in_a_currency_without_a_rate_gets_the_strictest_tier",
        (
            Edit(
                "db/queue/enqueue.py", "select(func.min(_tiers.c.hours))", "select(func.max(_tiers.c.hours))"
            ),
        ),
    ),
    Mutant(
        "GET /items' amount bounds take two decimals, not the column's three",
        "tests/integration/api/test_work_list.py::test_amount_bounds_take_three_decimals_and_the_columns_whole_range",
        (
            Edit(
                "api/schemas/money.py",
                'AMOUNT_BOUND_PATTERN = r"^[0-9]{1,16}(\\.[0-9]{1,3})?$"',
                'AMOUNT_BOUND_PATTERN = r"^[0-9]{1,16}(\\.[0-9]{1,2})?$"',
            ),
        ),
    ),
)

# The reports (issue 42): a release is not a decision.
MUTANTS += (
    Mutant(
        "the throughput counts a holder's release as a decision again",
        "tests/integration/db/test_reports.py::test_lease_to_decision_is_from_the_lease_that_ended_and_percentiles_are_nearest_rank",
        (
            Edit(
                "db/reports/workload.py",
                "count(*) FILTER (WHERE d.outcome <> 5) AS decisions",
                "count(*) AS decisions",
            ),
            Edit(
                "db/reports/workload.py",
                "array_agg(greatest(d.took, interval '0')) FILTER (WHERE d.outcome <> 5) AS took",
                "array_agg(greatest(d.took, interval '0')) AS took",
            ),
        ),
    ),
)

# What a copy needs to run the suite; caches, the virtualenv and local data stay behind. The copies
# are made from one compiled base copy (Runs.base): its bytecode comes along, and copy2 keeps the
# sources' mtimes, so a copy compiles only the files its mutant edited.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", ".data", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "*.pyc"
)
# The plugins a nested session can leave out: pytest imports and assertion-rewrites a plugin's whole
# package at start-up, most of a named test's own cost; schemathesis' is needed only where it is used.
UNUSED_PLUGINS = ("schemathesis",)
PARALLEL = 3  # pytest processes at once: most of a run is start-up and waiting on PostgreSQL
RUN_TIMEOUT_S = 600
# A test waits for its copy's run, queued behind others (PARALLEL at once): the suite's 300 s per
# test is too short for that on a loaded machine, where the control's run alone took over 300 s.
WAIT_TIMEOUT_S = 2 * RUN_TIMEOUT_S


# The control run's tests: the first named test of each file.
CONTROL = tuple({m.test.split("::")[0]: m.test for m in reversed(MUTANTS)}.values())


def copy_tree(destination: Path, source: Path = REPO_ROOT) -> Path:
    shutil.copytree(source, destination, ignore=IGNORED if source == REPO_ROOT else None)
    return destination


def compiled_base(destination: Path) -> Path:
    """The tree copied once and compiled, for the copies to be made from."""
    copy_tree(destination)
    for folder in ("api", "db", "cli", "client", "alembic", "tests"):
        compileall.compile_dir(destination / folder, quiet=1, workers=1)
    return destination


def plugin_options(node_ids: tuple[str, ...], root: Path) -> list[str]:
    """`-p no:<plugin>` for each plugin that none of the named tests' files uses."""
    sources = [(root / path).read_text() for path in {node.split("::", 1)[0] for node in node_ids}]
    unused = [name for name in UNUSED_PLUGINS if not any(name in text for text in sources)]
    return [part for name in unused for part in ("-p", f"no:{name}")]


def apply(root: Path, mutant: Mutant) -> None:
    for edit in mutant.edits:
        path = root / edit.path
        text = path.read_text() if path.exists() else ""
        found = text.count(edit.old)
        if found != 1:
            pytest.fail(
                f"mutation no longer applies: {mutant.name!r} expects this text exactly once in "
                f"{edit.path}, found {found} times; rewrite the mutant for the current code:\n{edit.old}"
            )
        path.write_text(text.replace(edit.old, edit.new))
        # The base copy's bytecode of this file is stale now; gone, whatever the clock says.
        for stale in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
            stale.unlink()


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str

    def summary(self) -> str:
        """pytest's closing line ("1 failed in 4.2s"), even when a fixture's teardown wrote after it."""
        lines = [
            line for line in self.output.strip().splitlines() if re.search(r"\d+ (passed|failed|error)", line)
        ]
        return lines[-1] if lines else "(no summary line)"


def run_pytest(root: Path, server_url: str, template_db: str | None, *node_ids: str) -> Run:
    # PYTHONPATH: a `review-queue` the copy's tests start must import the mutated copy, not the
    # tree the editable install (.pth) points at.
    # Bytecode is written (the outer environment may forbid it): the plugins' rewritten modules are
    # then compiled by the first session only, not by every one of them.
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "TEST_DATABASE_URL": server_url,
        "PYTHONPATH": str(root),
    }
    if template_db is not None:
        # The outer run's migrated template: the copy's tests clone it instead of migrating.
        env["REVIEW_QUEUE_TEST_TEMPLATE_DB"] = template_db
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header"),
            # A temporary directory of its own: under the default (/tmp/pytest-of-USER/pytest-N)
            # each new session deletes all but the three newest, so a session started beside a
            # running one deleted its tmp_path under it (initdb failed in the control run).
            *("--basetemp", str(root.parent / f"{root.name}.tmp")),
            *plugin_options(node_ids, root),
            *node_ids,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return Run(result.returncode, result.stdout + result.stderr)


class Runs:
    """Starts the control run and every mutant's run at once (PARALLEL at a time), on first use."""

    def __init__(self, root: Path, server_url: str, template_db: str) -> None:
        self.root, self.server_url, self.template_db = root, server_url, template_db
        self.pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="mutant")
        self.lock = threading.Lock()
        self.futures: dict[str, Future[Run]] = {}
        self.base: Path | None = None

    def _copy(self, name: str) -> Path:
        assert self.base is not None
        return copy_tree(self.root / name, self.base)

    def _control(self) -> Run:
        return run_pytest(self._copy("control"), self.server_url, self.template_db, *CONTROL)

    def _mutant(self, mutant: Mutant, index: int) -> Run:
        copy = self._copy(f"mutant-{index}")
        apply(copy, mutant)
        # A mutant of a migration needs the schema it builds: that copy migrates its own.
        migrates = any(edit.path.startswith("alembic/") for edit in mutant.edits)
        return run_pytest(copy, self.server_url, None if migrates else self.template_db, mutant.test)

    def start(self) -> None:
        with self.lock:
            if self.futures:
                return
            self.base = compiled_base(self.root / "base")
            self.futures["control"] = self.pool.submit(self._control)
            for index, mutant in enumerate(MUTANTS):
                self.futures[mutant.name] = self.pool.submit(self._mutant, mutant, index)

    def result(self, name: str) -> Run:
        self.start()
        return self.futures[name].result()


@pytest.fixture(scope="module")
def runs(server_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    runs = Runs(tmp_path_factory.mktemp("mutants"), server_url, template_db)
    yield runs
    runs.pool.shutdown(cancel_futures=True)


def test_every_mutation_still_applies(tmp_path: Path) -> None:
    """Cheap and first: the bugs still apply to today's code (each edit's text found exactly once)."""
    for index, mutant in enumerate(MUTANTS):
        copy = tmp_path / str(index)
        for edit in mutant.edits:
            (copy / edit.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / edit.path, copy / edit.path)
        apply(copy, mutant)


def test_the_check_runs_on_one_worker(request: pytest.FixtureRequest) -> None:
    """Every test of this module is in one xdist group, so one worker's `runs` starts the copies
    and no other worker starts them again."""
    here = [item for item in request.session.items if item.path == request.path]
    groups = {item.nodeid: [m.args for m in item.iter_markers("xdist_group")] for item in here}
    assert all(args == [("mutations",)] for args in groups.values()), groups


def test_a_copy_compiles_only_the_files_its_mutant_edited(tmp_path: Path) -> None:
    """Copies come from one compiled base: an edited file's bytecode is gone, the others' is there."""
    base = compiled_base(tmp_path / "base")
    mutant = next(m for m in MUTANTS if m.edits[0].path == COMPLETION)
    copy = copy_tree(tmp_path / "copy", base)
    apply(copy, mutant)
    cache = copy / "db/queue/__pycache__"
    compiled = {path.name.split(".")[0] for path in cache.glob("*.pyc")}
    assert "completion" not in compiled and {"lease", "rows", "approval"} <= compiled, compiled


@pytest.mark.timeout(WAIT_TIMEOUT_S)
def test_the_named_tests_pass_on_an_unmutated_copy(runs: Runs) -> None:
    run = runs.result("control")
    assert run.returncode == 0, f"the unmutated copy fails; no mutant result means anything:\n{run.output}"
    assert "passed" in run.summary() and "skipped" not in run.summary(), run.output


@pytest.mark.timeout(WAIT_TIMEOUT_S)
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_named_test_kills_the_mutant(runs: Runs, mutant: Mutant) -> None:
    run = runs.result(mutant.name)
    print(f"{mutant.name}: {mutant.test}: {run.summary()}")
    # Exit code 1 with failures: the test ran and failed. 2-5 (interrupted, usage, nothing collected)
    # or errors would be the copy breaking, not the test catching the bug.
    assert run.returncode == 1 and "failed" in run.summary() and "error" not in run.summary(), (
        f"mutant {mutant.name!r} survived {mutant.test} (exit {run.returncode}):\n{run.output[-4000:]}"
    )


def test_the_reliability_page_names_only_tests_that_exist() -> None:
    """Every test docs/reliability.md names exists, and every mutant's test is named
    there: the table cannot drift from the suite."""
    section = (REPO_ROOT / "docs/reliability.md").read_text()
    named: list[str] = []
    current = ""
    for path, test in re.findall(r"`(tests/[\w/]+\.py)?((?:::\w+)+)?`", section):
        current = path or current
        if test:
            named.append(f"{current}{test}")
        elif path:
            assert (REPO_ROOT / path).exists(), f"docs/reliability.md names a missing file: {path}"
    assert named, "no test named in the Reliability section"
    missing = []
    for node in named:
        path, *parts = node.split("::")
        source = (REPO_ROOT / path).read_text()
        if not all(re.search(rf"^\s*(async def|def|class) {p}\b", source, re.M) for p in parts):
            missing.append(node)
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"
    unnamed = [m.test for m in MUTANTS if m.test not in named]
    assert not unnamed, f"mutation-checked tests missing from docs/reliability.md: {unnamed}"
