"""The JSON Schema of a study spec file, generated from the models that check one (study.spec.schema for the study
sections, study.config's dataclasses for task / model / train / eval, with each field's type, default and range),
so an editor validates and completes keys while typing. Shipped as `study/spec/spec.schema.json` (SCHEMA_FILE);
every spec in search_spaces/ names it on its first line, `# yaml-language-server: $schema=PATH`; `loopstudy schema`
prints it. A test fails when the shipped file is not what this module generates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("spec.schema.json")
SCHEMA_ID = "https://loopstudy.dev/spec.schema.json"  # a name, not fetched: editors read the file the spec names
SECTIONS = {"task": "TaskConfig", "model": "ModelConfig", "train": "TrainConfig", "eval": "EvalConfig"}


def spec_schema() -> dict[str, Any]:
    """The schema: StudySpec's, with the trial sections described field by field instead of as free mappings."""
    from pydantic import TypeAdapter

    import study.config as config
    from study.spec.schema import StudySpec

    schema = StudySpec.model_json_schema()
    defs = schema.setdefault("$defs", {})
    for section, name in SECTIONS.items():
        part = TypeAdapter(getattr(config, name)).json_schema(ref_template="#/$defs/{model}")
        defs.update(part.pop("$defs", {}))
        defs[name] = part
        schema["properties"][section] = {"$ref": f"#/$defs/{name}"}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "loopstudy study spec", **schema}


def schema_text(plugins: bool = True) -> str:
    """The schema (sorted keys: a stable diff); plugins False: without the outside plugins installed here, as the
    shipped file holds it."""
    schema = spec_schema()
    if not plugins:
        without_outside_plugins(schema)
    return json.dumps(schema, indent=1, sort_keys=True) + "\n"


def without_outside_plugins(schema: dict[str, Any]) -> None:
    """Drop (in place) the names and settings only outside plugins bring: the shipped schema is loopstudy's own,
    whatever is installed where it is generated."""
    from study.config.rules import FOUND as RULES_FOUND
    from study.tasks import FOUND as TASKS_FOUND

    for name, key, found in (("CarryConfig", "rule", RULES_FOUND), ("TaskConfig", "name", TASKS_FOUND)):
        outside = {n for n, p in found.origin.items() if not p.builtin}
        part = schema["$defs"][name]
        inside = {k for n, d in found.parts.items() if n not in outside for k in d.reads}
        for setting in {k for n in outside for k in found.parts[n].reads} - inside:
            part["properties"].pop(setting, None)
        names = part["properties"][key]
        names["enum"] = [n for n in names["enum"] if n not in outside]
        if "description" in part:
            part["description"] = "\n\n".join(p for p in part["description"].split("\n\n")
                                              if p.split(":", 1)[0] not in outside)


def schema_line(spec: Path) -> str:
    """The first line a spec file at `spec` carries to name the shipped schema (a path relative to the spec)."""
    import os

    return f"# yaml-language-server: $schema={Path(os.path.relpath(SCHEMA_FILE, spec.parent)).as_posix()}"
