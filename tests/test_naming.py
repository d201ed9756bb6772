"""Op keys and metric names: deterministic, MLflow-safe, unique within a window."""

from __future__ import annotations

import hashlib
import re

import pytest
from mlflow.utils.validation import _validate_metric_name

from neuron_mlflow.naming import metric_key, op_keys, safe_op_key, window_artifact_path


def sha8(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:8]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("aten::mul", "aten.mul"),
        ("Torch-Compiled Region: 0/0", "Torch-Compiled_Region_0_0"),
        ("aten::_fused_rms_norm", "aten._fused_rms_norm"),
        ("ProfilerStep#3", "ProfilerStep_3"),
        ("a[0]/b", "a_0_b"),
        ("../../etc/passwd", "etc_passwd"),
        ("__init__", "init"),
        ("ünïcødé op", "n_c_d_op"),
        ("cudaLaunchKernel", "cudaLaunchKernel"),
    ],
)
def test_safe_op_key_rules(name: str, key: str) -> None:
    assert safe_op_key(name) == key


def test_hostile_names_get_unique_valid_metric_keys() -> None:
    long_name = "x" * 500
    names = [
        "aten::mul",
        "aten.mul",  # collides with aten::mul's safe form
        "#",  # empty after sanitising
        "[]",
        "..",
        "a/b",
        "a b",
        "a_b",
        "深度学习",
        long_name,
        "y" * 121,
    ]
    keys = op_keys(names)
    assert len(set(keys.values())) == len(names)
    assert keys["aten.mul"] == "aten.mul"  # the name that already is its key keeps it
    assert keys["aten::mul"] == f"aten.mul_{sha8('aten::mul')}"
    assert keys["#"] == f"_{sha8('#')}"
    assert keys[".."] == f"_{sha8('..')}"
    assert keys["a_b"] == "a_b" and keys["a b"] == f"a_b_{sha8('a b')}"
    assert keys[long_name] == "x" * 120 + f"_{sha8(long_name)}"
    assert keys["y" * 121].endswith(sha8("y" * 121))
    for key in keys.values():
        _validate_metric_name(metric_key("profile", "op", key, "self_cpu_us"))  # MLflow accepts it
        assert re.fullmatch(r"[A-Za-z0-9_.\-]{1,129}", key), key


def test_keys_do_not_depend_on_order() -> None:
    names = ["a b", "a_b", "a-b", "a:b", "#", "##"]
    assert op_keys(names) == op_keys(list(reversed(names)))


def test_metric_key_and_artifact_path_grammar() -> None:
    assert metric_key("profile/rmsnorm", "op", "aten.mul", "calls") == (
        "profile/rmsnorm/op/aten.mul/calls"
    )
    assert window_artifact_path("profile", 12, 14) == "profile/step_000012-000014"
