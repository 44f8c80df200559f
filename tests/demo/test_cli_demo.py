"""``capsnets demo``: it says which model it shows and where, listens on localhost by default, and bad input is one
error line (the server itself is replaced by a stub that returns at once)."""

from __future__ import annotations

import re
import socket

import pytest

from capsnets.cli import build_parser, main


@pytest.fixture
def served(monkeypatch, web):
    """What ``run_server`` was given, instead of running uvicorn."""
    from capsnets.demo import app

    calls = []
    monkeypatch.setattr(app, "run_server", lambda application, sock: calls.append((application, sock.getsockname())))
    return calls


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("capsnets demo: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_demo_serves_a_checkpoint_and_says_which(trained_run, served, capsys):
    assert main(["demo", "--checkpoint", trained_run, "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"model: capsnet_digits \(vector capsules\) on digits, loaded from .*best\.safetensors "
        r"\(epoch 5\)",
        out,
    ), out
    assert re.search(r"open http://127\.0\.0\.1:\d+/ in a browser", out) and "warning" not in out
    ((application, (host, port)),) = served
    assert host == "127.0.0.1" and port > 0 and application.title == "capsnets demo"


def test_demo_shows_the_shipped_pretrained_weight_by_default(served, capsys):
    assert main(["demo", "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert "model: capsnet_small (vector capsules) on mnist, the pretrained weight capsnet_small-mnist" in out
    assert len(served) == 1
    assert main(["demo", "--pretrained", "nonsense", "--port", "0"]) == 1
    assert "nonsense" in one_error_line(capsys.readouterr().err)


def test_demo_loads_its_run_directory_on_a_second_start(trained_run, served, capsys):
    assert main(["demo", "--out", trained_run, "--port", "0"]) == 0
    assert "trained by an earlier start of the demo" in capsys.readouterr().out


def test_demo_listens_on_localhost_by_default_and_warns_otherwise(trained_run, served, capsys):
    args = build_parser().parse_args(["demo"])
    assert (args.host, args.port, args.checkpoint, args.out, args.pretrained) == ("127.0.0.1", 8000, None, None, None)
    assert main(["demo", "--checkpoint", trained_run, "--host", "0.0.0.0", "--port", "0"]) == 0
    assert "warning: listening on 0.0.0.0" in capsys.readouterr().out


def test_demo_answers_only_the_hosts_it_serves(trained_run, served, capsys):
    """By default, localhost and addresses; with ``--host 0.0.0.0`` also this machine's names and any of its
    addresses, as a user elsewhere on the network reaches it; a name of another site never (DNS rebinding)."""
    from fastapi.testclient import TestClient

    for argv in ([], ["--host", "0.0.0.0"]):
        assert main(["demo", "--checkpoint", trained_run, "--port", "0", *argv]) == 0
        api = TestClient(served[-1][0], base_url="http://127.0.0.1:8000")
        for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "192.0.2.7:8000", socket.gethostname()):
            answer = api.get("/", headers={"Host": host})
            assert answer.status_code == 200 and answer.headers["x-frame-options"] == "DENY", (argv, host)
        answer = api.get("/", headers={"Host": "evil.example.com:8000"})
        assert answer.status_code == 403 and "DNS rebinding" in answer.text, (argv, answer.text)


def test_demo_help_gives_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--pretrained", "--checkpoint", "--out", "--data-dir", "--host", "--port"):
        assert re.search(re.escape(option) + r" \w+ .*?\(default: [^)]+\)", text), option
    assert (
        "(default: capsnet_small-mnist, unless" in text and "(default: 127.0.0.1)" in text and "(default: 8000)" in text
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--port", "70000"], "port must be an integer in [0, 65535]"),
        (["--port", "-1"], "port must be"),
        (["--host", "", "--port", "0"], "host must name an address"),
        (["--host", "no.such.host.invalid", "--port", "0"], "cannot listen on no.such.host.invalid:0"),
        (["--checkpoint", "missing/run", "--port", "0"], "missing/run"),
    ],
)
def test_bad_input_is_one_error_line(argv, words, served, capsys, tmp_path):
    assert main(["demo", *argv]) == 1
    assert words in one_error_line(capsys.readouterr().err)
    assert not served


def test_a_busy_port_is_refused_before_anything_is_trained(served, capsys, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        assert main(["demo", "--port", str(port), "--out", str(tmp_path / "run")]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_model_that_is_no_capsule_classifier_is_one_error_line(served, capsys, tmp_path):
    from capsnets.engine import reporting

    run = tmp_path / "cnn"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reporting, "save_figures", lambda *args, **kwargs: [])
        assert (
            main(
                [
                    "train",
                    "--model",
                    "cnn_baseline_narrow",
                    "--dataset",
                    "digits",
                    "--epochs",
                    "1",
                    "--limit-train",
                    "8",
                    "--limit-test",
                    "8",
                    "--device",
                    "cpu",
                    "--no-progress",
                    "--out",
                    str(run),
                ]
            )
            == 0
        )
    capsys.readouterr()
    assert main(["demo", "--checkpoint", str(run), "--port", "0"]) == 1
    assert "capsule classifiers" in one_error_line(capsys.readouterr().err)


def test_demo_offers_the_test_images_of_data_dir(served, capsys, shared_data_root, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    monkeypatch.setenv("CAPSNETS_DATA", str(tmp_path))  # no MNIST there
    assert main(["demo", "--port", "0"]) == 0
    empty = TestClient(served[-1][0], base_url="http://127.0.0.1").get("/api/samples").json()
    assert empty["samples"] == [] and "start the demo with --data-dir DIR" in empty["note"]
    assert main(["demo", "--data-dir", str(shared_data_root), "--port", "0"]) == 0
    samples = TestClient(served[-1][0], base_url="http://127.0.0.1").get("/api/samples").json()["samples"]
    assert [s["class"] for s in samples] == [k for k in range(10) for _ in range(2)]


def test_demo_says_when_the_first_prediction_compiles_the_em_kernel(served, capsys, tmp_path, monkeypatch):
    from capsnets.functional.em import kernel as em_kernel

    monkeypatch.setattr(em_kernel, "_state", {"tried": False, "module": None, "error": None, "warned": False})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no build there
    monkeypatch.setenv(em_kernel.ENV_VAR, "auto")
    assert main(["demo", "--pretrained", "matrix_capsnet_small-mnist", "--port", "0"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "EM routing kernel" in line]
    assert (
        len(notes) == 1
        and "compiling the fused EM routing kernel once for this environment (a minute or less)" in notes[0]
    )
    assert main(["demo", "--port", "0"]) == 0  # vector capsules: nothing to compile
    assert "EM routing kernel" not in capsys.readouterr().out
