# One-command set-up and runs. `make train` and `make test` create the virtual environment on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch from the index pip is configured with (pyproject.toml itself states a range, so GPU users keep their
# CUDA build). From the public index (PyPI) Linux x86_64 gets the CUDA build (several GB); choose a build by its
# PyTorch index on a fresh .venv (`rm -rf .venv` first):
#   make train TORCH_INDEX=https://download.pytorch.org/whl/cpu       # the CPU build
#   make train TORCH_INDEX=https://download.pytorch.org/whl/cuXYZ     # a CUDA build (pytorch.org lists XYZ)
TORCH ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: setup train test prometheus slurm chromium clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(PY) -m pip install -q -e ".[test]"
	touch $@

# The monitoring tests start a real Prometheus server (Debian's package).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)

# The Slurm test submits infra/deploy/slurm/rapid.sbatch to a cluster it starts on this machine (Debian's package).
slurm:
	@test -x /usr/sbin/slurmctld && test -x /usr/sbin/slurmd && test -x /usr/sbin/munged || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm)

# The `rapid watch` test loads its page in a real headless browser (Debian's package).
chromium:
	@command -v chromium >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium)

train: setup
	$(VENV)/bin/rapid train --config configs/default.toml

# Style (ruff), then types (mypy over the installed package and benchmarks/, [tool.mypy] in pyproject.toml), then
# the suite.
test: setup prometheus slurm chromium
	$(VENV)/bin/ruff check .
	$(PY) tests/typecheck.py
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs
