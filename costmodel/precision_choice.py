"""Which precision a cluster can run: ``--precision auto``, and the refusal of ``fp16`` on devices
that have no fp16 rate.

A precision is worth choosing only where every device computes it faster than float32: a
plan's step waits for its slowest rank, so one device without the units (a V100 under bf16)
leaves the others idle at its fp32 pace while every rank pays low precision's rounding.
``auto`` therefore takes bf16 where every device rates bf16 above its fp32 (no loss scaling
needed: bf16 has float32's range), else fp16 where every device rates fp16 above its fp32
(V100, T4, P100 with or without Ampere cards), else fp32 (CPU clusters among them: CPU
autocast runs both, at about the fp32 rate, and an exact float32 ``--verify`` is worth more
there).

"Rates" reads the cluster file: a catalog device rates the dtypes the catalog gives it a
peak for; a custom device rates every dtype when ``tflops`` is one number (all run at that
rate, as the user said) and the dtypes its ``tflops`` mapping names otherwise
(:attr:`costmodel.cluster.Device.unrated`).
"""

from __future__ import annotations

from costmodel.cluster import Cluster, Device
from hapc.errors import UserError
from hapc.ir.precision import check_precision


def lacking(cluster: Cluster, dtype: str) -> Device | None:
    """The first device with no rate of its own for ``dtype`` ("fp16", "bf16"), or None."""
    return next((d for d in cluster.devices if dtype in d.unrated), None)


def faster(device: Device, dtype: str) -> bool:
    """Whether ``device`` rates ``dtype`` above its fp32 peak."""
    return dtype not in device.unrated and device.flops(dtype) > device.flops("fp32")


def choose_auto(cluster: Cluster) -> tuple[str, str]:
    """(precision, why in a few words) for ``--precision auto`` on ``cluster``."""
    for name in ("bf16", "fp16"):
        if all(faster(d, name) for d in cluster.devices):
            return name, f"every device computes {name} faster than fp32"
    slow = next(d for d in cluster.devices if not faster(d, "bf16"))
    if not any(faster(d, "fp16") for d in cluster.devices) and not any(faster(d, "bf16") for d in cluster.devices):
        return "fp32", "no device computes bf16 or fp16 faster than fp32"
    slow16 = next(d for d in cluster.devices if not faster(d, "fp16"))
    return "fp32", (f"{slow.type} (rank {slow.index}) has no fast bf16 and {slow16.type} (rank {slow16.index}) "
                    "no fast fp16")


def resolve_precision(name: str, cluster: Cluster) -> tuple[str, str]:
    """(the precision to plan, why ``auto`` chose it or ""): ``name`` itself unless it is
    ``"auto"``. ``fp16`` on a cluster with a device that has no fp16 rate is a UserError
    naming the device (its plan would be priced, and run, at a rate nobody gave)."""
    try:
        check_precision(name)
    except ValueError as exc:
        raise UserError(str(exc), where="precision") from None
    if name == "auto":
        return choose_auto(cluster)
    if name == "fp16":
        device = lacking(cluster, "fp16")
        if device is not None:
            raise UserError(f"--precision fp16: device {device.type} (rank {device.index}) has no fp16 rate in the "
                            "cluster file (its tflops give no fp16 entry); add tflops.fp16 for it, or use "
                            "--precision fp32, bf16 or auto")
    return name, ""


__all__ = ["choose_auto", "faster", "lacking", "resolve_precision"]
