"""Every exception retryfs defines lives in `retryfs.errors`, under `RetryfsError`, exported from
`retryfs`, and still is the standard class a caller catches for its kind."""

import importlib
import inspect
import pickle
import pkgutil
import sys

import pytest

import retryfs
from retryfs import errors

#: Modules not imported here: the demo pulls in moto and tqdm; the testing package has its own.
SKIPPED = ("retryfs.testing", "retryfs.demo.run", "retryfs.integrations", "retryfs.__main__")


def _defined_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(retryfs.__path__, "retryfs."):
        if info.name.startswith(SKIPPED):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__.startswith("retryfs")
                    and not value.__module__.startswith(SKIPPED)
                    and not name.startswith("_")):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_is_defined_in_errors_exported_and_a_retryfs_error():
    defined = _defined_exceptions()
    assert len(defined) >= 11, defined
    for qualified, cls in defined.items():
        assert cls.__module__ == "retryfs.errors", f"{qualified}: define it in retryfs.errors"
        assert getattr(retryfs, cls.__name__) is cls, f"{cls.__name__}: export it from retryfs"
        assert cls.__name__ in retryfs.__all__
        assert issubclass(cls, errors.RetryfsError), f"{qualified}: not a RetryfsError"
    assert set(errors.__all__) == {cls.__name__ for cls in defined.values()}


@pytest.mark.parametrize("cls, standard", [
    (errors.CommitNotVisibleError, OSError), (errors.VerificationError, OSError),
    (errors.CommitInFlightError, TimeoutError), (errors.AttemptTimeoutError, TimeoutError),
    (errors.InnerFileClosedError, ConnectionError), (errors.UnfinishedDeleteError,
                                                     ConnectionError),
    (errors.CopyError, OSError), (errors.UsageError, ValueError),
    (errors.CopyFilesGuardError, RuntimeError),
])
def test_each_is_still_the_standard_class_of_its_kind(cls, standard):
    assert issubclass(cls, standard) and issubclass(cls, errors.RetryfsError)


@pytest.mark.parametrize("old, new", [
    ("retryfs.timeouts", "retryfs.core.timeouts"),
    ("retryfs.transfer_results", "retryfs.transfer.results"),
    ("retryfs.commits", "retryfs.datapath.commits"),
])
def test_the_old_import_paths_still_resolve(old, new):
    from retryfs import cli

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert cli.UsageError is errors.UsageError
    if old == "retryfs.timeouts":
        assert module.AttemptTimeoutError is errors.AttemptTimeoutError
        assert module.AttemptAbandoned is errors.AttemptAbandoned
    if old == "retryfs.transfer_results":
        assert module.CopyError is errors.CopyError
        assert module.VerificationError is errors.VerificationError


def test_the_errors_with_arguments_survive_pickling():
    timeout = pickle.loads(pickle.dumps(errors.AttemptTimeoutError("close", "b/k", 1.5)))
    assert (type(timeout), timeout.operation, timeout.path, timeout.seconds) == (
        errors.AttemptTimeoutError, "close", "b/k", 1.5)
    in_flight = pickle.loads(pickle.dumps(errors.CommitInFlightError("b/k")))
    assert type(in_flight) is errors.CommitInFlightError and "still under way" in str(in_flight)
    assert isinstance(pickle.loads(pickle.dumps(errors.CommitNotVisibleError("x"))), OSError)
