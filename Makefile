# Build infrastructure for memlib and its Jupyter Book report.
# Needs only python3 (and make). `make pdf` also needs texlive: see `make pdf-deps`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.stamp
JB_FLAGS ?= -W -n --keep-going

.PHONY: venv book test pdf pdf-deps bench readme-figure clean

venv: $(STAMP)

# Reinstalls only when the pins or the package metadata change. pip itself is not upgraded
# (nothing unpinned enters the venv). The measure extra brings torch, pinned by constraints.txt to
# the CPU build (2.13.0+cpu, a local wheel on these machines): never a CUDA download.
# megatron-core (the megatron profile's ground truth, memlib.measure_megatron) is a second call:
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
	$(BIN)/jupyter-book build . --all $(JB_FLAGS)
	@echo "HTML: _build/html/index.html"

test: $(STAMP)
	$(BIN)/python -m pytest -q

# PDF via xelatex (see _config.yml `latex:`); run `make pdf-deps` once per machine first.
pdf: $(STAMP)
	$(BIN)/jupyter-book build . --all --builder pdflatex
	@echo "PDF: _build/latex/report.pdf"

pdf-deps:
	apt-get update
	apt-get install -y --no-install-recommends latexmk texlive-latex-recommended \
		texlive-latex-extra texlive-fonts-recommended texlive-xetex fonts-freefont-otf tex-gyre

bench: $(STAMP)
	$(BIN)/python benchmarks/cli_cold_start.py
	$(BIN)/python benchmarks/sweep.py
	$(BIN)/python benchmarks/book_build.py

# the README's figure (tests/test_readme.py checks that the committed one is current)
readme-figure: $(STAMP)
	MPLBACKEND=Agg $(BIN)/python -m memlib.report.readme

clean:
	rm -rf _build .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +
