# ssm_course: `make test`, `make docs`, `make lab`. Each creates .venv on first use.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch by default, from PyTorch's CPU wheel index (PyPI's Linux wheel of the same version is the CUDA
# build, with several GB of NVIDIA libraries); `make TORCH=torch TORCH_INDEX=` for PyPI's default build on a GPU machine.
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.installed-$(shell echo '$(TORCH)' | tr -c 'A-Za-z0-9.=\n' '_')
export PYTHONHASHSEED := 0
# The seconds of CPU time one notebook may take in test mode (`make test NB_MAX_SECONDS=...` to change it): reported on
# every machine, a failure only in CI (.ci/run sets SSM_COURSE_ENFORCE_NB_BUDGET=1), where it is measured in CPU time.
NB_MAX_SECONDS ?= 60

.PHONY: test docs lab bench clean install test-triton36

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[dev]"
	@rm -f $(VENV)/.installed-*
	@touch $@

test: $(STAMP)
	@echo "== 1/3 notebooks clean (nbdev-clean) and package in sync (nbdev-export)"
	@$(PY) tests/check_sync.py || { echo "make test FAILED at step 1/3: run nbdev-clean and nbdev-export, then commit"; exit 1; }
	@echo "== 2/3 nbdev-test: run every notebook (slow and gpu cells skipped); budget $(NB_MAX_SECONDS) s of CPU time each"
	@# Without a GPU every notebook runs under Triton's interpreter: nbdev-test runs several notebooks in one process, and a
	@# kernel notebook fails if an earlier one imported ssm_course's Triton modules in compiled mode (08 then 10 did).
	@TRITON_INTERPRET=$$($(PY) -c "import torch; print(0 if torch.cuda.is_available() else 1)") OMP_NUM_THREADS=1 MPLBACKEND=Agg $(PY) tests/notebook_times.py --max-seconds $(NB_MAX_SECONDS) --n-workers 2 || { echo "make test FAILED at step 2/3: nbdev-test (a notebook raised$${SSM_COURSE_ENFORCE_NB_BUDGET:+, or took over $(NB_MAX_SECONDS) s of CPU time}, see above)"; exit 1; }
	@echo "== 3/3 pytest tests/"
	@OMP_NUM_THREADS=1 $(VENV)/bin/pytest tests -n 2 --dist loadfile -q --durations=10 || { echo "make test FAILED at step 3/3: pytest"; exit 1; }

docs: $(STAMP)
	$(PY) docs/build.py --out _docs --readme README.md

lab: $(STAMP)
	$(VENV)/bin/jupyter lab nbs $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _docs _proc build dist *.egg-info

bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m ssm_course.bench --out bench/results/cpu-full-$$(date +%F).json

# The Triton kernels' interpreter tests and the sm_80/sm_90 compile test against Triton 3.6 (whose interpreter needs NumPy < 2.4), side by side with the installed one.
test-triton36: $(STAMP)
	$(PY) -m pip install -q --target .triton36 --no-deps "triton==3.6.0" "numpy<2.4"
	PYTHONPATH=.triton36 OMP_NUM_THREADS=1 $(VENV)/bin/pytest tests/test_triton.py tests/test_triton_ssm.py tests/test_compile.py -q -n 2
