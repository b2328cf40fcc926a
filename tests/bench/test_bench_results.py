"""The JSON result file: written, read back, validated; compare computes the right ratios."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from lockbench import main
from lockbench._compare import compare, ratio
from lockbench._hdr import LatencyHistogram
from lockbench._results import (
    LATENCY_KEYS,
    SCHEMA,
    Result,
    ResultDocument,
    SchemaError,
    machine_info,
    read_document,
    write_document,
)


def make_result(**overrides: Any) -> Result:
    """A plausible result; ``overrides`` replace fields."""
    h = LatencyHistogram()
    for v in (50, 60, 70, 80, 1000):
        h.record_us(v)
    fields: dict[str, Any] = {
        "name": "mutex-uncontended",
        "kind": "run",
        "backend": "lockserver",
        "target": "lockserver://127.0.0.1:7400",
        "spawned": True,
        "client": "sync",
        "params": {"connections": 1, "concurrency": 1, "pipeline": 1, "processes": 1},
        "elapsed_s": 2.0,
        "ops": 10_000,
        "requests": 20_000,
        "ops_per_s": 5000.0,
        "requests_per_s": 10_000.0,
        "acquires": 10_000,
        "acquired": 9_000,
        "errors": 0,
        "error_samples": [],
        "latency_us": h.summary(),
        "latency_hdr": h.encode(),
        "server_cpu_s": 0.5,
        "server_cpu_s_per_1k_ops": 0.05,
        "server_rss_bytes": 30_000_000,
        "timeline": [{"t": 0.0, "ops_per_s": None, "trust": 1.0}],
        "extra": {"trust_min": 1.0},
    }
    fields.update(overrides)
    return Result(**fields)


def test_round_trip(tmp_path: Path) -> None:
    """A written document reads back equal, with the schema tag and derived ratio."""
    doc = ResultDocument((make_result(), make_result(backend="redis")), machine_info())
    path = tmp_path / "sub" / "r.json"
    write_document(path, doc)
    raw = json.loads(path.read_text())
    assert raw["schema"] == SCHEMA
    assert raw["results"][0]["acquire_success_ratio"] == 0.9
    assert set(raw["results"][0]["latency_us"]) == set(LATENCY_KEYS)
    back = read_document(path)
    assert back == doc
    assert back.results[0].acquire_success_ratio == 0.9


def test_machine_info_keys() -> None:
    """The machine record names cores, CPU, Python and the package versions."""
    info = machine_info()
    assert {"nproc", "cpu", "python", "packages", "commit", "redis_server"} <= set(info)
    assert info["packages"]["msgpack"]
    assert isinstance(info["nproc"], int)


def test_label_and_ratio_none_without_acquires() -> None:
    """Labels show the shape; a run without locking has no success ratio."""
    r = make_result(
        name="ping",
        acquires=0,
        acquired=0,
        client="async",
        params={"connections": 4, "concurrency": 64, "pipeline": 8, "processes": 2},
    )
    assert r.label == "lockserver ping async c4/t64/p8/P2"
    assert r.acquire_success_ratio is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("ops"), "missing key 'ops'"),
        (lambda d: d.update(ops="many"), r"results\[0\]\.ops: expected int, got str"),
        (lambda d: d.update(ops=True), "expected int, got bool"),
        (lambda d: d.update(kind="walk"), "expected 'run' or 'blast'"),
        (lambda d: d["latency_us"].pop("p99"), r"latency_us\.p99"),
        (lambda d: d.update(timeline=[{"x": 1}]), r"timeline\[0\]"),
        (lambda d: d.update(error_samples=[1]), "error_samples"),
        (lambda d: d.update(server_cpu_s="x"), "server_cpu_s: expected int or float or null"),
    ],
)
def test_validation_names_the_fault(tmp_path: Path, mutate: Any, message: str) -> None:
    """Each kind of damage is reported with the path of the offending key."""
    data = ResultDocument((make_result(),)).to_json()
    mutate(data["results"][0])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaError, match=message):
        read_document(path)


def test_document_level_validation(tmp_path: Path) -> None:
    """Wrong schema tag, no results, or not JSON at all."""
    good = ResultDocument((make_result(),)).to_json()
    with pytest.raises(SchemaError, match="unknown schema"):
        ResultDocument.from_json({**good, "schema": "other/9"})
    with pytest.raises(SchemaError, match="non-empty list"):
        ResultDocument.from_json({**good, "results": []})
    with pytest.raises(SchemaError, match="holds an object"):
        ResultDocument.from_json([good])
    path = tmp_path / "x.json"
    path.write_text("{nope")
    with pytest.raises(SchemaError, match="not JSON"):
        read_document(path)


def test_extra_is_optional() -> None:
    """Files without 'extra' (older writers) still read."""
    data = make_result().to_json()
    del data["extra"]
    assert Result.from_json(data).extra == {}


def test_ratio() -> None:
    """b / a, None on missing or zero denominators."""
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None


def test_compare_gives_the_right_ratios() -> None:
    """B/A for throughput, latency percentiles, CPU and success ratio, paired by shape."""
    a = make_result(backend="redis", ops_per_s=4000.0, requests_per_s=8000.0)
    h = LatencyHistogram()
    for v in (100, 120, 140, 160, 2000):
        h.record_us(v)
    b = make_result(
        ops_per_s=6000.0,
        requests_per_s=12_000.0,
        latency_us=h.summary(),
        server_cpu_s_per_1k_ops=0.1,
        acquired=10_000,
    )
    (c,) = compare(ResultDocument((a,)), ResultDocument((b,)))
    assert c.ratios["ops_per_s"] == 1.5
    assert c.ratios["requests_per_s"] == 1.5
    assert c.ratios["latency_p50"] == pytest.approx(b.latency_us["p50"] / a.latency_us["p50"])
    assert c.ratios["latency_max"] == pytest.approx(2000 / 1000, rel=1e-3)
    assert c.ratios["server_cpu_s_per_1k_ops"] == 2.0
    assert c.ratios["acquire_success_ratio"] == pytest.approx(1.0 / 0.9)


def test_compare_pairs_by_name_and_shape() -> None:
    """Results are matched by (name, kind, shape), whatever their order in the files."""
    a1 = make_result(name="ping", ops_per_s=100.0)
    a2 = make_result(name="mds", ops_per_s=200.0)
    b1 = make_result(name="mds", ops_per_s=300.0)
    b2 = make_result(name="ping", ops_per_s=50.0)
    pairs = compare(ResultDocument((a1, a2)), ResultDocument((b1, b2)))
    by_name = {c.a.name: c.ratios["ops_per_s"] for c in pairs}
    assert by_name == {"ping": 0.5, "mds": 1.5}


def test_compare_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lockbench compare A B --json` prints the table and writes the ratios."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_document(a, ResultDocument((make_result(backend="redis", ops_per_s=2000.0),)))
    write_document(b, ResultDocument((make_result(ops_per_s=3000.0),)))
    out = tmp_path / "ratios.json"
    assert main(["compare", str(a), str(b), "--json", str(out)]) == 0
    assert "1.50x" in capsys.readouterr().out
    (entry,) = json.loads(out.read_text())
    assert entry["ratios"]["ops_per_s"] == 1.5


def test_compare_cli_rejects_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A damaged file is one error line and exit 2."""
    a = tmp_path / "a.json"
    write_document(a, ResultDocument((make_result(),)))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": SCHEMA, "results": [{}]}))
    assert main(["compare", str(a), str(bad)]) == 2
    assert "missing key" in capsys.readouterr().err


def test_plot_cli(tmp_path: Path) -> None:
    """`lockbench plot` draws a PNG from result files (with a trust timeline)."""
    a = tmp_path / "a.json"
    r = make_result(
        timeline=[{"t": t / 2, "ops_per_s": 1000.0, "trust": 1 - t / 20} for t in range(10)]
    )
    write_document(a, ResultDocument((r, attrs.evolve(r, backend="redis", timeline=[]))))
    out = tmp_path / "p.png"
    assert main(["plot", str(a), "-o", str(out), "--title", "t"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
