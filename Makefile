# Two commands on a fresh machine: `make book` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Installed only where no torch exists yet (a CUDA torch that is already there is kept).
TORCH_FALLBACK ?= torch==2.13.0

.PHONY: setup book test test-gpu clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_FALLBACK)"
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Executes every notebook (live on a GPU, replaying recorded results elsewhere), warnings are errors.
book: setup
	$(VENV)/bin/jupyter-book build --all --warningiserror .
	@echo "open _build/html/index.html"

# The CPU suite (what CI runs).
test: setup
	$(PY) -m pytest -q

# On a GPU machine: every phase on the shape suite, bad inputs, compute-sanitizer.
test-gpu: setup
	$(PY) -m pytest -q -m gpu

clean:
	rm -rf _build
