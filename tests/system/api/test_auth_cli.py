"""A token revoked with `review-queue token revoke` is refused at once (the command runs; the rest
of the authentication tests, in-process, are tests/integration/api/test_auth.py)."""

import subprocess

from fastapi.testclient import TestClient

from tests.support.api import assert_problem


def test_revoked_token_is_401(client: TestClient, make_token, db_url: str) -> None:
    token = make_token("carol", "reviewer")
    headers = {"Authorization": f"Bearer {token}"}
    assert client.post("/leases", headers=headers).status_code == 200
    result = subprocess.run(
        ["review-queue", "token", "revoke", "--subject", "carol"],
        env={"DATABASE_URL": db_url, "PATH": __import__("os").environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "revoked 1" in result.stdout
    assert_problem(client.post("/leases", headers=headers), 401, "UNAUTHENTICATED")
