# One-command set-up and runs. `make train` and `make test` create the virtual environment on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; pyproject.toml itself states a range, so GPU users keep their CUDA build.
TORCH ?= torch==2.13.0

.PHONY: setup train test prometheus clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# The monitoring tests start a real Prometheus server (Debian's package).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)

train: setup
	$(VENV)/bin/rapid train --config configs/default.toml

test: setup prometheus
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs
