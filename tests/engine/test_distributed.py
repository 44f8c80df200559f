"""Data-parallel training: two gloo processes on the CPU (launched with torchrun) against one process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from capsnets.engine.trainer import Trainer

from helpers import TinyCapsNet, tiny_splits

WORKER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[3])  # tests/, for helpers
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file
    from capsnets.engine import TrainConfig, Trainer
    from helpers import TinyCapsNet, tiny_splits

    def save(trainer, name):
        state = {k: v.contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(state, os.path.join(sys.argv[2], f"{name}{os.environ['RANK']}.safetensors"))

    dist.init_process_group("gloo")  # one group for both trainings, which use the group they find
    named = Trainer(TrainConfig(**json.loads(sys.argv[1])))  # a registered model and data set, by name
    named.fit()
    save(named, "rank")
    train_set, val_set = tiny_splits()  # a model of your own on torch Datasets
    torch.manual_seed(0)
    objects = Trainer(
        out=os.path.join(sys.argv[2], "objects"), epochs=1, batch_size=16, device="cpu", progress=False, figures=False
    )
    objects.fit(TinyCapsNet(), train_set, val_set)
    save(objects, "objects_rank")
    dist.destroy_process_group()
    # Everything is saved: leave without the interpreter's finalization, in which torch's gloo threads abort the
    # process about one run in ten ("terminate called without an active exception"), after the work is done.
    os._exit(0)
""")


@pytest.mark.long  # started first (tests/conftest.py)
def test_two_gloo_processes_match_one_process(tiny_config, tmp_path):
    """One torchrun of two gloo processes trains a registered model by name, and a model of your own on torch
    Datasets (``Trainer.fit`` with objects); each gives the weights of one process."""
    # 64 examples, 16 held out for validation, global batch 16: 3 steps of 8 examples per rank; every batch is full
    # on both ranks.
    # Two epochs planned, but the time limit stops both ranks after the first (rank 0 decides for all: a
    # rank that went on alone would hang in its first collective).
    config = tiny_config(
        epochs=2,
        batch_size=16,
        limit_train=64,
        limit_test=16,
        val_fraction=0.25,
        out=str(tmp_path / "ddp"),
        time_limit_minutes=1e-9,
    )
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(tmp_path / "worker.py"),
        json.dumps(config.to_dict()),
        str(tmp_path),
        str(Path(__file__).parents[1]),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    assert (tmp_path / "ddp" / "last.safetensors").is_file()

    single = Trainer(config.replace(out=str(tmp_path / "single")))
    single.fit()
    for name, expected in single.model.state_dict().items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"ranks differ in {name}"
        torch.testing.assert_close(ranks[0][name], expected, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
    lines = (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()
    alone = json.loads((tmp_path / "single" / "metrics.jsonl").read_text())
    assert len(lines) == 1 and json.loads(lines[0])["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-5)
    # the test set is evaluated in two shards whose counts are summed: the same figures as one process
    assert json.loads(lines[0])["test_accuracy"] == alone["test_accuracy"]
    assert json.loads(lines[0])["test_loss"] == pytest.approx(alone["test_loss"], rel=1e-5)
    # your own model on torch Datasets: 224 training examples, 14 full global batches of 16
    ranks = [load_file(tmp_path / f"objects_rank{r}.safetensors") for r in range(2)]
    torch.manual_seed(0)
    single = Trainer(
        out=str(tmp_path / "objects_single"), epochs=1, batch_size=16, device="cpu", progress=False, figures=False
    )
    single.fit(TinyCapsNet(), *tiny_splits())
    for name, expected in single.model.state_dict().items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"ranks differ in {name}"
        torch.testing.assert_close(ranks[0][name], expected, rtol=1e-5, atol=1e-6, msg=f"{name} differs")
