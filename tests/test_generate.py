"""`nvrx-slo generate`: every committed artefact is what a fresh generation writes, byte for byte, and
the folders it writes into hold nothing else.

One drift test, over the registry (``nvrx_slo.generate.GENERATORS``): the real command regenerates
everything into a temporary directory; for each generator, the committed copy of every file it
renders equals the fresh one and says "generated — do not edit" with the command that writes it,
and each folder it writes into holds exactly what a generation writes there (a file a renamed
dashboard or a removed workload left behind fails). Generated files live in folders named
``generated``, and every such folder is some generator's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvrx_slo import file_format, generate
from nvrx_slo.alerts import spec

ROOT = Path(__file__).resolve().parents[1]


def _files(top: Path) -> set[Path]:
    return {p.relative_to(top) for p in top.rglob("*") if p.is_file()}


def _nvrx_slo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvrx_slo", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[Path, str]]:
    """Each generator's files for the default spec, in process: what the registry says each writes."""
    s = spec.load()
    inputs = generate.Inputs(s, s.plan(), "alerts/slo.yaml")
    return {name: render(inputs) for name, render in generate.GENERATORS.items()}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`nvrx-slo generate all` through the real command, into a directory of its own."""
    root = tmp_path_factory.mktemp("fresh")
    done = _nvrx_slo("generate", "all", "--root", str(root))
    assert done.returncode == 0, done.stderr
    return root


@pytest.mark.parametrize("name", generate.GENERATORS)
def test_the_committed_artefacts_are_a_fresh_generation_headed_do_not_edit_and_nothing_else(name, rendered, fresh):
    files = rendered[name]
    assert files
    for path, text in files.items():
        assert "generated" in path.parts, path
        assert (ROOT / path).read_bytes() == (fresh / path).read_bytes(), f"{path} is stale: run `nvrx-slo generate`"
        if path.suffix == ".json":  # JSON has no comments: a dashboard says it in its description
            assert file_format.note(f"nvrx-slo generate {name}", "dashboards/") in json.loads(text)["description"]
        else:
            assert text.startswith(f"# generated — do not edit: `nvrx-slo generate {name}` from "), path
    for folder in {path.parent for path in files}:
        assert _files(ROOT / folder) == _files(fresh / folder), f"{folder} holds files no generator writes"


def test_every_generated_folder_is_written_by_a_generator(rendered):
    folders = {p.relative_to(ROOT) for top in ("alerts", "dashboards", "deploy")
               for p in (ROOT / top).rglob("generated") if p.is_dir()}
    assert folders and folders <= {path.parent for files in rendered.values() for path in files}


def test_a_bad_spec_writes_nothing_and_exits_2_naming_the_key(tmp_path):
    bad = tmp_path / "slo.yaml"
    bad.write_text(spec.DEFAULT_PATH.read_text().replace("target: 0.99", "target: 1.5", 1))
    done = _nvrx_slo("generate", "all", "--spec", str(bad), "--root", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"nvrx-slo generate: {bad}: objectives.efficiency.target: must be a number in (0, 1), " \
                          "got 1.5\n"
    assert not (tmp_path / "out").exists()


def test_a_bad_workload_writes_nothing_not_even_what_rendered_before_it(tmp_path, monkeypatch, capsys):
    workloads = tmp_path / "repo" / "deploy" / "workloads"
    workloads.mkdir(parents=True)
    (workloads / "broken.yaml").write_text("apiVersion: batch/v1\nkind: Job\nmetadata: {name: broken}\nspec: {}\n")
    monkeypatch.setattr(generate, "REPO", tmp_path / "repo")
    assert generate.main(["all", "--root", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("nvrx-slo generate: deploy/workloads/broken.yaml, document 1 (Job broken): "
                                 "no spec.template\n")
    assert not (tmp_path / "out").exists()
    (workloads / "broken.yaml").unlink()
    assert generate.main(["deploy", "--root", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith(f"nvrx-slo generate: {workloads}: no workload (*.yaml) to inject (")
