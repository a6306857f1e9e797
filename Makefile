# `make test` and `make demo` each do all their own set-up on a fresh Debian/Ubuntu machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SYSTEM_PACKAGES := openssh-server openssh-client rsync mariadb-server mariadb-client mariadb-backup inotify-tools haproxy chromium nocache nginx php8.2-fpm php8.2-mysql wordpress sudo postgresql postgresql-client socat

.PHONY: test test-fast demo venv system-packages lint docs clean

$(BIN)/migrate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/migrate

system-packages:
	@./scripts/system-packages.sh $(SYSTEM_PACKAGES)

lint: venv
	$(BIN)/ruff check orchestrator tests bench scripts
	$(BIN)/ruff format --check orchestrator tests bench scripts
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

demo: venv system-packages
	$(BIN)/python -m orchestrator.lab.demo $(if $(APP),--app $(APP)) $(if $(ENGINE),--engine $(ENGINE))

clean:
	-$(BIN)/migrate lab down
	rm -rf $(VENV) .lab site
