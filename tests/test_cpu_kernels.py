"""The fused CPU kernels' build (cpu_kernels.py): one cached library per code, shared by every checkout of it."""

import shutil

import study.models.cpu_kernels as ck


def test_the_library_is_keyed_by_the_sources_content_not_their_path(tmp_path, monkeypatch):
    here = ck._library_path()
    for source in (*ck.SOURCES, ck.HEADER):  # the same code in another checkout
        shutil.copy(source, tmp_path / source.name)
    copied = {tmp_path / source.name: flags for source, flags in ck.SOURCES.items()}
    monkeypatch.setattr(ck, "SOURCES", copied)
    monkeypatch.setattr(ck, "HEADER", tmp_path / ck.HEADER.name)
    assert ck._library_path() == here
    (tmp_path / "rope_cpu.cpp").write_text((tmp_path / "rope_cpu.cpp").read_text() + "\n// edited\n")
    assert ck._library_path() != here  # edited code builds anew
    monkeypatch.setattr(ck, "SOURCES", {s: () for s in copied})  # ... and so do other flags
    (tmp_path / "rope_cpu.cpp").write_text(ck.HERE.joinpath("rope_cpu.cpp").read_text())
    assert ck._library_path() != here
