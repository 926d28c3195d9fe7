"""The public API is explicit and typed, from one definition: every option of `WrapperConfig` is
a keyword of each entry point with the field's type and default, a URL parameter and an
environment variable where it has one, and documented; the spellings of 0.1.0 still work."""

import dataclasses
import inspect
import pydoc
import warnings

import fsspec
import pyarrow.fs as pafs
import pytest

import retryfs
from retryfs import config
from retryfs.config import OPTIONS, PARAMETERS, RENAMED, Default, WrapperConfig
from retryfs.uri import from_uri

ENTRY_POINTS = {
    "RetryingFileSystem": retryfs.RetryingFileSystem.__init__,
    "RetryFileSystem": retryfs.RetryFileSystem.__init__,
    "from_uri": from_uri,
}
FIELDS = {f.name: f for f in dataclasses.fields(WrapperConfig) if not f.name.startswith("_")}
#: The options only code can give (objects): no URL parameter, no environment variable.
CODE_ONLY = {"policy", "per_operation", "classifier", "stats"}


def test_the_settings_value_is_the_option_list_and_has_no_any():
    assert tuple(FIELDS) == OPTIONS
    assert config.CODE_ONLY == CODE_ONLY
    for name, f in FIELDS.items():
        assert "Any" not in str(f.type), f"{name}: {f.type}"


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_entry_point_takes_every_option_with_the_fields_type_and_default(entry):
    parameters = inspect.signature(ENTRY_POINTS[entry]).parameters
    for name, f in FIELDS.items():
        assert name in parameters, f"{entry}: add the keyword {name}"
        parameter = parameters[name]
        assert parameter.annotation.replace(" ", "") in (
            str(f.type).replace(" ", ""), f"{f.type}|None".replace(" ", "")), (entry, name)
        if name in CODE_ONLY:
            assert parameter.default is None, (entry, name)
        else:
            assert isinstance(parameter.default, Default), (entry, name)
            assert parameter.default.value == f.default, (entry, name)


def test_every_option_but_the_objects_is_a_url_parameter_and_an_environment_variable():
    for name in OPTIONS:
        if name in CODE_ONLY:
            continue
        assert name in PARAMETERS, f"{name}: give it a Parameter"
        assert PARAMETERS[name].url_name == f"retry_{name}"
        assert PARAMETERS[name].env_name == f"RETRYFS_{name.upper()}"


def test_the_settings_value_documents_every_option_and_help_shows_each_with_its_type():
    doc = inspect.getdoc(WrapperConfig)
    for name in OPTIONS:
        assert f"``{name}``" in doc, f"WrapperConfig's docstring: document {name}"
    shown = pydoc.render_doc(retryfs.RetryingFileSystem, renderer=pydoc.plaintext)
    for name, f in FIELDS.items():
        assert f"{name}: {f.type}" in shown.replace("'", ""), name
    assert "verify_writes: bool = True" in shown.replace("'", "")


def test_an_option_left_at_its_default_keeps_what_config_says():
    config = WrapperConfig(verify_writes=False, client_attempts=2, budget=None)
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), config=config)
    assert (fs.retry_config.verify_writes, fs.retry_config.client_attempts,
            fs.retry_config.budget) == (False, 2, None)
    given = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), config=config, verify_writes=True)
    assert given.retry_config.verify_writes is True  # the default's value, given: it wins
    assert given.retry_config.client_attempts == 2


def test_the_environment_still_applies_under_the_defaults_of_the_fsspec_face(monkeypatch):
    monkeypatch.setenv("RETRYFS_VERIFY_WRITES", "false")
    monkeypatch.setenv("RETRYFS_SPOOL_MEMORY", "1MiB")
    fs = fsspec.filesystem("retry", target_protocol="memory", skip_instance_cache=True)
    assert (fs.retry_config.verify_writes, fs.retry_config.spool_memory) == (False, 1 << 20)
    fs = fsspec.filesystem("retry", target_protocol="memory", skip_instance_cache=True,
                           verify_writes=True)
    assert fs.retry_config.verify_writes is True


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_the_old_spellings_work_with_a_warning_naming_the_new(old, new, monkeypatch, tmp_path):
    with pytest.warns(DeprecationWarning, match=new):
        fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), **{old: 2})
    assert getattr(fs.retry_config, new) == 2
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(WrapperConfig(**{old: 3}), new) == 3
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(WrapperConfig().replace(**{old: 4}), new) == 4
    with pytest.warns(DeprecationWarning, match=f"retry_{new}"):
        fs, _ = from_uri(f"{tmp_path}?retry_{old}=5")
    assert getattr(fs.retry_config, new) == 5
    monkeypatch.setenv(f"RETRYFS_{old.upper()}", "6")
    with pytest.warns(DeprecationWarning, match=f"RETRYFS_{new.upper()}"):
        fs, _ = from_uri(str(tmp_path))
    assert getattr(fs.retry_config, new) == 6
    monkeypatch.delenv(f"RETRYFS_{old.upper()}")
    with pytest.warns(DeprecationWarning, match=new):
        fs = fsspec.filesystem("retry", target_protocol="memory", skip_instance_cache=True,
                               **{old: 7})
    assert getattr(fs.retry_config, new) == 7


def test_both_spellings_at_once_and_a_typo_are_errors_naming_the_option():
    with pytest.raises(TypeError, match="client_attempts"):
        retryfs.RetryingFileSystem(pafs.LocalFileSystem(), client_attempts=1, native_attempts=2)
    with pytest.raises(TypeError, match="did you mean 'verify_writes'"):
        retryfs.RetryingFileSystem(pafs.LocalFileSystem(), verify_write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        retryfs.RetryingFileSystem(pafs.LocalFileSystem(), client_attempts=1)  # no warning


def test_the_configuration_page_names_every_option():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for name in OPTIONS:
        assert f"`{name}`" in page, f"docs/configuration.md: name the option {name}"


def test_the_handlers_old_config_attribute_warns_and_answers():
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), verify_writes=False)
    with pytest.warns(DeprecationWarning, match="retry_config"):
        assert fs.retry_handler.config is fs.retry_config
