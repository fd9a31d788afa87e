"""Rebinding runs the same code with some names replaced, leaving the original untouched."""

from __future__ import annotations

import json
import math
import types

import pytest

from harness.support.namespace import TorchProxy, rebind


def test_rebind_replaces_globals_in_the_subclass_only():
    class Codec:
        def dump(self, obj):
            return json.dumps(obj)

    # `json` is a global of this test module: the rebound subclass sees a replacement.
    fake = types.SimpleNamespace(dumps=lambda obj: "replaced")
    Sub = rebind(Codec, {"json": fake})
    assert Sub().dump([1]) == "replaced" and Codec().dump([1]) == "[1]"
    assert issubclass(Sub, Codec) and Sub.dump.__code__ is Codec.dump.__code__


def test_rebind_refuses_names_the_module_does_not_have():
    class C:
        pass

    with pytest.raises(KeyError, match="no_such_global"):
        rebind(C, {"no_such_global": 1})


def test_torch_proxy_replaces_only_what_it_is_given():
    proxy = TorchProxy(math, pi=3)
    assert proxy.pi == 3 and proxy.sqrt(4) == 2 and math.pi != 3
