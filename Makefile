# `make test` and `make demo` each do all their own set-up on a fresh Debian/Ubuntu machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SYSTEM_PACKAGES := openssh-server openssh-client rsync mariadb-server mariadb-client mariadb-backup inotify-tools haproxy chromium nocache nginx php8.2-fpm php8.2-mysql wordpress sudo postgresql postgresql-client socat

.PHONY: test test-fast test-latest lock demo venv system-packages lint docs clean

# The virtualenv holds exactly the versions of requirements.lock, every file checked against its hash: a new
# upstream release changes nothing here until `make lock` takes it in a reviewed commit. The two distributions of this
# repository (the orchestrator, and the lab beside it) are installed editable on top, without dependencies of their own.
$(BIN)/migrate: pyproject.toml lab/pyproject.toml requirements.lock
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes --no-deps -r requirements.lock
	$(BIN)/pip install -q --no-deps --no-build-isolation -e . -e ./lab
	$(BIN)/pip check
	touch $@

venv: $(BIN)/migrate

system-packages:
	@./scripts/system-packages.sh $(SYSTEM_PACKAGES)

lint: venv
	$(BIN)/ruff check orchestrator lab tests bench scripts
	$(BIN)/ruff format --check orchestrator lab tests bench scripts
	$(BIN)/mypy

# The documentation site (docs/ + the README as its home page + the plan reference generated from the JSON Schema),
# into site/; --strict makes a broken link or anchor an error.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The lab tests mostly wait on real servers, so several pytest-xdist workers (each with a lab of its own, whole
# test files per worker) share the 2 cores. Measured on a quiet machine with 1,552 tests: 4 workers 486 s (with
# 1,449 tests: 3 workers 650 s, 4 workers 600 s; 5 only made each lab test twice as slow). TEST_WORKERS=0 runs
# everything in one process.
TEST_WORKERS ?= 4

# Every `migrate`, lab app and load process the suite starts imports the package: with bytecode caching off (some
# images set PYTHONDONTWRITEBYTECODE) each one compiles ~100 modules again, about 0.3 s of CPU a process.
unexport PYTHONDONTWRITEBYTECODE

test: venv system-packages lint docs
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# The fast layer: everything but the tests that need the lab (no sshd, no mariadbd, no system packages).
test-fast: venv
	$(BIN)/pytest -q -m "not lab" -n 2

# Refreshes requirements.lock to the newest releases the ranges of pyproject.toml and lab/pyproject.toml allow (the
# resolver runs in a throwaway virtualenv). Commit the result on its own, after `make test` passed on it.
LOCK_TOOLS := $(shell mktemp -d -u /tmp/migrate-lock-tools.XXXXXXXX)
lock:
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install -q 'uv>=0.13,<1'
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml lab/pyproject.toml requirements-build.in --extra test \
		--generate-hashes --python-version 3.11 --no-emit-package migrate --no-emit-package migrate-lab \
		--no-header --custom-compile-command "make lock" --upgrade -o requirements.lock
	rm -rf $(LOCK_TOOLS)

# The newest releases, on purpose: a throwaway virtualenv from the ranges alone (no lock), then the fast layer. Run
# it before `make lock` and once a week: a breaking upstream release shows here before a user meets it.
test-latest:
	@scripts/test-latest.sh $(PYTHON)

demo: venv system-packages
	$(BIN)/python -m migrate_lab.demo $(if $(APP),--app $(APP)) $(if $(ENGINE),--engine $(ENGINE))

clean:
	-$(BIN)/migrate lab down
	rm -rf $(VENV) .lab site
