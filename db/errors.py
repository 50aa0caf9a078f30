"""What a database failure means for the caller: unavailable (retry later), retryable, or a bug."""

import psycopg
from psycopg import errors as pg
from sqlalchemy import exc as sa


class DatabaseUnavailable(Exception):
    """The database cannot serve this request now; the client should retry shortly."""


def _driver_error(error: BaseException) -> BaseException:
    if isinstance(error, DatabaseUnavailable) and error.__cause__ is not None:
        error = error.__cause__  # a db/ function that named the cause more precisely
    return error.orig if isinstance(error, sa.DBAPIError) and error.orig is not None else error


def is_lock_timeout(error: BaseException) -> bool:
    """lock_timeout fired: a table-level lock elsewhere (seed: LOCK_CONTENTION)."""
    return isinstance(_driver_error(error), pg.LockNotAvailable)


def is_retryable(error: BaseException) -> bool:
    """Deadlock or serialization failure: running the whole transaction again is safe."""
    return isinstance(_driver_error(error), (pg.DeadlockDetected, pg.SerializationFailure))


def classify(error: BaseException) -> str | None:
    """A short reason when `error` means the database is unavailable, else None."""
    if isinstance(error, DatabaseUnavailable):
        return str(error)
    if isinstance(error, sa.TimeoutError):
        return "connection pool exhausted"
    if isinstance(error, sa.DBAPIError) and error.connection_invalidated:
        return "database connection lost"
    driver = _driver_error(error)
    if isinstance(driver, pg.LockNotAvailable):
        return "lock timeout: the table is locked by another session"
    if isinstance(driver, pg.QueryCanceled):
        return "statement timeout"
    if isinstance(driver, (pg.DeadlockDetected, pg.SerializationFailure)):
        return "transaction conflict persisted after retries"
    if isinstance(driver, pg.ReadOnlySqlTransaction):
        # A standby, or the old primary being demoted: a failover is under way (docs/production.md).
        return "database is read-only (a failover in progress?)"
    if isinstance(driver, (pg.AdminShutdown, pg.CannotConnectNow, pg.CrashShutdown, pg.TooManyConnections)):
        return "database is restarting or out of connections"
    if isinstance(driver, psycopg.OperationalError):
        return "database connection failed"
    return None
