"""docs/results.md is what the recorded reports of docs/results/ render, never typed by hand
(issue 41): every benchmark table of the documentation comes from a report a run wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cugraphrt.bench import publish
from cugraphrt.bench.records import BenchReport

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_results_page_is_the_rendering_of_the_recorded_reports():
    page = (DOCS / "results.md").read_text()
    assert page == publish.render_results(DOCS / "results"), (
        "docs/results.md is out of date or was edited by hand: run "
        "python -m cugraphrt.bench.publish")
    assert publish.main(["--check", "--docs", str(DOCS)]) == 0


def test_every_report_is_listed_valid_and_rendered_with_its_verdicts():
    manifest = json.loads((DOCS / "results" / "manifest.json").read_text())
    listed = {entry["file"] for entry in manifest}
    kept = {path.name for path in (DOCS / "results").glob("*.json")} - {"manifest.json"}
    assert listed == kept, "a report in docs/results/ is missing from the manifest, or back"
    page = (DOCS / "results.md").read_text()
    for name in sorted(listed):
        report = BenchReport.model_validate_json((DOCS / "results" / name).read_text())
        assert f"results/{name}" in page
        for target in report.targets:
            if target.ratio is not None:  # each verdict's ratio is on the page as measured
                assert f"= {target.ratio:.3f}x" in page, (name, target)


def test_check_fails_on_a_hand_edited_page(tmp_path, capsys):
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    report = BenchReport(created="2026-01-01T00:00:00+00:00", device="Fake GPU",
                         versions={}, quick=True, elapsed_s=1.0)
    (docs / "results" / "run.json").write_text(report.model_dump_json())
    (docs / "results" / "manifest.json").write_text(json.dumps(
        [{"file": "run.json", "title": "a run", "commit": "abc1234", "command": "cugraphrt "
          "bench --quick --json FILE"}]))
    assert publish.main(["--docs", str(docs)]) == 0
    assert publish.main(["--docs", str(docs), "--check"]) == 0
    page = docs / "results.md"
    page.write_text(page.read_text().replace("a run", "a better run"))
    assert publish.main(["--docs", str(docs), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_a_manifest_entry_with_an_unknown_field_is_refused(tmp_path):
    from pydantic import ValidationError

    (tmp_path / "manifest.json").write_text(json.dumps(
        [{"file": "x.json", "title": "t", "commit": "c", "command": "c", "gpu": "H100"}]))
    with pytest.raises(ValidationError, match="gpu"):
        publish.render_results(tmp_path)
