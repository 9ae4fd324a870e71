"""The exception tree: each class that stands where Python raises a builtin is also that builtin,
so callers' ``except ValueError`` / ``except TypeError`` keep working."""

import inspect

import pytest

from gcache import errors
from gcache.errors import (
    DeviceError,
    GCacheError,
    InvalidRequest,
    MissingDependency,
    StartFailed,
    WrongType,
)


@pytest.mark.parametrize("cls, builtin", [
    (WrongType, TypeError),
    (WrongType, ValueError),                # through InvalidRequest
    (StartFailed, RuntimeError),
    (DeviceError, RuntimeError),
    (MissingDependency, RuntimeError),
])
def test_each_new_error_is_a_gcache_error_and_its_builtin(cls, builtin):
    exc = cls("message kept as given")
    assert isinstance(exc, GCacheError) and isinstance(exc, builtin)
    assert str(exc) == "message kept as given"
    with pytest.raises(builtin, match="message kept"):
        raise exc


def test_wrong_type_is_an_invalid_request():
    assert issubclass(WrongType, InvalidRequest)


def test_every_class_of_the_tree_is_drawn_in_its_docstring():
    classes = [name for name, obj in inspect.getmembers(errors, inspect.isclass)
               if issubclass(obj, GCacheError) and obj.__module__ == errors.__name__]
    assert [name for name in classes if name not in errors.__doc__] == []
