"""Tests for capsnets.plots: files are written atomically as real PNGs, bad inputs are rejected."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest
import torch

from capsnets import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 2000) -> None:
    """``path`` exists, starts with the PNG signature and is larger than a blank image would be."""
    assert path.is_file()
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")], "temporary file left behind"


def write_metrics(path, records) -> None:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")


# ---------------------------------------------------------------------------------------------- curves


def test_training_curves_full(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(
        metrics,
        [
            {
                "epoch": e,
                "train_loss": 1.0 / e,
                "test_loss": 1.2 / e,
                "train_accuracy": 0.9 + e / 100,
                "test_accuracy": 0.88 + e / 100,
                "lr": 1e-3 * 0.96**e,
            }
            for e in range(1, 6)
        ],
    )
    out = plots.plot_training_curves(metrics, tmp_path / "deep" / "dir" / "curves.png")
    assert out == tmp_path / "deep" / "dir" / "curves.png"
    assert_png(out)


def test_training_curves_tolerates_missing_keys(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(
        metrics,
        [
            {"train_loss": 0.5},
            {"epoch": 2, "train_loss": 0.4, "test_accuracy": None},
            {"epoch": 3, "train_accuracy": 97.5},
        ],
    )
    metrics.write_text(metrics.read_text() + "\n\n")  # trailing blank lines are fine
    assert_png(plots.plot_training_curves(str(metrics), str(tmp_path / "curves.png")))


@pytest.mark.parametrize("content", ["", "\n\n", "{not json}\n", "[1, 2]\n"])
def test_training_curves_bad_file(tmp_path, content):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(content)
    with pytest.raises(ValueError):
        plots.plot_training_curves(metrics, tmp_path / "curves.png")


def test_overwrite_existing_file(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(metrics, [{"epoch": 1, "train_loss": 1.0}, {"epoch": 2, "train_loss": 0.5}])
    out = tmp_path / "curves.png"
    out.write_bytes(b"old")
    assert_png(plots.plot_training_curves(metrics, out))


# -------------------------------------------------------------------------------------- reconstructions


@pytest.mark.parametrize("channels", [1, 3])
def test_reconstructions(tmp_path, channels):
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(20, channels, 28, 28, generator=gen)
    recon = torch.rand(20, channels, 28, 28, generator=gen)
    labels = torch.arange(20) % 10
    predictions = labels.clone()
    predictions[3] = 7
    out = plots.plot_reconstructions(
        images, recon, tmp_path / "r" / "recon.png", labels=labels, predictions=predictions, n=16
    )
    assert_png(out)


def test_reconstructions_numpy_no_labels_small_batch(tmp_path):
    images = np.random.default_rng(0).random((3, 1, 12, 12))
    assert_png(plots.plot_reconstructions(images, images, tmp_path / "recon.png"), min_bytes=500)


def test_reconstructions_accept_grad_tensors(tmp_path):
    images = torch.rand(4, 1, 8, 8, requires_grad=True)
    assert_png(
        plots.plot_reconstructions(images, images * 0.5, tmp_path / "recon.png", predictions=[1, 2, 3, 4]),
        min_bytes=500,
    )


@pytest.mark.parametrize(
    "images_shape, recon_shape",
    [
        ((4, 28, 28), (4, 28, 28)),  # no channel dim
        ((4, 2, 28, 28), (4, 2, 28, 28)),  # C not in {1, 3}
        ((4, 1, 28, 28), (4, 784)),  # flattened reconstruction
        ((4, 1, 28, 28), (3, 1, 28, 28)),  # batch mismatch
    ],
)
def test_reconstructions_bad_shapes(tmp_path, images_shape, recon_shape):
    with pytest.raises(ValueError):
        plots.plot_reconstructions(torch.rand(images_shape), torch.rand(recon_shape), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_reconstructions_bad_labels_and_n(tmp_path):
    images = torch.rand(4, 1, 8, 8)
    with pytest.raises(ValueError, match="labels"):
        plots.plot_reconstructions(images, images, tmp_path / "x.png", labels=[1, 2])
    with pytest.raises(ValueError, match="predictions"):
        plots.plot_reconstructions(images, images, tmp_path / "x.png", predictions=torch.zeros(5))
    with pytest.raises(ValueError, match="n must"):
        plots.plot_reconstructions(images, images, tmp_path / "x.png", n=0)


# ------------------------------------------------------------------------------------ confusion matrix


@pytest.mark.parametrize("normalize", [False, True])
def test_confusion_matrix(tmp_path, normalize):
    gen = torch.Generator().manual_seed(0)
    matrix = torch.randint(0, 50, (10, 10), generator=gen) + 400 * torch.eye(10, dtype=torch.long)
    matrix[4] = 0  # an empty row must not divide by zero
    out = plots.plot_confusion_matrix(matrix, [str(i) for i in range(10)], tmp_path / "cm.png", normalize=normalize)
    assert_png(out)


def test_confusion_matrix_numpy_long_names(tmp_path):
    names = ["airplane", "automobile", "bird"]
    assert_png(plots.plot_confusion_matrix(np.array([[5, 1, 0], [2, 7, 1], [0, 0, 9]]), names, tmp_path / "cm.png"))


@pytest.mark.parametrize(
    "matrix, names",
    [
        (np.zeros((3, 4)), ["a", "b", "c"]),  # not square
        (np.zeros(3), ["a", "b", "c"]),  # not 2-D
        (np.zeros((3, 3)), ["a", "b"]),  # wrong number of names
        (-np.ones((2, 2)), ["a", "b"]),  # negative counts
        (np.full((2, 2), np.nan), ["a", "b"]),  # non-finite
    ],
)
def test_confusion_matrix_bad_input(tmp_path, matrix, names):
    with pytest.raises(ValueError):
        plots.plot_confusion_matrix(matrix, names, tmp_path / "cm.png")


def test_does_not_touch_pyplot_state(tmp_path):
    backend = matplotlib.get_backend()
    images = torch.rand(2, 1, 8, 8)
    plots.plot_reconstructions(images, images, tmp_path / "r.png")
    assert matplotlib.get_backend() == backend
    import matplotlib.pyplot as plt  # imported only to check that no figure was registered

    assert plt.get_fignums() == []


def test_save_figure_writes_any_figure_atomically(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3))
    fig.subplots().plot(np.arange(10), np.arange(10) ** 2)
    out = plots.save_figure(fig, tmp_path / "new" / "line.png")
    assert out == tmp_path / "new" / "line.png"
    assert_png(out, min_bytes=1000)
    assert "save_figure" in plots.__all__


def test_titles_name_what_a_figure_shows(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out_png: drawn.append(fig) or out_png)
    images = torch.rand(2, 1, 8, 8)
    plots.plot_reconstructions(images, images, tmp_path / "r.png", title="run/best.safetensors (epoch 3)")
    plots.plot_confusion_matrix(np.eye(2), ["a", "b"], tmp_path / "cm.png", title="run/last.safetensors")
    plots.plot_confusion_matrix(np.eye(2), ["a", "b"], tmp_path / "cm.png")
    assert drawn[0].get_suptitle() == "run/best.safetensors (epoch 3)"
    assert [fig.get_suptitle() for fig in drawn[1:]] == ["run/last.safetensors", "Confusion matrix"]


@pytest.mark.parametrize("classes", [2, 10, 40])
def test_a_long_confusion_matrix_title_stays_within_the_figure(tmp_path, monkeypatch, classes):
    """The title (e.g. a checkpoint's path and the data set) is wrapped to the figure's width, not clipped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    seen = []

    def drawn(fig, out_png):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()  # laid out as saved (constrained layout, 100 dpi)
        (title,) = fig.texts  # the suptitle
        seen.append((title.get_text(), title.get_window_extent(canvas.get_renderer()), fig.bbox))
        return out_png

    monkeypatch.setattr(plots, "save_figure", drawn)
    title = "/home/someone/projects/capsule-experiments/runs/capsnet_small_folder_photos/best.safetensors (epoch 12)"
    names = [f"class_{k}" for k in range(classes)]
    plots.plot_confusion_matrix(np.eye(classes), names, tmp_path / "cm.png", title=f"{title} on folder:/data/photos")
    text, box, frame = seen[0]
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, (box, frame)
    assert "".join(text.split()) == "".join(f"{title} on folder:/data/photos".split())
    assert ("\n" in text) == (classes < 40)  # wrapped where the figure is narrower than the title


def test_galleries_name_the_classes(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, out_png: drawn.append(fig) or out_png)
    images = torch.rand(2, 1, 8, 8)
    names = ["circle", "square"]
    plots.plot_reconstructions(images, images, tmp_path / "r.png", labels=[0, 1], predictions=[0, 0], class_names=names)
    titles = [(text.get_text(), text.get_color()) for ax in drawn[0].axes for text in ax.texts]
    assert titles == [("y=circle p=circle", "black"), ("y=square p=circle", "red")]
    grid = torch.rand(3, 4, 1, 8, 8)
    plots.plot_perturbation_grid(grid, 1, tmp_path / "g.png", steps=torch.linspace(-0.2, 0.2, 4), class_names=names)
    assert drawn[1].axes[0].get_title().startswith("class square:")


def test_image_rows_draws_one_axes_per_row_with_titles_over_the_images(tmp_path):
    rows = [("grey", torch.rand(5, 1, 8, 8)), ("rgb", np.random.default_rng(0).random((3, 3, 8, 8)))]
    fig = plots.image_rows(rows, figsize=(6, 3), titles=[[(str(k), "red") for k in range(5)]])
    assert [ax.get_ylabel() for ax in fig.axes] == ["grey", "rgb"]
    assert [text.get_text() for text in fig.axes[0].texts] == ["0", "1", "2", "3", "4"] and not fig.axes[1].texts
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()  # the shorter row keeps the images' size
    assert_png(plots.save_figure(fig, tmp_path / "rows.png"), min_bytes=500)
    with pytest.raises(ValueError, match="C = 1 or 3"):
        plots.image_rows([("bad", torch.rand(2, 2, 8, 8))], figsize=(3, 2))
