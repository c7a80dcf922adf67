# One-command set-up: `make demo` runs the main job, `make test` the whole test suite.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export MUJOCO_GL ?= egl
export PYTHONUNBUFFERED := 1

.PHONY: demo test lint venv clean-venv expert-demo

venv: $(STAMP)

$(STAMP): requirements.txt requirements-ros.txt setup.py package.xml
	@echo "Installing into $(VENV): the ROS 2 Kilted wheels (rclpy and messages), PyTorch (CPU), transformers,"
	@echo "Pinocchio, MuJoCo and the rest (about 2 GB; 3-10 minutes, once; later runs reuse it)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# The whole system: the MuJoCo sim bridge and the VLA node as two ROS 2 processes over DDS.
demo: $(STAMP)
	$(PY) -m vla_accel_ros.cli sim --episodes 3 --control-rate 20 --decoder kerv --seed 100000 --out outputs/demo

# The lint and type gate (config in pyproject.toml); `make test` runs it before the tests.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

test: lint
	$(PY) -m pytest -q test

clean-venv:
	rm -rf $(VENV)
