"""Run directories: never replaced by accident, resumed only as the run they hold, repaired after a crash."""

import hashlib
import json
from pathlib import Path

import pytest

from capsnets import checkpoints as capsnets_checkpoints
from capsnets.engine import reporting
from capsnets.engine.run_dir import RunDirectory, RunDirectoryError, resume_changes
from capsnets.engine.trainer import Trainer
from capsnets.validation import ArgumentError

SMALL = dict(batch_size=16, limit_train=32, limit_test=16)


@pytest.fixture
def no_figures(monkeypatch):
    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])  # slow, and not what is tested


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != ".lock"}


def test_a_fresh_run_into_a_run_directory_is_refused_and_changes_nothing(tiny_config, no_figures):
    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    before = _snapshot(Path(config.out))
    with pytest.raises(RunDirectoryError, match=r"already holds a run \(epoch 1 of 1\).*--resume.*--overwrite"):
        Trainer(tiny_config(epochs=3, **SMALL)).fit()
    assert _snapshot(Path(config.out)) == before


def test_a_run_that_never_finished_an_epoch_may_be_started_again(tiny_config, no_figures):
    run = Path(tiny_config().out)
    run.mkdir()
    tiny_config().save(run / "config.yaml")  # what a run stopped by a bad value leaves
    Trainer(tiny_config(epochs=1, **SMALL)).fit()
    assert (run / "last.safetensors").is_file()


def test_a_users_config_yaml_is_not_taken_for_a_run_stopped_early(tiny_config, no_figures):
    run = Path(tiny_config().out)
    run.mkdir()
    (run / "config.yaml").write_text("model: capsnet_digits\n")  # the user's own, not one a training wrote
    for overwrite in (False, True):
        with pytest.raises(RunDirectoryError, match="holds files that are not a training run"):
            Trainer(tiny_config(epochs=1, **SMALL), overwrite=overwrite).fit()
    assert (run / "config.yaml").read_text() == "model: capsnet_digits\n"


def test_overwrite_replaces_the_run_once_the_new_one_has_a_checkpoint(tiny_config, no_figures):
    config = tiny_config(epochs=2, **SMALL)
    Trainer(config).fit()
    Trainer(tiny_config(epochs=1, **SMALL), overwrite=True).fit()
    run = Path(config.out)
    assert len(reporting.read_metrics(run)) == 1
    assert [p.name for p in run.parent.iterdir() if ".replaced-" in p.name] == []


def test_overwrite_puts_the_old_run_back_when_the_new_one_fails_first(tiny_config, no_figures, monkeypatch):
    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    run = Path(config.out)
    before = _snapshot(run)

    def fail(self, *args, **kwargs):
        raise RuntimeError("simulated failure in the first epoch")

    monkeypatch.setattr(Trainer, "_evaluate", fail)
    with pytest.raises(RuntimeError, match="simulated"):
        Trainer(tiny_config(epochs=1, **SMALL), overwrite=True).fit()
    assert _snapshot(run) == before
    failed = [p for p in run.parent.iterdir() if ".failed-" in p.name]
    assert len(failed) == 1 and (failed[0] / "config.yaml").is_file()


def test_resume_and_overwrite_together_are_refused(tiny_config):
    with pytest.raises(RunDirectoryError, match="one of them"):
        Trainer(tiny_config(), resume=True, overwrite=True)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model_args={"routing": {"iterations": 3}}), "model_args.routing.iterations 2 -> 3"),
        (
            dict(model_args={"routing": {"iterations": 2}, "reconstruction": False}),
            "model_args.reconstruction true -> false",
        ),
        (dict(batch_size=8), "batch_size 16 -> 8"),
        (dict(seed=4), "seed 0 -> 4"),
        (dict(loss="margin", **{"loss_args": {"m_plus": 0.8}}), 'loss null -> "margin"'),
    ],
)
def test_resume_refuses_changes_that_make_another_run(tiny_config, no_figures, change, message):
    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    before = _snapshot(Path(config.out))
    wanted = {**config.to_dict(), **SMALL, "epochs": 2, **change}
    wanted["model_args"] = change.get("model_args", {})
    with pytest.raises(RunDirectoryError, match=f"cannot resume.*{message}.*another run"):
        Trainer(config.replace(**wanted), resume=True).fit()
    assert _snapshot(Path(config.out)) == before


def test_resume_with_fewer_epochs_than_trained_is_refused(tiny_config, no_figures):
    Trainer(tiny_config(epochs=2, **SMALL)).fit()
    with pytest.raises(RunDirectoryError, match="trained 2 epochs; --epochs 1 is fewer"):
        Trainer(tiny_config(epochs=1, **SMALL), resume=True).fit()


def test_a_new_learning_rate_on_resume_is_applied_and_recorded(tiny_config, no_figures, caplog):
    config = tiny_config(epochs=1, lr=1e-3, lr_decay=0.5, **SMALL)
    Trainer(config).fit()
    with caplog.at_level("WARNING"):
        trainer = Trainer(config.replace(epochs=3, lr=8e-3, lr_decay=0.25), resume=True)
        trainer.fit()
    records = reporting.read_metrics(Path(config.out))
    # epoch e (from 1) trains at lr * lr_decay**(e - 1), with the values the run was resumed with from epoch 2 on
    assert [r["lr"] for r in records] == pytest.approx([1e-3, 8e-3 * 0.25, 8e-3 * 0.25**2])
    assert (
        "resuming with lr 0.008 (was 0.001)" in caplog.text and "epoch 2 trains at learning rate 0.002" in caplog.text
    )
    meta = capsnets_checkpoints.load_checkpoint(Path(config.out) / "last.safetensors").meta
    assert meta["training"]["extra"]["resumed_with"] == [{"epoch": 1, "epochs": 3, "lr": 8e-3, "lr_decay": 0.25}]
    assert meta["config"]["lr"] == 8e-3


def test_a_cosine_run_resumed_for_more_epochs_anneals_over_the_new_length(tiny_config, no_figures, caplog):
    config = tiny_config(epochs=1, lr=1e-3, lr_schedule="cosine", **SMALL)  # SMALL: 2 steps an epoch
    Trainer(config).fit()
    with caplog.at_level("WARNING"):
        Trainer(config.replace(epochs=2), resume=True).fit()
    # annealed to 0 at the end of the 1 planned epoch; step 2 of the 4 now planned trains at lr / 2
    assert "epoch 2 trains at learning rate 0.0005" in caplog.text
    records = reporting.read_metrics(Path(config.out))
    assert [r["lr"] for r in records] == pytest.approx([0.0, 0.0])  # the next step's: the end of each plan
    with pytest.raises(ValueError, match="anneals its learning rate with a cosine"):
        Trainer(config.replace(epochs=3, lr_decay=0.5), resume=True).fit()


def test_resume_repairs_a_torn_metrics_line(tiny_config, no_figures, caplog, tmp_path):
    """A crash in the middle of appending a record: resume drops the torn line, with a warning, and the run's
    metrics end as an uninterrupted run's."""
    full = tiny_config(out=str(tmp_path / "full"), epochs=2, **SMALL)
    Trainer(full).fit()
    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    metrics = Path(config.out) / reporting.METRICS_FILE
    metrics.write_text(metrics.read_text() + '{"epoch": 2, "train_lo')
    with caplog.at_level("WARNING"):
        Trainer(config.replace(epochs=2), resume=True).fit()
    assert "torn" in caplog.text
    drop = ("epoch_time_s", "images_per_s", "train_time_s", "time_s")
    rows = [
        [{k: v for k, v in r.items() if k not in drop} for r in reporting.read_metrics(Path(c.out))]
        for c in (full, config)
    ]
    assert rows[0] == rows[1]


def test_a_damaged_metrics_line_names_the_file_and_line(tmp_path):
    (tmp_path / reporting.METRICS_FILE).write_text('{"epoch": 1}\n[not a record\n{"epoch": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl' line 2 is not a JSON object"):
        reporting.read_metrics(tmp_path)


def test_a_second_training_into_the_same_directory_is_refused(tmp_path):
    with RunDirectory(tmp_path / "run"):
        with pytest.raises(RunDirectoryError, match="in use by another training"):
            with RunDirectory(tmp_path / "run", resume=True):
                pass
    with RunDirectory(tmp_path / "run", resume=True):  # released
        pass


def test_resume_changes_lists_what_it_applies():
    saved = {"model": "m", "model_args": {"a": 1}, "epochs": 2, "lr": 0.1, "batch_size": 4}
    wanted = {"model": "m", "model_args": {"b": [1, 2]}, "epochs": 5, "lr": 0.1, "batch_size": 4}
    assert resume_changes(saved, wanted, {"a": 0, "b": (1, 2)}, "run") == {"epochs": (2, 5)}
    with pytest.raises(RunDirectoryError, match=r"model_args.a 1 -> 2"):
        resume_changes(saved, {**wanted, "model_args": {"a": 2}}, {"a": 0}, "run")
    with pytest.raises(RunDirectoryError, match=r"image_size 32 -> 16"):  # the data's size: another run
        resume_changes({**saved, "image_size": 32}, {**wanted, "image_size": 16}, {"a": 0}, "run")


def test_figures_missing_after_a_kill_are_drawn_on_resume(tiny_config):
    config = tiny_config(epochs=1, figures=True, **SMALL)
    Trainer(config).fit()
    run = Path(config.out)
    (run / reporting.CURVES_FILE).unlink()  # killed before the figures were drawn
    Trainer(config, resume=True).fit()  # a finished run: nothing to train
    assert (run / reporting.CURVES_FILE).is_file()


def test_sidecar_entries_of_the_wrong_type_are_refused_on_resume(tiny_config, no_figures):
    """The training state inside a sidecar is checked before anything is trained."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    path = Path(config.out) / "last.safetensors"
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata()
    meta = json.loads(metadata[capsnets_checkpoints.EMBEDDED_SIDECAR])
    meta["training"]["epoch"] = "one"
    text = json.dumps(meta)  # with its checksum: written so, not damaged afterwards
    save_file(
        load_file(path),
        path,
        metadata={
            **metadata,
            capsnets_checkpoints.EMBEDDED_SIDECAR: text,
            capsnets_checkpoints.SIDECAR_DIGEST: hashlib.sha256(text.encode()).hexdigest(),
        },
    )
    with pytest.raises(ValueError, match="training.epoch.*'one'"):
        Trainer(config.replace(epochs=2), resume=True).fit()
    assert len(reporting.read_metrics(Path(config.out))) == 1


def test_a_best_checkpoint_lost_to_a_crash_is_saved_again_on_resume(tiny_config, no_figures, caplog):
    """A crash after saving ``last`` but before ``best`` of the best epoch: the resumed run saves it again."""
    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    run = Path(config.out)
    for name in ("best.safetensors", "best.json"):
        (run / name).unlink()
    with caplog.at_level("WARNING"):
        Trainer(config, resume=True).fit()
    assert "saved it again" in caplog.text
    assert capsnets_checkpoints.load_checkpoint(run / "best.safetensors").meta["epoch"] == 1


@pytest.mark.parametrize("existed", [False, True])
def test_a_fresh_run_that_fails_before_saving_leaves_nothing_it_created(tiny_config, tmp_path, existed):
    run = tmp_path / "new" / "run"
    if existed:
        run.mkdir(parents=True)
    with pytest.raises(ArgumentError, match="does not take num_class"):
        Trainer(tiny_config(out=str(run), model_args={"num_class": 2})).fit()
    if existed:  # the user's folder stays, empty again
        assert list(run.iterdir()) == []
    else:  # the folders it made go
        assert not (tmp_path / "new").exists()


def test_a_failed_resume_keeps_the_run(tiny_config, no_figures, monkeypatch):
    config = tiny_config(epochs=1, **SMALL)
    Trainer(config).fit()
    before = _snapshot(Path(config.out))
    monkeypatch.setattr(Trainer, "_set_up", lambda *args: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(tiny_config(epochs=2, **SMALL), resume=True).fit()
    assert _snapshot(Path(config.out)) == before
