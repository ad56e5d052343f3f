# Build infrastructure for memlib and its Jupyter Book report.
# Needs python3 (and make) and Graphviz's dot, which draws the book's diagrams. `make pdf` also needs texlive:
# `make pdf-deps` installs both.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stamp
JB_FLAGS ?= -W -n --keep-going

# `make book MODEL=deepseek-v2` (a preset name or a config.json path) builds the whole book for that
# model into _build/models/<name>/_build/html; without MODEL, DeepSeek-V3 into _build/html.
MODEL ?=
MODEL_SLUG := $(subst /,_,$(subst .json,,$(MODEL)))
BOOK_OUT := $(if $(MODEL),--path-output _build/models/$(MODEL_SLUG),)
CHAPTER ?= 03_parameters

.PHONY: venv book test test-fast lint pdf pdf-deps bench readme-figure clean lab rerun

venv: $(STAMP)

# Reinstalls only when the pins or the package metadata change. pip itself is not upgraded
# (nothing unpinned enters the venv). The measure extra brings torch, pinned by constraints.txt to
# the CPU build (2.13.0+cpu, a local wheel on these machines): never a CUDA download.
# megatron-core (the megatron profile's ground truth, memlib.measure.megatron) is a second call:
# its 0.19.2 wheel for CPython 3.11 declares Python >= 3.12, and resolving its dependencies would
# pick a numpy that builds from source; it needs only torch, numpy and packaging, pinned above.
MCORE := megatron-core==0.19.2
$(STAMP): requirements.txt constraints.txt pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q \
		-r requirements.txt -c constraints.txt -e '.[measure]'
	$(BIN)/python -m pip install --disable-pip-version-check -q \
		--no-deps --ignore-requires-python -c constraints.txt $(MCORE)
	touch $@

book: $(STAMP)
	MEMLIB_BOOK_MODEL=$(MODEL) $(BIN)/jupyter-book build . --all $(JB_FLAGS) $(BOOK_OUT)
	@echo "HTML: $(if $(MODEL),_build/models/$(MODEL_SLUG)/,)_build/html/index.html"

# JupyterLab on the chapters (jupytext opens the MyST .md notebooks as notebooks): change a chapter's
# configuration cell and run it; every glued number, table and figure is displayed as it is computed
# Jupyter refuses to start as root (a container's usual user) without --allow-root: given to root only.
LAB_UID ?= $(shell id -u)
LAB_FLAGS := --notebook-dir=notebooks$(if $(filter 0,$(LAB_UID)), --allow-root,)
lab: $(STAMP)
	MEMLIB_BOOK_MODEL=$(MODEL) $(BIN)/jupyter-lab $(LAB_FLAGS)

# one chapter executed without a browser: _build/rerun/$(CHAPTER).ipynb, with every output
rerun: $(STAMP)
	@test -n "$(CHAPTER)" -a -f "notebooks/$(CHAPTER).md" || { echo "make rerun CHAPTER=NAME: NAME is one of: $$(cd notebooks && ls *.md | sed 's/\.md$$//' | tr '\n' ' ')" >&2; exit 2; }
	mkdir -p _build/rerun
	cd notebooks && MEMLIB_BOOK_MODEL=$(MODEL) ../$(BIN)/jupytext --to ipynb --execute $(CHAPTER).md \
		-o ../_build/rerun/$(CHAPTER).ipynb
	@echo "executed: _build/rerun/$(CHAPTER).ipynb"

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# the inner loop: every test but those marked slow (measurements with torch and megatron-core, book builds)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile -m "not slow"

# ruff's rule set (pyproject.toml [tool.ruff]); CI runs it
lint: $(STAMP)
	$(BIN)/ruff check .

# PDF via xelatex (see _config.yml `latex:`); run `make pdf-deps` once per machine first.
pdf: $(STAMP)
	MEMLIB_BOOK_MODEL=$(MODEL) $(BIN)/jupyter-book build . --all --builder pdflatex $(BOOK_OUT)
	@echo "PDF: $(if $(MODEL),_build/models/$(MODEL_SLUG)/,)_build/latex/report.pdf"

pdf-deps:
	apt-get update
	apt-get install -y --no-install-recommends graphviz latexmk texlive-latex-recommended \
		texlive-latex-extra texlive-fonts-recommended texlive-xetex fonts-freefont-otf tex-gyre \
		poppler-utils

bench: $(STAMP)
	$(BIN)/python benchmarks/cli_cold_start.py
	$(BIN)/python benchmarks/sweep.py
	$(BIN)/python benchmarks/book_build.py

# the README's figure (tests/report/test_readme.py checks that the committed one is current)
readme-figure: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m memlib.report.readme

clean:
	rm -rf _build .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +
