"""The demo's JSON API through FastAPI's TestClient: what it answers, that it answers what the library computes,
and that wrong input gets a 4xx with a message, never a crash or a traceback."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch

from capsnets.validation import ArgumentError

#: Where the tests' requests go: the demo answers only the hosts it serves (TestClient's default name,
#: ``testserver``, is refused as any other name is).
BASE_URL = "http://127.0.0.1:8000"


def client(demo, host: str = "127.0.0.1", base_url: str = BASE_URL):
    """A TestClient of the demo of ``demo`` started on ``host``, its requests naming ``base_url``'s host."""
    from fastapi.testclient import TestClient

    from capsnets.demo.app import create_app

    return TestClient(create_app(demo, host), base_url=base_url, raise_server_exceptions=False)


def png(image: torch.Tensor) -> bytes:
    """A ``(1, H, W)`` image in ``[0, 1]`` as PNG bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((image[0] * 255).round().to(torch.uint8).numpy(), mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def decoded(url: str) -> torch.Tensor:
    """A data URL's PNG as ``(H, W)`` floats in ``[0, 1]``."""
    from PIL import Image

    assert url.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))) as image:
        return torch.from_numpy(np.asarray(image.convert("L"), dtype=np.float32) / 255)


@pytest.fixture
def image() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.rand(1, 8, 8)


def test_page_and_info(web, untrained_capsnet):
    api = client(untrained_capsnet)
    page = api.get("/")
    assert page.status_code == 200 and '<canvas id="canvas"' in page.text and "/static/demo.js" in page.text
    assert api.get("/static/demo.js").status_code == 200 and api.get("/static/demo.css").status_code == 200
    info = api.get("/api/info").json()
    assert info["kind"] == "vector" and info["decoder"] and info["capsule_dim"] == 16
    assert info["classes"] == [str(k) for k in range(10)] and info["input_size"] == [1, 8, 8]
    assert info["source"] == "untrained" and info["max_body_bytes"] > 0
    assert info["kernel_note"] is None  # vector capsules: no EM kernel to compile


def test_predict_answers_what_the_model_computes(web, untrained_capsnet, image):
    from capsnets.experiments.dimensions import routing_map

    model = untrained_capsnet.model
    answer = client(untrained_capsnet).post("/api/predict", json={"pixels": image[0].tolist()})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    with torch.no_grad():
        expected = model(image[None])
    torch.testing.assert_close(torch.tensor(result["scores"]), expected.scores[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(result["capsules"]), expected.capsules[0], atol=1e-5, rtol=1e-4)
    winner = int(expected.scores.argmax())
    assert result["prediction"] == result["shown"] == winner and result["label"] == str(winner)
    torch.testing.assert_close(decoded(result["reconstruction"]), expected.reconstruction[0, 0], atol=1 / 255, rtol=0)
    # the routing picture is the dimensions experiment's routing map, for every class
    couplings = result["couplings"]
    assert couplings["grid"] == [4, 4] and len(couplings["maps"]) == 10 and "c_ij |u_i|" in couplings["what"]
    heat, routed_to = routing_map(model, image)
    assert routed_to == winner
    torch.testing.assert_close(torch.tensor(couplings["values"])[winner], heat, atol=1e-5, rtol=1e-4)
    assert couplings["overlay"].startswith("data:image/png;base64,")


def test_predict_reconstructs_the_capsule_asked_for(web, trained):
    api = client(trained)
    pixels = trained.samples()[0][0, 0].tolist()
    winner = api.post("/api/predict", json={"pixels": pixels}).json()
    other = (winner["prediction"] + 1) % 10
    picked = api.post("/api/predict", json={"pixels": pixels, "capsule": other}).json()
    assert picked["shown"] == other and picked["prediction"] == winner["prediction"]
    with torch.no_grad():
        expected = trained.model(torch.tensor(pixels)[None, None], torch.tensor([other])).reconstruction[0, 0]
    torch.testing.assert_close(decoded(picked["reconstruction"]), expected, atol=1 / 255, rtol=0)
    assert picked["reconstruction"] != winner["reconstruction"]


def test_an_image_file_as_the_body_as_base64_or_as_a_data_url_is_the_same_input(web, untrained_capsnet, image):
    api = client(untrained_capsnet)
    data = png(image)
    answers = [
        api.post("/api/predict", content=data, headers={"Content-Type": "image/png"}).json(),
        api.post("/api/predict", content=data).json(),  # recognised by its signature
        api.post("/api/predict", json={"image": base64.b64encode(data).decode()}).json(),
        api.post("/api/predict", json={"image": "data:image/png;base64," + base64.b64encode(data).decode()}).json(),
    ]
    for answer in answers[1:]:
        assert answer["scores"] == answers[0]["scores"] and answer["input"] == answers[0]["input"]


def test_a_file_of_each_format_read_is_taken_as_the_body(web, untrained_capsnet, image):
    """Each of :data:`capsnets.images.IMAGE_FORMATS`, sent as the body itself with no Content-Type, is recognised by
    its signature and read as the same input as its PNG (JPEG: within its loss)."""
    from PIL import Image

    from capsnets.images import IMAGE_FORMATS

    api = client(untrained_capsnet)
    pixels = (image[0] * 255).round().to(torch.uint8).numpy()
    expected = decoded(api.post("/api/predict", content=png(image)).json()["input"])
    for image_format in IMAGE_FORMATS:
        buffer = io.BytesIO()
        options = {"JPEG": {"quality": 100}, "WEBP": {"lossless": True}}.get(image_format, {})
        Image.fromarray(pixels, mode="L").save(buffer, format=image_format, **options)
        answer = api.post("/api/predict", content=buffer.getvalue())
        assert answer.status_code == 200, (image_format, answer.text)
        seen = decoded(answer.json()["input"])
        assert (seen - expected).abs().max() <= (8 / 255 if image_format == "JPEG" else 0), image_format


def test_a_drawing_is_framed_as_the_training_digits(web, untrained_capsnet):
    from PIL import Image, ImageDraw

    drawing = Image.new("RGB", (280, 280), "black")
    ImageDraw.Draw(drawing).line([(40, 20), (40, 120)], fill="white", width=12)  # a small "1" in a corner
    buffer = io.BytesIO()
    drawing.save(buffer, format="PNG")
    body = {"image": base64.b64encode(buffer.getvalue()).decode(), "frame": True}
    result = client(untrained_capsnet).post("/api/predict", json=body).json()
    seen = decoded(result["input"])
    assert any(note.startswith("framed") for note in result["notes"]), result["notes"]
    assert seen[0].max() > 0.5 and seen[-1].max() > 0.5, "the stroke fills the frame's height"
    assert seen[:, :2].max() == 0 and seen[:, -2:].max() == 0 and seen.max() == 1, "centred and stretched"


def test_a_drawing_for_an_mnist_model_is_prepared_as_predict_prepares_a_photo():
    """One transform for the page and the command line: the drawing framed by capsnets.images' MNIST framing."""
    from PIL import Image, ImageDraw

    from capsnets.demo.images import read_image
    from capsnets.images import prepare_image

    drawing = Image.new("RGB", (280, 280), "black")
    ImageDraw.Draw(drawing).line([(200, 30), (210, 130)], fill="white", width=10)  # a "1" in a corner
    buffer = io.BytesIO()
    drawing.save(buffer, format="PNG")
    tensor, notes = read_image(buffer.getvalue(), (1, 28, 28), "mnist", frame=True)
    expected, expected_notes = prepare_image(drawing, (1, 28, 28), "mnist")
    assert torch.equal(tensor, expected) and notes == expected_notes
    assert notes[-1].startswith("framed as mnist's digits") and int((tensor[0] > 0.5).any(1).sum()) == 20


def test_frame_drawing_of_an_empty_canvas_is_black():
    from capsnets.demo.images import frame_drawing

    framed, note = frame_drawing(torch.zeros(1, 50, 40), (8, 8))
    assert note == "empty drawing" and framed.shape == (1, 8, 8) and framed.max() == 0


def test_reconstruct_decodes_a_capsule_vector(web, untrained_capsnet, image):
    api = client(untrained_capsnet)
    result = api.post("/api/predict", json={"pixels": image[0].tolist()}).json()
    vector, shown = result["capsules"][result["shown"]], result["shown"]
    same = api.post("/api/reconstruct", json={"capsule": vector, "class": shown}).json()
    assert same["reconstruction"] == result["reconstruction"] and same["class"] == shown
    moved = api.post("/api/reconstruct", json={"capsule": [v + 0.25 for v in vector], "class": shown}).json()
    assert moved["reconstruction"] != result["reconstruction"] and len(moved["pixels"]) == 8


def test_perturbations_draw_the_winning_capsules_grid(web, untrained_capsnet, image):
    from capsnets.plots import PERTURBATIONS, perturbation_grid

    api = client(untrained_capsnet)
    winner = api.post("/api/predict", json={"pixels": image[0].tolist()}).json()["prediction"]
    answer = api.post("/api/perturbations", json={"pixels": image[0].tolist()}).json()
    assert answer["class"] == winner and answer["label"] == str(winner)
    assert answer["steps"] == pytest.approx(PERTURBATIONS.tolist()) and answer["dimensions"] == 16
    mosaic = decoded(answer["grid"])  # rows: the 16 dimensions, columns: the 11 steps, 8x8 images in a 1 px border
    assert mosaic.shape == (16 * 10, 11 * 10)
    grid, _ = perturbation_grid(untrained_capsnet.model, image)
    cells = mosaic.view(16, 10, 11, 10)[:, 1:-1, :, 1:-1].permute(0, 2, 1, 3)  # (D, S, 8, 8)
    torch.testing.assert_close(cells, grid[:, :, 0], atol=1 / 255, rtol=0)


def test_perturbations_follow_the_capsule_asked_for(web, untrained_capsnet, image):
    api = client(untrained_capsnet)
    winner = api.post("/api/perturbations", json={"pixels": image[0].tolist()}).json()
    other = (winner["class"] + 3) % 10
    answer = api.post("/api/perturbations", json={"pixels": image[0].tolist(), "capsule": other}).json()
    assert answer["class"] == other and answer["label"] == str(other) and answer["grid"] != winner["grid"]
    wrong = api.post("/api/perturbations", json={"pixels": image[0].tolist(), "capsule": 10})
    assert wrong.status_code == 422 and "class must be an integer in [0, 9]" in wrong.json()["detail"]


def test_info_says_when_the_first_prediction_compiles_the_em_kernel(web, untrained_matrix, monkeypatch, tmp_path):
    from capsnets.functional.em import kernel as em_kernel

    monkeypatch.setattr(em_kernel, "_state", {"tried": False, "module": None, "error": None, "warned": False})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no build there
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")
    note = client(untrained_matrix).get("/api/info").json()["kernel_note"]
    assert "compiling the fused EM routing kernel once" in note and "a minute or less" in note
    monkeypatch.setenv(em_kernel.ENV_VAR, "torch")  # the PyTorch path compiles nothing
    assert client(untrained_matrix).get("/api/info").json()["kernel_note"] is None
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")
    monkeypatch.setitem(em_kernel._state, "tried", True)  # loaded (or tried) in this process
    assert client(untrained_matrix).get("/api/info").json()["kernel_note"] is None


def _large_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buffer, format="PNG")  # compresses to a few kB
    return buffer.getvalue()


GOOD = [[0.5] * 8] * 8
BAD_REQUESTS = [  # (endpoint, request arguments, status, words of the message)
    ("/api/predict", {"content": b"{"}, 400, "must be JSON"),
    ("/api/predict", {"content": b"\xff\xfe garbage"}, 400, "must be JSON"),
    ("/api/predict", {"json": [1, 2]}, 422, "valid dictionary"),
    ("/api/predict", {"json": {"bogus": 1}}, 422, "bogus"),
    ("/api/predict", {"json": {}}, 422, "one of image"),
    ("/api/predict", {"json": {"pixels": GOOD, "image": "AAAA"}}, 422, "one of image"),
    ("/api/predict", {"json": {"pixels": [[0.5] * 7] * 8}}, 422, "pixels must be 1 x 8 x 8 or 8 x 8"),
    ("/api/predict", {"json": {"pixels": [[[0.5] * 8] * 8] * 3}}, 422, "got 3 x 8 x 8"),
    ("/api/predict", {"json": {"pixels": [[0.5] * 8] * 7 + [[0.5]]}}, 422, "rectangular"),
    ("/api/predict", {"json": {"pixels": [[2.0] * 8] * 8}}, 422, "[0, 1]"),
    ("/api/predict", {"content": b'{"pixels": [' + b",".join([b"[NaN,0,0,0,0,0,0,0]"] * 8) + b"]}"}, 422, "finite"),
    ("/api/predict", {"json": {"pixels": [["a"] * 8] * 8}}, 422, "pixels"),
    ("/api/predict", {"json": {"pixels": GOOD, "capsule": 10}}, 422, "class must be an integer in [0, 9]"),
    ("/api/predict", {"json": {"pixels": GOOD, "capsule": "3"}}, 422, "capsule"),
    ("/api/predict", {"json": {"pixels": GOOD, "frame": "yes"}}, 422, "frame"),
    ("/api/predict", {"json": {"image": "not base64!"}}, 422, "base64"),
    ("/api/predict", {"json": {"image": base64.b64encode(b"hello world").decode()}}, 422, "not an image"),
    ("/api/predict", {"content": b"\x89PNG\r\n\x1a\n truncated"}, 422, "image"),
    ("/api/predict", {"content": b"GIF89a", "headers": {"Content-Type": "image/gif"}}, 422, "image"),
    ("/api/predict", {"content": _large_png()}, 422, "too large"),
    ("/api/predict", {"content": b"x" * (3 * 1024 * 1024)}, 413, "too large"),
    ("/api/predict", {"content": iter([b"x" * 1024 * 1024] * 3)}, 413, "too large"),  # chunked, no length
    ("/api/perturbations", {"json": {"pixels": [[0.5] * 3]}}, 422, "pixels must be"),
    ("/api/reconstruct", {"json": {"capsule": [0.1] * 3, "class": 1}}, 422, "16 finite numbers"),
    ("/api/reconstruct", {"json": {"capsule": [0.1] * 16, "class": -1}}, 422, "class must be"),
    ("/api/reconstruct", {"json": {"capsule": [0.1] * 16, "class": True}}, 422, "class"),
    ("/api/reconstruct", {"json": {"capsule": [0.1] * 16}}, 422, "class: Field required"),
    ("/api/reconstruct", {"content": b'{"capsule": [' + b"Infinity," * 15 + b'1], "class": 0}'}, 422, "finite"),
    ("/api/reconstruct", {"json": {"capsule": "0.1", "class": 0}}, 422, "capsule"),
]


@pytest.mark.parametrize(
    "endpoint, request_args, status, words",
    BAD_REQUESTS,
    ids=[f"{e.rsplit('/', 1)[1]}-{n}" for n, (e, *_) in enumerate(BAD_REQUESTS)],
)
def test_wrong_input_is_a_4xx_with_a_message(web, untrained_capsnet, endpoint, request_args, status, words):
    answer = client(untrained_capsnet).post(endpoint, **request_args)
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and words in detail and "Traceback" not in answer.text, detail


def test_wrong_methods_and_paths(web, untrained_capsnet):
    api = client(untrained_capsnet)
    assert api.get("/api/predict").status_code == 405
    assert api.get("/api/nothing").status_code == 404
    assert api.get("/static/../app.py").status_code == 404


def test_matrix_capsules_show_poses_and_assignments_without_a_decoder(web, untrained_matrix):
    api = client(untrained_matrix)
    info = api.get("/api/info").json()
    assert info["kind"] == "matrix" and not info["decoder"] and info["pose_size"] == 4
    assert "no decoder" in info["note"]
    pixels = torch.rand(28, 28, generator=torch.Generator().manual_seed(0)).tolist()
    result = api.post("/api/predict", json={"pixels": pixels}).json()
    assert result["reconstruction"] is None and len(result["capsules"]) == 10 and len(result["capsules"][0]) == 16
    assert result["couplings"]["grid"] == [4, 4] and "assignment" in result["couplings"]["what"]
    values = torch.tensor(result["couplings"]["values"])  # assignments times activations, summed over types
    assert values.shape == (10, 4, 4) and bool((values >= 0).all()) and float(values.sum()) > 0
    for endpoint, body in (
        ("/api/reconstruct", {"capsule": [0.0] * 16, "class": 0}),
        ("/api/perturbations", {"pixels": pixels}),
    ):
        answer = api.post(endpoint, json=body)
        assert answer.status_code == 422 and "no decoder" in answer.json()["detail"]
    assert api.get("/api/samples").json() == {"samples": [], "note": untrained_matrix.samples_note}
    assert "does not record its data set" in untrained_matrix.samples_note


def test_the_matrix_routing_picture_is_the_class_layers_assignments_times_activations(untrained_matrix):
    model = untrained_matrix.model
    routing = model.class_capsules.routing
    image = torch.rand(1, 28, 28, generator=torch.Generator().manual_seed(1))
    analysis = untrained_matrix.analyse(image)
    with torch.no_grad():  # the class layer's own assignments (B, T, h, w, K), asked through its argument
        children = model.conv_capsules(image[None])
        classes, assignments = model.class_capsules(children, return_couplings=True)
    expected = (assignments[0] * children.activation[0, ..., None]).sum(0).permute(2, 0, 1)  # (K, h, w)
    torch.testing.assert_close(analysis.couplings, expected)
    torch.testing.assert_close(analysis.scores, classes.activation.flatten())
    assert model.class_capsules.routing is routing  # the routing is never swapped


def test_samples_are_test_images_the_trained_model_classifies(web, trained):
    api = client(trained)
    samples = api.get("/api/samples").json()["samples"]
    assert [s["class"] for s in samples] == [k for k in range(10) for _ in range(2)]
    right = sum(
        api.post("/api/predict", json={"pixels": s["pixels"]}).json()["prediction"] == s["class"] for s in samples
    )
    assert right >= 17, f"{right} of 20 test images right"


def test_an_answer_is_unsure_and_says_why_as_predict_judges_it(web, trained, trained_run):
    import capsnets
    from capsnets.models import load_model

    api = client(trained)
    assert api.get("/api/info").json()["unsure_rule"] == "score and reconstruction"  # its run recorded the limits
    sample = api.get("/api/samples").json()["samples"][0]
    blank = [[0.0] * len(row) for row in sample["pixels"]]
    for pixels in (sample["pixels"], blank):
        result = api.post("/api/predict", json={"pixels": pixels}).json()
        (expected,) = capsnets.predict(load_model(trained_run), torch.tensor(pixels).view(1, *trained.input_size))
        assert (result["uncertain"], result["doubt"]) == (expected.uncertain, expected.doubt)
    assert result["uncertain"] and "reconstruction unlike the image" in result["doubt"]  # the blank page


def test_a_second_start_loads_the_trained_demo_model(trained):
    assert trained.source.startswith("loaded from") and "earlier start" in trained.source
    assert "test accuracy" in trained.source and trained.name == "capsnet_digits" and trained.dataset == "digits"


def test_the_demo_model_is_not_trained_into_a_folder_of_other_files(tmp_path):
    from capsnets.demo import load_demo_model

    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(ArgumentError, match="holds files but no demo model"):
        load_demo_model(out=tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ArgumentError, match="is a file"):
        load_demo_model(out=tmp_path / "file")


def test_only_capsule_classifiers_are_shown():
    from capsnets.demo import DemoModel
    from capsnets.models import create_model

    with pytest.raises(ArgumentError, match="capsule classifiers"):
        DemoModel(create_model("cnn_baseline_narrow"))


def test_the_page_reads_only_what_the_api_sends(web, untrained_capsnet, image):
    """Every field of the answers that demo.js reads is in them (a renamed field would break the page silently)."""
    from capsnets.demo.app import STATIC

    script = (STATIC / "demo.js").read_text()
    api = client(untrained_capsnet)
    answers = {
        "result": api.post("/api/predict", json={"pixels": image[0].tolist()}).json(),
        "info": api.get("/api/info").json(),
    }
    for name, answer in answers.items():
        for field in set(re.findall(rf"\b{name}\.(\w+)", script)) - {"couplings"}:
            assert field in answer, f"demo.js reads {name}.{field}"
    assert set(json.loads(json.dumps(answers["result"]["couplings"]))) >= {"overlay", "maps", "what"}


def test_an_interrupted_demo_training_is_continued(tmp_path, monkeypatch):
    from capsnets.demo import source
    from capsnets.engine import reporting

    monkeypatch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
    tiny = {**source.DEMO_TRAINING, "limit_train": 16, "limit_test": 8, "progress": False}
    monkeypatch.setattr(source, "DEMO_TRAINING", {**tiny, "epochs": 1})
    run = tmp_path / "run"
    assert source.load_demo_model(out=run).source.startswith("trained now")
    (run / "summary.json").unlink()  # as if stopped after the first of two epochs
    monkeypatch.setattr(source, "DEMO_TRAINING", {**tiny, "epochs": 2})
    demo = source.load_demo_model(out=run)
    assert demo.source.startswith("trained now")
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2
    assert "earlier start" in source.load_demo_model(out=run).source


def test_the_demo_model_trains_on_one_thread_unless_omp_num_threads_says_otherwise(tmp_path, monkeypatch):
    from capsnets.demo import source

    seen = []
    monkeypatch.setattr(source, "train", lambda config, resume: seen.append(torch.get_num_threads()))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        source._train(tmp_path / "run")
        assert seen == [1] and torch.get_num_threads() == 2  # restored afterwards
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        source._train(tmp_path / "run")
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(threads)


def test_an_upload_in_a_format_outside_the_few_the_library_reads_is_refused_before_its_plugin_runs(monkeypatch):
    from PIL import EpsImagePlugin

    from capsnets.demo.images import open_image

    def never(*args, **kwargs):
        raise AssertionError("the EPS plugin was reached")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", never)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n"
    with pytest.raises(ValueError, match="not an image file that can be read"):
        open_image(eps)
