"""`review-queue serve` refuses to start with a broken OIDC configuration."""

import os
import subprocess
import sys
from pathlib import Path

from tests.support import OIDC_ENV


def test_serve_refuses_to_start_with_a_broken_oidc_configuration(db_url: str) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "review-queue"), "serve", "--no-reclaimer"],
        env={**os.environ, **OIDC_ENV, "DATABASE_URL": db_url, "REVIEW_QUEUE_PUBLIC_URL": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout
    assert "REVIEW_QUEUE_PUBLIC_URL" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
