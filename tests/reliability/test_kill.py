"""A training killed with SIGKILL at any point, a checkpoint save included, and continued as a user would
(``--resume`` when the run has a checkpoint, else the command again, ``--overwrite`` where that is refused)
ends bitwise as the training that was never killed: weights, Adam state, RNG state, metrics and history.

Kill points are calls of the write primitives (``crash_runner.SITES``): the N-th ``os.replace`` (before or
after it: every commit point), ``safetensors.torch.save_file`` (before, after, or leaving half a file),
``os.fsync``, ``os.unlink``, ``write`` (half of it written) and the optimiser step (mid-epoch), N drawn from a
seeded RNG among the first two thirds of the calls a whole run makes (a later kill of a scenario: the first third). The short
version kills once at each of the 9 (site, mode) pairs, 3 scenarios of 3 kills in a row, every kill firing, then
between two figures and in an ``--overwrite``; ``-m faults_long`` runs 40 scenarios of 1 to 4 kills, a quarter
of the kills timed (SIGKILL 0-4 s after the start), and a kill before each figure, drawn for real.
"""

from __future__ import annotations

import random
import shutil

import pytest
from reliability.crash_runner import SITES
from reliability.faults import TRAIN, CrashRunner, assert_same_run, next_command, one_error_line, snapshot

SEED = 11
PAIRS = [(site, mode) for site, modes in SITES.items() for mode in modes]


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    runner = CrashRunner(tmp_path_factory.mktemp("kill-logs"))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def reference(runner, tmp_path_factory):
    """The uninterrupted run (without figures) and the calls it made at each kill site."""
    run = tmp_path_factory.mktemp("kill-reference") / "run"
    status, log, counts = runner.run([*TRAIN, "--out", str(run)])
    assert status == 0, log
    return run, counts


def _kill(rng: random.Random, site: str, mode: str, counts: dict[str, int], first: bool = True) -> dict:
    """Kill at a call drawn among the first two thirds of those of a whole run (``first``: a later kill then still
    has a training to stop), else of the first third of one: a resumed run makes fewer."""
    last = max(1, 2 * counts[site] // 3) if first else max(1, counts[site] // 3)
    return {"site": site, "mode": mode, "call": rng.randint(1, last)}


def _scenario(runner: CrashRunner, run, kills: list[dict], figures: bool | str) -> list[tuple]:
    """Run the training, killing attempt i at ``kills[i]``, continuing until it finishes; returns the attempts."""
    attempts, kills = [], list(kills)
    for _ in range(len(kills) + 4):
        kill = kills.pop(0) if kills else None
        argv = next_command(run)
        status, log, _ = runner.run(argv, kill=kill, figures=figures)
        if status == 1 and "--resume" not in argv:  # a run directory of files, no checkpoint: refused
            assert "--overwrite" in one_error_line(log), log
            argv = [*argv, "--overwrite"]
            status, log, _ = runner.run(argv, kill=kill, figures=figures)
        assert "Traceback" not in log, log
        attempts.append((next((a for a in argv if a in ("--resume", "--overwrite")), "train"), kill, status))
        if status == 0:
            return attempts
        assert status == -9, f"attempt {len(attempts)} ({argv}, kill {kill}) ended with {status}:\n{log}"
    raise AssertionError(f"the training did not finish: {attempts}")


def _short_scenarios() -> list[list[tuple[str, str]]]:
    """Every (site, mode) once, three kills per scenario."""
    pairs = list(PAIRS)
    random.Random(SEED).shuffle(pairs)
    return [pairs[i : i + 3] for i in range(0, len(pairs), 3)]


@pytest.mark.parametrize("index", range(len(_short_scenarios())))
def test_a_killed_training_resumes_as_if_never_killed(runner, reference, tmp_path, record_property, index):
    ref, counts = reference
    rng = random.Random(f"{SEED}-{index}")
    kills = [_kill(rng, site, mode, counts, first=i == 0) for i, (site, mode) in enumerate(_short_scenarios()[index])]
    attempts = _scenario(runner, tmp_path / "run", kills, figures=False)
    assert [status for *_, status in attempts] == [-9] * len(kills) + [0], f"a kill did not fire: {attempts}"
    record_property("attempts", attempts)  # (with --junitxml)
    assert_same_run(tmp_path / "run", ref)


def test_an_overwrite_killed_before_its_first_checkpoint_gives_the_old_run_back(runner, reference, tmp_path):
    ref, _ = reference
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    before = snapshot(run)
    status, log, _ = runner.run([*TRAIN, "--overwrite", "--out", str(run)], kill={"site": "fsync", "call": 1})
    assert status == -9 and [p.name.split("-")[0] for p in tmp_path.iterdir()] != ["run"]  # the old run aside
    status, log, _ = runner.run(["train", "--resume", "--out", str(run)])
    assert status == 0 and "put back the run it replaced" in log, log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    after = snapshot(run)
    moved = ("config.yaml", "summary.json")  # they record the run directory, which moved
    assert {k: after[k] for k in before if k not in moved} == {k: v for k, v in before.items() if k not in moved}


@pytest.mark.parametrize(
    "figure, drawn",
    [
        pytest.param(0, True, marks=pytest.mark.faults_long),
        pytest.param(1, True, marks=pytest.mark.faults_long),
        (2, "stub"),
        pytest.param(2, True, marks=pytest.mark.faults_long),
    ],
)
def test_a_kill_while_the_figures_are_written_is_repaired(runner, reference, tmp_path, figure, drawn):
    """Killed before the commit of figure 1, 2 or 3 (each written atomically; the others already there), the
    run draws the missing ones on --resume (the short version with stand-ins for the figures, written the same way:
    drawing them takes seconds)."""
    ref, counts = reference
    call = counts["replace"] + figure  # without figures the last two replaces write the summary; they come between
    attempts = _scenario(runner, tmp_path / "run", [{"site": "replace", "mode": "before", "call": call}], figures=drawn)
    assert [status for *_, status in attempts] == [-9, 0]
    assert_same_run(tmp_path / "run", ref, figures=True)


def _long_scenario(rng: random.Random, counts: dict[str, int]) -> list[dict]:
    kills = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.25:
            kills.append({"after_s": rng.uniform(0.0, 4.0)})
        else:
            kills.append(_kill(rng, *rng.choice(PAIRS), counts, first=not kills))
    return kills


@pytest.mark.faults_long
@pytest.mark.parametrize("index", range(40))
def test_many_kills_resume_as_if_never_killed(runner, reference, tmp_path, record_property, index):
    ref, counts = reference
    rng = random.Random(f"{SEED}-long-{index}")
    figures = rng.random() < 0.25
    kills = _long_scenario(rng, counts)
    record_property("attempts", _scenario(runner, tmp_path / "run", kills, figures=figures))  # (with --junitxml)
    assert_same_run(tmp_path / "run", ref, figures=figures)
