"""benchmarks/fine_tuning.py: its dry run trains from scratch and from the MNIST weight on a balanced draw of
Fashion-MNIST, records both, and a rerun into the same file repeats neither."""

import json


def test_dry_run_records_both_starts_and_a_rerun_skips_them(load_benchmark, shared_data_root, tmp_path, capsys):
    bench = load_benchmark("fine_tuning")
    out = tmp_path / "fine_tuning.json"
    argv = ["--dry-run", "--data-dir", str(shared_data_root), "--out", str(out)]
    assert bench.main(argv) == 0
    record = json.loads(out.read_text())
    assert [(r["start"], r["per_class"], r["epochs"]) for r in record["runs"]] == [
        ("scratch", 2, 1),
        ("pretrained", 2, 1),
    ]
    assert record["test_images"] == 100 and record["weights"] == {"capsnet_small": "capsnet_small-mnist"}
    (row,) = record["summary"]
    assert row["gain_points"] == 100 * (row["pretrained"]["mean"] - row["scratch"]["mean"])
    capsys.readouterr()
    assert bench.main(argv) == 0
    assert not any('"start"' in line for line in capsys.readouterr().out.splitlines())  # no run repeated
    assert json.loads(out.read_text())["runs"] == record["runs"]
    # the class layer alone first: only the pretrained start runs again, and is summarised apart
    assert bench.main([*argv, "--classifier-only-epochs", "1"]) == 0
    record = json.loads(out.read_text())
    assert [(r["start"], r["classifier_only_epochs"]) for r in record["runs"]][2:] == [("pretrained", 1)]
    (row,) = record["summary"]
    assert set(row["gains"]) == {"pretrained", "pretrained_classifier_first_1"}
    first = row["pretrained_classifier_first_1"]["mean"]
    assert row["gains"]["pretrained_classifier_first_1"] == 100 * (first - row["scratch"]["mean"])


def test_the_draw_holds_as_many_images_of_every_class(load_benchmark, shared_data_root):
    from capsnets.data import load_dataset

    bench = load_benchmark("fine_tuning")
    data = load_dataset("fashion_mnist", root=shared_data_root, train=False)
    drawn = bench.per_class(data, 7, seed=3)
    assert drawn.labels.bincount(minlength=10).tolist() == [7] * 10
    assert not (drawn.labels[:10] == drawn.labels[:10].sort().values).all()  # mixed, not class by class
    assert bench.per_class(data, 7, seed=4).images.ne(drawn.images).any()
