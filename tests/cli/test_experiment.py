"""``capsnets experiment``: listing, errors, and smoke runs through the command line."""

import pytest

from capsnets.cli import main
from capsnets.experiments import ExperimentResult, list_experiments, markdown_table, write_report


def test_list_names_the_experiments_one_line_each(capsys):
    assert main(["experiment", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list_experiments() and all(len(line.split()) > 3 for line in lines)


def test_list_with_a_name_shows_its_settings_with_defaults(capsys):
    assert main(["experiment", "synthesis", "--list"]) == 0
    out = capsys.readouterr().out
    assert "  epochs: int = 20 (smoke: 1)" in out and "  train_minutes: float | None = None" in out


def test_unknown_experiment_lists_the_known_ones(capsys, tmp_path):
    assert main(["experiment", "multimnst", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "unknown experiment 'multimnst'" in err and "multimnist" in err and "dimensions" in err


def test_missing_out_and_bad_setting(capsys, tmp_path):
    assert main(["experiment", "dimensions"]) == 1
    assert "--out" in capsys.readouterr().err
    assert main(["experiment", "dimensions", "--out", str(tmp_path), "--set", "nonsense=1"]) == 1
    assert "does not take nonsense" in capsys.readouterr().err
    assert main(["experiment", "dimensions", "--out", str(tmp_path), "--set", "epochs=two"]) == 1
    assert "dimensions: epochs='two' is not int" in capsys.readouterr().err


def test_settings_are_typed_and_checked():
    from capsnets.experiments import experiment_settings

    s = experiment_settings("adversarial", smoke=True, eps=0.3, attack_losses="own", lr=1, train_minutes=None)
    assert (s.eps, s.attack_losses, s.lr, s.train_minutes) == ((0.3,), ("own",), 1.0, None)
    assert experiment_settings("viewpoints", render_lightings=[0, 2]).render_lightings == [0, 2]
    for bad in ({"epochs": True}, {"lr": "fast"}, {"capsule_recipe": [1]}, {"render_lightings": ["all"]}):
        with pytest.raises(ValueError, match=f"viewpoints: {next(iter(bad))}="):
            experiment_settings("viewpoints", **bad)


def test_write_report_and_table(tmp_path):
    (tmp_path / "f.png").write_bytes(b"png")
    result = write_report(
        tmp_path,
        "T",
        [("S", markdown_table(["a", "b"], [(1, 0.123456), ("x|y", None)]))],
        figures=[tmp_path / "f.png"],
        metrics={"m": 1.0},
    )
    text = result.report.read_text()
    assert isinstance(result, ExperimentResult) and text.startswith("# T\n")
    assert "| 1 | 0.1235 |" in text and "x\\|y" in text and "| - |" in text and "![f](f.png)" in text


@pytest.mark.parametrize(
    "name, settings",
    [
        ("multimnist", ["train_digits=300", "pairs_per_epoch=64", "test_digits=100"]),
        ("dimensions", ["train_images=200", "test_images=100", "digits=1"]),
    ],
)
def test_smoke_through_the_cli(name, settings, shared_data_root, tmp_path, capsys):
    argv = [
        "experiment",
        name,
        "--smoke",
        "--out",
        str(tmp_path),
        "--device",
        "cpu",
        "--data-dir",
        str(shared_data_root),
    ]
    for item in settings:
        argv += ["--set", item]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert (tmp_path / "report.md").is_file() and list(tmp_path.glob("*.png"))


def test_reports_say_how_they_were_made(tmp_path):
    from capsnets.experiments.report import annotate_report, run_description

    full = run_description("multimnist", "out", smoke=False, device="cuda", seed=0, options={})
    assert full.startswith("Full version")
    assert "`capsnets experiment multimnist --out out --device cuda --seed 0`" in full
    reduced = run_description(
        "affnist", "o", smoke=False, device="cpu", seed=1, options={"capsule_model": "capsnet_small", "eps": (0.1, 0.2)}
    )
    assert reduced.startswith("**Reduced run**") and '`capsule_model="capsnet_small"`' in reduced
    assert "--set 'eps=[0.1,0.2]'" in reduced and "--seed 1" in reduced
    assert run_description("x", "o", smoke=True, device="cpu", seed=0, options={"a": 1}).startswith("**Smoke")
    located = run_description("routers", "o", smoke=False, device="cpu", seed=0, options={"viewpoints_dir": "v"})
    assert located.startswith("Full version") and 'Data read from `viewpoints_dir="v"`.' in located
    assert "--set 'viewpoints_dir=\"v\"'" in located
    report = tmp_path / "report.md"
    report.write_text("# Title\n\n## Results\n")
    annotate_report(report, reduced)
    assert report.read_text() == f"# Title\n\n{reduced}\n\n## Results\n"


def test_smoke_over_two_seeds_through_the_cli(shared_data_root, tmp_path, capsys):
    argv = [
        "experiment",
        "multimnist",
        "--smoke",
        "--out",
        str(tmp_path / "out"),
        "--device",
        "cpu",
        "--seeds",
        "0",
        "1",
        "--data-dir",
        str(shared_data_root),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    for item in ["train_digits=300", "pairs_per_epoch=64", "test_digits=100"]:
        argv += ["--set", item]
    assert main(argv) == 0
    assert "capsnet_error_mean" in capsys.readouterr().out
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| CapsNet - CNN, test error |" in text and "| capsnet_parameters |" in text
    assert (tmp_path / "out" / "contrasts.png").is_file()
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {"seed-0", "seed-1"}
    seeds = [(tmp_path / "out" / f"seed-{s}" / "report.md").read_text() for s in (0, 1)]
    assert "--seed 0" in seeds[0] and "--seed 1" in seeds[1]
