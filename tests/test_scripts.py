"""scripts/full_runs.sh: every command it would run is one the CLI accepts, with settings the experiments take."""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from capsnets.cli import build_parser, main
from capsnets.models import list_models, model_arguments

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "full_runs.sh"
STEPS = [
    "checks",
    "viewpoints",
    "viewpoints-exact",
    "segmentation-multimnist",
    "segmentation-bn",
    "affnist-synthesis",
    "matrix-mnist",
]
PROBE = "zz_not_a_setting"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _dry_run(tmp_path, *args: str) -> list[list[str]]:
    env = {**os.environ, "DRY_RUN": "1", "RUNS": str(tmp_path / "runs"), "PYTHON": "python"}
    done = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, check=True)
    return [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]


def _capsnets_args(commands: list[list[str]]) -> list[list[str]]:
    return [cmd[3:] for cmd in commands if cmd[:3] == ["python", "-m", "capsnets"]]


def test_every_step_prints_its_commands_and_writes_nothing(tmp_path):
    commands = _dry_run(tmp_path, *STEPS)
    assert not (tmp_path / "runs").exists()
    experiments = [args[1] for args in _capsnets_args(commands) if args[0] == "experiment"]
    assert experiments == ["viewpoints"] * 4 + ["segmentation", "multimnist", "segmentation", "affnist", "synthesis"]
    benchmarks = [cmd for cmd in commands if cmd[:2] == ["python", "benchmarks/throughput.py"]]
    assert len(benchmarks) == 2 and all(Path(SCRIPT.parents[1], cmd[1]).is_file() for cmd in benchmarks)
    for args in _capsnets_args(commands):
        assert "--device" in args and args[args.index("--device") + 1] == "cuda"


def test_benchmark_commands_parse_and_name_registered_models(tmp_path, load_benchmark):
    scripts = {f"benchmarks/{name}.py": load_benchmark(name) for name in ("throughput", "routing_products")}
    parsed = []
    for cmd in _dry_run(tmp_path, "checks"):
        if cmd[0] == "python" and cmd[1] in scripts:
            parsed.append(scripts[cmd[1]].parse_args(cmd[2:]))
    assert len(parsed) == 3
    assert all(set(args.models) <= set(list_models()) for args in parsed if hasattr(args, "models"))


def test_unknown_step_is_refused(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "RUNS": str(tmp_path / "runs"), "PYTHON": "python"}
    done = subprocess.run(["bash", str(SCRIPT), "viewpoint"], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "unknown step viewpoint" in done.stderr


def test_commands_parse_and_name_registered_models(tmp_path):
    parser = build_parser()
    for args in _capsnets_args(_dry_run(tmp_path, *STEPS)):
        parsed = parser.parse_args(args)
        if parsed.command == "train":
            assert parsed.model in list_models() and parsed.time_limit_minutes > 0
            assert {kv.split("=")[0].split(".")[0] for kv in parsed.model_arg} <= set(model_arguments(parsed.model))


@pytest.mark.parametrize("step", [s for s in STEPS if s not in ("checks", "matrix-mnist")])
def test_experiment_settings_are_ones_the_experiments_take(step, tmp_path, capsys):
    """Each experiment refuses an unknown setting before it does any work and names every unknown one, so
    adding a probe setting to the script's command must fail naming the probe alone."""
    for args in _capsnets_args(_dry_run(tmp_path, step)):
        args = [*args, "--set", f"{PROBE}=1"]
        args[args.index("--device") + 1] = "cpu"
        assert main(args) == 1
        err = capsys.readouterr().err
        unknown = re.search(r"does not take (.*?); it takes", err)
        assert unknown and unknown.group(1) == PROBE, err
