"""Which dtypes a device rates (catalog and cluster file), --precision auto's choice, and the
one-line refusal of fp16 on a device without an fp16 rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.catalog import device_spec
from costmodel.cluster import load_cluster
from costmodel.precision_choice import choose_auto, resolve_precision
from hapc.errors import UserError

CLUSTERS = Path(__file__).resolve().parents[2] / "configs" / "clusters"


def _custom(**tflops) -> dict:
    return {"name": "c", "nodes": [{"devices": [{"name": "x", "tflops": tflops or 1.0, "memory_GB": 8,
                                                  "hbm_GBps": 10, "count": 1}]}]}


def test_catalog_lists_the_dtypes_a_device_has_no_rate_for():
    assert device_spec("V100").unrated == {"tf32", "bf16"} and device_spec("V100").tflops["bf16"] == 15.7
    assert device_spec("T4").unrated == {"tf32", "bf16"}
    assert device_spec("A100").unrated == frozenset()
    assert device_spec("cpu").unrated == {"tf32"}          # CPU autocast runs bf16 and fp16


def test_cluster_file_rates_what_it_names():
    one_number = load_cluster(_custom()).devices[0]           # tflops: 1.0 -> every dtype at that rate
    assert one_number.unrated == frozenset()
    mapping = load_cluster({"name": "c", "nodes": [{"devices": [
        {"name": "x", "tflops": {"fp32": 1.0, "bf16": 2.0}, "memory_GB": 8, "hbm_GBps": 10, "count": 1}]}]}).devices[0]
    assert mapping.unrated == {"tf32", "fp16"} and mapping.flops("fp16") == mapping.flops("fp32")
    overridden = load_cluster({"name": "c", "nodes": [{"devices": [
        {"type": "V100", "tflops": {"bf16": 30.0}, "count": 1}]}]}).devices[0]
    assert overridden.unrated == {"tf32"}                     # the catalog's fp16, the file's bf16
    again = load_cluster(load_cluster({"name": "c", "nodes": [{"devices": [
        {"name": "x", "tflops": {"fp32": 1.0, "bf16": 2.0}, "memory_GB": 8, "hbm_GBps": 10, "count": 1}]}]}).to_dict())
    assert again.devices[0].unrated == {"tf32", "fp16"}       # plan.json's cluster keeps the rating


@pytest.mark.parametrize("cluster, chosen", [
    ("h100x8.yaml", "bf16"),
    ("a100x8-nvlink.yaml", "bf16"),
    ("t4x4-a100x1.yaml", "fp16"),                 # T4 has no bf16 units: the A100 runs fp16 too
    ("a100x4-v100x4-pcie.yaml", "fp16"),
    ("hap-8gpu-v100x4-p100x4.yaml", "fp16"),      # P100: fp16 at twice fp32
    ("cpu4.yaml", "fp32"),                        # CPU: no faster, so an exact float32 verify
    ("cpu-2nodes-2x2.yaml", "fp32"),              # one tflops number: every dtype equally fast
])
def test_auto_picks_what_every_device_computes_faster(cluster, chosen):
    name, why = choose_auto(load_cluster(CLUSTERS / cluster))
    assert name == chosen and why


def test_auto_says_which_device_kept_it_in_fp32():
    mixed = {"name": "m", "nodes": [
        {"devices": [{"type": "A100", "count": 1}]},
        {"devices": [{"name": "old", "tflops": {"fp32": 10.0}, "memory_GB": 8, "hbm_GBps": 100, "count": 1}]}],
        "network": "ethernet10g"}
    name, why = choose_auto(load_cluster(mixed))
    assert name == "fp32" and "old (rank 1)" in why


def test_fp16_on_a_device_without_an_fp16_rate_is_one_line_naming_it():
    cluster = load_cluster(_custom(fp32=1.0, bf16=2.0))
    with pytest.raises(UserError) as err:
        resolve_precision("fp16", cluster)
    text = str(err.value)
    assert "device x (rank 0) has no fp16 rate" in text and "\n" not in text
    assert resolve_precision("fp16", load_cluster(CLUSTERS / "cpu-2nodes-2x2.yaml")) == ("fp16", "")
    assert resolve_precision("bf16", cluster) == ("bf16", "")
    assert resolve_precision("auto", load_cluster(CLUSTERS / "t4x4-a100x1.yaml"))[0] == "fp16"
    with pytest.raises(UserError, match="fp8"):
        resolve_precision("fp8", cluster)
