"""The spec files' JSON Schema: generated from the models that check a spec, shipped in the package and current,
named on every shipped spec's first line, and a real validator (jsonschema) accepts every shipped spec and refuses
an unknown key and a wrong type, as the loader does."""

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from study.errors import ConfigError
from study.spec import load_study
from study.spec.json_schema import SCHEMA_FILE, schema_line, schema_text

from .conftest import REPO

SPECS = sorted((REPO / "search_spaces").rglob("*.yaml"))


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_shipped_schema_is_what_the_models_generate_and_the_command_prints():
    assert SCHEMA_FILE.read_text() == schema_text(plugins=False), (
        "study/spec/spec.schema.json is stale: run `loopstudy schema --own > study/spec/spec.schema.json`")
    out = subprocess.run([sys.executable, "-m", "study.cli", "schema"], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout == schema_text()


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.relative_to(REPO / "search_spaces").as_posix())
def test_every_shipped_spec_names_the_schema_and_validates_against_it(path, validator):
    first = path.read_text().splitlines()[0]
    assert first == schema_line(path)
    assert (path.parent / first.split("$schema=")[1]).resolve() == SCHEMA_FILE.resolve()
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert not errors, errors


@pytest.mark.parametrize("edit,where", [
    (lambda s: s["model"].update(hiden=64), "'hiden' was unexpected"),  # an unknown key, in a trial section
    (lambda s: s["train"].update(steps="many"), "'many' is not of type 'integer'"),  # a wrong type
    (lambda s: s.update(resourcez={"cpu": 1}), "'resourcez' was unexpected"),  # an unknown study section
    (lambda s: s["train"].update(lr=-1.0), "less than or equal to the minimum of 0"),  # out of its range
    (lambda s: s["model"]["carry"].update(placement="sideways"), "'sideways' is not one of"),
])
def test_the_schema_refuses_what_the_loader_refuses(edit, where, validator, tmp_path):
    spec = yaml.safe_load((REPO / "search_spaces" / "smoke.yaml").read_text())
    edit(spec)
    messages = [e.message for e in validator.iter_errors(spec)]
    assert any(where in m for m in messages), messages
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError):
        load_study(bad)
