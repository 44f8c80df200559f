import importlib
import json

from capsnets.functional.products import matvec


def test_routing_products_times_both_products_of_both_routings_and_restores_matvec(tmp_path, load_benchmark):
    script = load_benchmark("routing_products")
    out = tmp_path / "products.json"
    assert (
        script.main(["--batch-sizes", "1", "--steps", "1", "--repeats", "2", "--device", "cpu", "--out", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    assert result["meta"]["device"] == "cpu" and "model_arg" not in result["meta"]["settings"]
    rows = {(row["routing"], row["kind"]): row for row in result["rows"]}
    assert set(rows) == {(r, k) for r in ("dynamic", "em") for k in ("forward", "forward_backward")}
    for row in rows.values():
        assert len(row["matvec_ms_runs"]) == len(row["matrix_at_column_ms_runs"]) == 2
        assert row["speedup"] > 0 and row["matvec_images_per_s"] > 0
    for name in ("capsnets.functional.dynamic_routing", "capsnets.functional.em.procedure"):
        assert importlib.import_module(name).matvec is matvec  # put back after timing the plain product
