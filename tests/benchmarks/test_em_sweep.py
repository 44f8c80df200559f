import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import capsnets

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "em_sweep.py"
TINY = ["--train-size", "16", "--test-size", "8", "--steps", "4", "--batch-size", "8", "--threads", "1"]


def sweep(data_root, out, *extra):
    command = [sys.executable, str(SCRIPT), "--data-dir", str(data_root), "--out", str(out), *TINY, *extra]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


@pytest.mark.long
def test_sweep_records_each_run_and_a_rerun_skips_them(shared_data_root, tmp_path, load_benchmark, capsys):
    out = tmp_path / "sweep.json"
    only = ["--only", "official/it1/"]
    first = sweep(shared_data_root, out, "--seeds", "0", *only)  # the command; the reruns in this process (faster)
    script = load_benchmark("em_sweep")

    def rerun(*extra):
        capsys.readouterr()
        script.main(["--data-dir", str(shared_data_root), "--out", str(out), *TINY, *extra])
        return capsys.readouterr().out

    assert "1 runs left" in first
    record = json.loads(out.read_text())
    assert record["format"] == 1 and list(record["runs"]) == ["official/it1/lambda=authors/yl1993/seed=0"]
    assert record["protocol"] == {
        "model": "matrix_capsnet_small",
        "dataset": "mnist",
        "train_size": 16,
        "test_size": 8,
        "steps": 4,
        "batch_size": 8,
        "eval_steps": [1, 2, 4],
    }
    # stopped after seed 0: a run with seeds 0 and 1 trains seed 1 only, and keeps seed 0's entry as it was
    second = rerun("--seeds", "0", "1", *only)
    assert "1 runs left" in second and "== official/it1/lambda=authors/yl1993/seed=1" in second
    runs = json.loads(out.read_text())["runs"]
    assert (
        runs["official/it1/lambda=authors/yl1993/seed=0"] == record["runs"]["official/it1/lambda=authors/yl1993/seed=0"]
    )
    third = rerun("--seeds", "0", "1", *only)
    assert "runs left" not in third and "nothing left in this piece; 2 runs" in third
    assert json.loads(out.read_text())["runs"] == runs
    for seed in (0, 1):
        run = runs[f"official/it1/lambda=authors/yl1993/seed={seed}"]
        assert run["seed"] == seed
        assert run["setting"] == {
            "formulation": "official",
            "iterations": 1,
            "inverse_temperature": "authors",
            "recipe": "yl1993",
        }
        assert run["config"]["model_args"] == {"routing": {"type": "em", "formulation": "official", "iterations": 1}}
        assert run["config"]["lr"] == 3e-3 and run["config"]["weight_decay"] == 2e-7 and run["config"]["max_shift"] == 0
        assert run["config"]["epochs"] == 2 and run["config"]["limit_train"] == 16 and run["config"]["seed"] == seed
        assert run["normalize"] == [0.1307, 0.3081]
        assert [point["step"] for point in run["curve"]] == [1, 2, 4]
        assert all(0 <= point["test_accuracy"] <= 1 and math.isfinite(point["train_loss"]) for point in run["curve"])
        assert run["final_test_accuracy"] == run["curve"][-1]["test_accuracy"]
        assert run["wall_s"] >= run["train_s"] > 0 and run["cpu_s"] > 0
        assert run["environment"]["threads"] == 1 and run["environment"]["torch"] == torch.__version__
    plan = rerun("--seeds", "0", "1", "--plan", "--piece", "1/2", "--time-steps", "2")
    assert "2 runs recorded" in plan and "piece 1/2: 5 of 6 runs left" in plan and "piece 2/2: 5 of 6" in plan
    assert "stage B" in plan
    # runs of other sizes never count as these: the file refuses them
    command = [sys.executable, str(SCRIPT), "--data-dir", str(shared_data_root), "--out", str(out), *TINY]
    command[command.index("--steps") + 1] = "8"
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode != 0 and "pass another --out for these sizes" in refused.stderr
    assert json.loads(out.read_text())["runs"] == runs


def test_command_line_errors_say_what_to_change(tmp_path, load_benchmark, capsys):
    script = load_benchmark("em_sweep")
    base = ["--out", str(tmp_path / "x.json")]
    for extra, message in (
        (["--train-size", "100", "--steps", "5"], "use a multiple of 4"),
        (["--piece", "3/2"], "--piece must be K/N"),
    ):
        with pytest.raises(SystemExit) as stopped:
            script.main([*base, *extra])
        assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_stage_b_explores_the_best_of_stage_a_once_it_is_complete(load_benchmark):
    em_grid, em_sweep = load_benchmark("em_grid"), load_benchmark("em_sweep")
    stage_a = em_grid.stage_a()
    assert [s.key for s in stage_a[:2]] == ["official/it1/lambda=authors/yl1993", "official/it2/lambda=authors/yl1993"]
    assert {s.formulation for s in stage_a} == {"official", "paper"} and len(stage_a) == 6
    score = {"official/it2": 0.9, "paper/it2": 0.8}
    runs = {}
    for setting in stage_a:
        for seed in (0, 1, 2):
            accuracy = score.get(f"{setting.formulation}/it{setting.iterations}", 0.5) + seed / 100
            runs[em_grid.run_key(setting, seed)] = {"final_test_accuracy": accuracy}
    incomplete = dict(runs)
    incomplete.pop(em_grid.run_key(stage_a[-1], 2))
    assert em_grid.stage_b(incomplete, [0, 1, 2], top=2) is None
    stage_b = em_grid.stage_b(runs, [0, 1, 2], top=2)
    assert len(stage_b) == 16 and not set(stage_b) & set(stage_a)
    assert {(s.formulation, s.iterations) for s in stage_b} == {("official", 2), ("paper", 2)}
    assert {(s.inverse_temperature, s.recipe) for s in stage_b if s.formulation == "paper"} == {
        (lam, recipe) for lam in em_grid.LAMBDAS for recipe in em_grid.RECIPES
    } - {("1e-3", "yl1993")}
    # pieces keep their runs as stage B is added: stage A's pairs come first in a fixed order
    args = em_sweep.parse_args(["--piece", "2/3"])
    before = em_sweep.select(stage_a, args)
    after = em_sweep.select(stage_a + stage_b, args)
    assert after[: len(before)] == before
    assert len(em_grid.full_grid()) == 2 * 3 * 3 * len(em_grid.ALL_RECIPES)


def test_recipes_follow_their_sources(load_benchmark):
    em_grid, em_sweep = load_benchmark("em_grid"), load_benchmark("em_sweep")
    # yl-1993: the margin grows from 0.2 to 0.9 over 10 epochs
    assert em_grid.yl1993_margin(1) == pytest.approx({"margin_start": 0.2, "margin_end": 0.27, "ramp": 1.0})
    assert em_grid.yl1993_margin(20) == pytest.approx({"margin_start": 0.2, "margin_end": 0.9, "ramp": 0.5})
    # the released code's sigmoid margin, as a linear ramp over the run
    margin = em_grid.authors_margin(10000)
    for step in range(0, 10001, 1000):
        exact = 0.2 + 0.79 / (1 + math.exp(-(step / 50000 - 4)))
        linear = margin["margin_start"] + (margin["margin_end"] - margin["margin_start"]) * step / 10000
        assert abs(exact - linear) < 2e-4
    args = em_sweep.parse_args([])
    config, normalize = em_sweep.make_config(em_grid.Setting("paper", 2, "1e-2", "cli"), 1, args)
    assert normalize is None and (config.lr, config.lr_decay, config.weight_decay, config.max_shift) == (
        1e-3,
        0.96,
        0,
        2,
    )
    assert config.loss_args == {"margin_start": 0.2, "margin_end": 0.9, "ramp": 0.5, "ramp_epochs": None}
    assert config.epochs == 1 and config.batch_size == 32 and config.limit_train == 12800 and config.limit_test == 2000
    assert config.model_args == {
        "routing": {"type": "em", "formulation": "paper", "iterations": 2, "inverse_temperature": 1e-2}
    }
    config, normalize = em_sweep.make_config(em_grid.Setting("official", 3, "authors", "authors"), 0, args)
    assert normalize is None and config.lr == 1e-2 and config.weight_decay == 2e-6 and config.max_shift == 2
    assert config.lr_decay == pytest.approx(0.96 ** (400 / 20000))
    assert args.eval_steps == [100, 200, 400]


def test_each_recipe_is_its_own_whatever_the_models_recipe(load_benchmark):
    """A recipe names every field a model's recipe sets, so the matrix networks' recipe changes none of them;
    ``default`` is the model's own."""
    em_grid, em_sweep = load_benchmark("em_grid"), load_benchmark("em_sweep")
    args = em_sweep.parse_args([])
    for name, recipe in em_grid.ALL_RECIPES.items():
        fields = recipe(1, 400)
        fields.pop("normalize", None)
        config, _ = em_sweep.make_config(em_grid.Setting("paper", 2, "authors", name), 0, args)
        assert {key: getattr(config, key) for key in fields} == fields, name
    config, _ = em_sweep.make_config(em_grid.Setting("paper", 2, "authors", "default"), 0, args)
    model_recipe = capsnets.models.training_recipe("matrix_capsnet_small")
    assert {key: getattr(config, key) for key in model_recipe} == model_recipe


def test_a_run_trains_as_the_trainer_does(load_benchmark, tmp_path):
    """The sweep's runs carry over to ``capsnets train``: the same config gives the same weights and accuracy."""
    from capsnets.engine import TrainConfig, Trainer

    em_sweep = load_benchmark("em_sweep")
    config = TrainConfig(
        model="capsnet_digits",
        dataset="digits",
        epochs=2,
        batch_size=16,
        limit_train=48,
        limit_test=40,
        lr=3e-3,
        weight_decay=1e-4,
        lr_decay=0.5,
        loss="spread",
        loss_args={"margin_end": 0.5, "ramp": 1.0},
        max_shift=1,
        seed=3,
        device="cpu",
        threads=1,
        progress=False,
        out=str(tmp_path / "run"),
    )
    trainer = Trainer(config.replace())
    summary = trainer.fit()
    result = em_sweep.train_run(config, [3, 6])
    assert [point["step"] for point in result["curve"]] == [3, 6]
    assert result["curve"][-1]["test_accuracy"] == summary["test_accuracy"]
    for (name, mine), theirs in zip(result["model"].state_dict().items(), trainer.model.state_dict().values()):
        assert torch.equal(mine, theirs), name
    # normalisation changes what the model sees, in training and in the evaluation
    normalized = em_sweep.train_run(config, [6], normalize=(0.5, 0.25))
    assert not torch.equal(normalized["model"].state_dict()["conv.weight"], result["model"].state_dict()["conv.weight"])


def test_pieces_side_by_side_add_to_the_record_in_turn(load_benchmark, tmp_path):
    em_sweep = load_benchmark("em_sweep")
    out = tmp_path / "sweep.json"
    em_sweep.add_run(out, "a", {"piece": 1})
    code = (
        f"import sys, pathlib; sys.path.insert(0, {str(SCRIPT.parent)!r}); import em_sweep; print('ready', flush=True); "
        f"em_sweep.add_run(pathlib.Path({str(out)!r}), 'b', {{'piece': 2}})"
    )
    with em_sweep.locked(out):
        writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        assert writer.poll() is None  # waiting for the lock
        record = em_sweep.read_record(out)
        record["runs"]["c"] = {"piece": 1}
        out.write_text(json.dumps(record))
    assert writer.wait(timeout=120) == 0
    assert em_sweep.read_record(out)["runs"] == {"a": {"piece": 1}, "b": {"piece": 2}, "c": {"piece": 1}}
    assert list(tmp_path.iterdir()) == [out]  # no lock file left beside it


def test_a_diverging_run_is_recorded_as_it_ended(load_benchmark, tmp_path):
    from capsnets.engine import TrainConfig

    em_sweep = load_benchmark("em_sweep")
    config = TrainConfig(
        model="capsnet_digits", dataset="digits", epochs=1, batch_size=16, limit_train=64, limit_test=20,
        lr=1e30, device="cpu", threads=1, progress=False, out=str(tmp_path / "run"),
    )  # fmt: skip
    result = em_sweep.train_run(config, [4])
    assert "is nan" in result["non_finite"] or "is inf" in result["non_finite"]
    last = result["curve"][-1]
    assert last["train_loss"] is None and 1 <= last["step"] <= 4 and 0 <= last["test_accuracy"] <= 1


def test_table_has_a_row_per_setting_best_first_with_the_seed_means(load_benchmark):
    sweep = load_benchmark("em_sweep")

    def run(formulation, seed, accuracies, cpu_s):
        curve = [{"step": step, "test_accuracy": a, "train_loss": 1.0} for step, a in zip((100, 200, 400), accuracies)]
        setting = {"formulation": formulation, "iterations": 2, "inverse_temperature": "1e-3", "recipe": "cli"}
        return {
            "setting": setting,
            "seed": seed,
            "curve": curve,
            "final_test_accuracy": accuracies[-1],
            "non_finite": None,
            "cpu_s": cpu_s,
            "wall_s": cpu_s,
            "environment": {"threads": 1},
        }

    runs = {
        "a0": run("official", 0, (0.5, 0.6, 0.7), 60),
        "a1": run("official", 1, (0.7, 0.8, 0.9), 180),
        "b0": run("paper", 0, (0.8, 0.9, 0.95), 120),
    }
    lines = sweep.table(runs).splitlines()
    assert lines[0].startswith("| setting | seeds | step 100 | step 200 | step 400 | last: min-max |")
    assert lines[2] == "| `paper/it2/lambda=1e-3/cli` | 1 | 80.0 | 90.0 | 95.0 | 95.0-95.0 | 0 | 2.0 |"
    assert lines[3] == "| `official/it2/lambda=1e-3/cli` | 2 | 60.0 | 70.0 | 80.0 | 70.0-90.0 | 0 | 2.0 |"
