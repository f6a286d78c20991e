# Two entry points for a fresh machine (see README):
#   make repro   set up the cached venv, then run the whole DVC pipeline on the demo corpus
#                (scripts/repro.py: `dvc repro` with independent stages side by side)
#   make test    set up the cached venv, then run the test suite, one worker per core (pytest-xdist;
#                --dist loadfile keeps each file's tests, which share a tiny repository, on one worker)
SHELL := /bin/bash
VENV_BIN := $(CURDIR)/.venv/bin
export PATH := $(VENV_BIN):$(PATH)

.PHONY: setup repro test bench
setup:
	@bash scripts/setup.sh

repro: setup
	python scripts/repro.py

test: setup
	python -m pytest -n auto --dist loadfile

bench: setup
	python benchmarks/prepare_throughput.py
