# Two commands on a fresh machine: `make run` and `make test`. Both install what they need.
# uv from PATH, else the one pip installs (run as a module, so PATH does not matter).
UV ?= $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
RUN := $(UV) run --frozen

.PHONY: run test test-quick test-unit test-long lint fmt bench bench-instructions migrate revision install

# --compile-bytecode: the virtualenv ships its bytecode. Where PYTHONDONTWRITEBYTECODE is set (CI),
# every Python process would otherwise compile FastAPI, SQLAlchemy and pydantic again at start-up,
# and the suite starts a few hundred of them (servers, commands, the mutation check's sessions).
install:
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install --quiet --user uv \
		|| python3 -m pip install --quiet --user --break-system-packages uv
	@$(UV) sync --frozen --quiet --compile-bytecode

# A local webhook receiver (http://127.0.0.1:...) is allowed on a development machine only.
run: install
	REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP=$${REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP:-1} \
	REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS=$${REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS:-127.0.0.1,localhost} \
	$(RUN) review-queue serve

# Two workers (pytest-xdist), each with its own embedded PostgreSQL: the suite is mostly waiting on
# the database and on the processes it starts, so two workers halve it even on two cores. loadgroup:
# the tests of one xdist_group (the failover tests' one Patroni cluster) run on one worker.
TEST_WORKERS ?= 2

# --durations: every run (CI's too) names its slowest tests, where the suite's time goes (issue 39).
test: install
	$(RUN) pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

# The edit-test loop: the unit and integration tiers (tests/unit, tests/integration), everything
# but the processes, clusters and browsers of tests/system. `make test` stays the whole suite.
test-quick: install
	$(RUN) pytest -n $(TEST_WORKERS) --dist loadgroup tests/unit tests/integration

# No database, no process: seconds.
test-unit: install
	$(RUN) pytest -n 0 tests/unit

test-long: install
	REVIEW_QUEUE_TEST_LONG=1 $(RUN) pytest -n $(TEST_WORKERS) --dist loadgroup

lint: install
	$(RUN) ruff check api db cli bench client tests alembic
	$(RUN) ruff format --check api db cli bench client tests alembic
	$(RUN) mypy api db cli bench client
	$(RUN) python -m client.generate_sync --check

fmt: install
	$(RUN) python -m client.generate_sync
	$(RUN) ruff format api db cli bench tests alembic
	$(RUN) ruff check --fix api db cli bench tests alembic

bench: install
	$(RUN) python -m bench $(ARGS)

# One completion's cost in CPU instructions (--valgrind), immune to a shared machine's noise.
bench-instructions: install
	$(RUN) python -m bench.instructions $(ARGS)

migrate: install
	$(RUN) review-queue migrate

revision: install
	$(RUN) alembic revision --autogenerate -m "$(m)"
