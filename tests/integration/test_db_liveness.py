"""The options that bound how long a silent database server can hold a caller reach libpq."""

from fastapi.testclient import TestClient

from api.settings import Settings


def test_the_apps_connections_carry_the_keepalive_settings_to_libpq(client: TestClient) -> None:
    """A silent server (no RST) is found dead within keepalives or tcp_user_timeout only if the
    options reach libpq: read back from a connection of the app's own pool."""
    engine = client.app.state.engine  # type: ignore[attr-defined]
    portal = client.portal
    assert portal is not None

    async def parameters() -> dict[str, str]:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            return dict(raw.driver_connection.info.get_parameters())

    given = portal.call(parameters)
    liveness = Settings().db_liveness
    assert {key: given.get(key) for key in liveness} == liveness
