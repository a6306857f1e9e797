# `make test` and `make demo` each do all their own set-up on a fresh Debian/Ubuntu machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SYSTEM_PACKAGES := openssh-server openssh-client rsync mariadb-server mariadb-client mariadb-backup haproxy

.PHONY: test demo venv system-packages lint clean

$(BIN)/migrate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/migrate

system-packages:
	@./scripts/system-packages.sh $(SYSTEM_PACKAGES)

lint: venv
	$(BIN)/ruff check orchestrator tests bench
	$(BIN)/ruff format --check orchestrator tests bench

test: venv system-packages lint
	$(BIN)/pytest -q

demo: venv system-packages
	$(BIN)/python -m orchestrator.lab.demo

clean:
	-$(BIN)/migrate lab down
	rm -rf $(VENV) .lab
