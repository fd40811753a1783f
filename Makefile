# chiray: set up a virtualenv and run the demo or the tests. Running a target twice is fine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.chiray-installed

# The unit tests (no Ray) run on two workers; the integration tests share one Ray and one SparkSession
# in one process (two workers, each with its own Ray, Spark and clusters, were no faster on two cores).
# `test` runs two streams at once: the integration tests, and at the lowest CPU priority the unit tests and
# then the integration tests marked `background` (they check results, never timings: the examples, NEXMark
# on Ray, the Spark-heavy benchmark smoke runs), on a Ray and SparkSession of their own. The low-priority
# stream takes only the CPU that the integration tests leave idle while they wait on Ray; its report (also
# in .background-tests.log) is printed when both are done, and either failing fails the target.
# Lowest priority is the SCHED_IDLE policy (chrt --idle), not only nice 19: Ray runs its workers at nice 15
# (RAY_worker_niceness), so the integration tests' own work weighs only about twice a nice-19 process; a
# nice-19 stream of Ray and Spark jobs slowed them by a fifth. Where chrt is missing, nice 19 alone.
# `test-fast` skips the tests marked slow and runs only a few integration files.
PYTEST := $(PY) -m pytest -q
LOWEST := nice -n 19 $(shell command -v chrt >/dev/null 2>&1 && echo chrt --idle 0)
# Every process that imports chiray (a Ray worker per host, each CLI and driver a test starts) compiles its
# modules again where Python may not write bytecode: let it, into __pycache__ (ignored by git).
unexport PYTHONDONTWRITEBYTECODE
FAST_INTEGRATION := tests/integration/test_runtime.py

.PHONY: demo test test-fast bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "chiray needs Python >= 3.10, found " + sys.version.split()[0]'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/chiray demo

test: $(STAMP)
	@$(LOWEST) sh -c '$(PYTEST) -n 2 -o cache_dir=.pytest_cache/unit tests/unit; u=$$?; \
	    $(PYTEST) -o cache_dir=.pytest_cache/background -m background tests/integration; b=$$?; \
	    test $$u = 0 && test $$b = 0' > .background-tests.log 2>&1 & low=$$!; \
	$(PYTEST) -m "not background" tests/integration; integration=$$?; \
	wait $$low; background=$$?; \
	echo "---- tests/unit, then tests/integration -m background (run beside the others, at the lowest priority) ----"; \
	cat .background-tests.log; \
	test $$integration = 0 && test $$background = 0

test-fast: $(STAMP)
	$(PYTEST) -n 2 -m "not slow" tests/unit
	$(PYTEST) -m "not slow" $(FAST_INTEGRATION)

bench: $(STAMP)
	$(PY) -m benchmarks.keyed_count --quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

# The documentation site (MkDocs + mkdocstrings), built with warnings as errors into site/.
.PHONY: docs
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict
